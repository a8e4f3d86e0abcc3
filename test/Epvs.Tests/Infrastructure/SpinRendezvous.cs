using System.Diagnostics;
using System.Threading;
using Xunit;

namespace Epvs.Tests;

/// <summary>
/// A two-party barrier that spins instead of blocking, so both parties leave it within about a hundred
/// nanoseconds of each other: the alignment a memory-ordering race needs. Bounded: fails the test after 30 s.
/// </summary>
internal sealed class SpinRendezvous
{
    private long arrivals;

    /// <summary>Arrives at the <paramref name="phase"/>-th meeting (1, 2, ...) and waits for the other party.</summary>
    public void Meet(long phase)
    {
        Interlocked.Increment(ref arrivals);
        long target = 2 * phase;
        long start = Stopwatch.GetTimestamp();
        int spins = 0;
        while (Volatile.Read(ref arrivals) < target)
        {
            if (++spins % 4096 == 0)
            {
                Thread.Yield(); // the other party may not have a core right now
                Assert.True(Stopwatch.GetTimestamp() - start < 30 * Stopwatch.Frequency, "rendezvous partner did not arrive within 30 s");
            }
        }
    }
}
