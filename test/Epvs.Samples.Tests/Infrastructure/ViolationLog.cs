using System.Collections.Concurrent;
using System.Linq;
using System.Threading;

namespace Epvs.Samples.Tests.Infrastructure;

/// <summary>Property violations found by worker threads: counted, and the first few kept for the failure message.</summary>
internal sealed class ViolationLog
{
    private const int Kept = 10;
    private readonly ConcurrentQueue<string> first = new();
    private int count;

    public int Count => Volatile.Read(ref count);

    public void Add(string violation)
    {
        if (Interlocked.Increment(ref count) <= Kept)
            first.Enqueue(violation);
    }

    public string Describe() => Count == 0
        ? "no violations"
        : $"{Count} violation(s), first ones:\n  " + string.Join("\n  ", first.ToArray());
}
