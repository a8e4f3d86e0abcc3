using System;
using System.Diagnostics;
using System.Threading;

namespace Epvs.Persistence;

/// <summary>
/// The waits of a Dispose, which must run to its end: <see cref="Thread.Interrupt"/> breaks a blocking wait with
/// <see cref="ThreadInterruptedException"/>, which in the middle of a Dispose skipped the unmapping and the release of the
/// file lock (the file stayed locked for the life of the process). The wait absorbs the interrupt and goes on with what is
/// left of its timeout; <see cref="Restore"/> requests the interrupt again when the Dispose ends, so the thread's next wait
/// still sees it.
/// </summary>
internal static class UninterruptedWait
{
    /// <summary>Runs <paramref name="wait"/> with what is left of <paramref name="timeout"/> until it returns.</summary>
    /// <param name="wait">The wait, given the time left (<see cref="Timeout.InfiniteTimeSpan"/> for no limit).</param>
    /// <param name="timeout">The whole wait's limit.</param>
    /// <param name="interrupted">Set when an interrupt was absorbed.</param>
    /// <returns>What <paramref name="wait"/> returned.</returns>
    internal static bool Run(Func<TimeSpan, bool> wait, TimeSpan timeout, ref bool interrupted)
    {
        long start = Stopwatch.GetTimestamp();
        while (true)
        {
            TimeSpan left = timeout;
            if (timeout != Timeout.InfiniteTimeSpan)
            {
                left = timeout - Stopwatch.GetElapsedTime(start);
                if (left < TimeSpan.Zero)
                {
                    left = TimeSpan.Zero;
                }
            }

            try
            {
                return wait(left);
            }
            catch (ThreadInterruptedException) when (Seen() && !InterruptibleForTesting)
            {
                interrupted = true;
            }
        }
    }

    /// <summary>Requests again an interrupt that a wait absorbed: it surfaces at the thread's next blocking wait.</summary>
    internal static void Restore(bool interrupted)
    {
        if (interrupted)
        {
            Thread.CurrentThread.Interrupt();
        }
    }

    /// <summary>Test-only: the waits let the interrupt through (as before), for the tests' controls.</summary>
    internal static bool InterruptibleForTesting { get; set; }

    /// <summary>Test hook: runs on a thread whose wait here was interrupted (absorbed or, for a control, let through).</summary>
    internal static Action? InterruptSeenHookForTesting { get; set; }

    private static bool Seen()
    {
        InterruptSeenHookForTesting?.Invoke();
        return true;
    }
}
