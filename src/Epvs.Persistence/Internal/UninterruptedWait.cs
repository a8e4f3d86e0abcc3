using System;
using System.Diagnostics;
using System.Threading;
using System.Threading.Tasks;

namespace Epvs.Persistence;

/// <summary>
/// The waits of a Dispose, which must run to its end: <see cref="Thread.Interrupt"/> breaks a blocking wait with
/// <see cref="ThreadInterruptedException"/>, which in the middle of a Dispose skipped the unmapping and the release of the
/// file lock (the file stayed locked for the life of the process). The wait absorbs the interrupt and goes on with what is
/// left of its timeout; <see cref="Restore"/> requests the interrupt again when the Dispose ends, so the thread's next wait
/// still sees it. No delegates: a Dispose must not fail to allocate before it has closed the file.
/// </summary>
internal static class UninterruptedWait
{
    /// <summary><see cref="Task.Wait(TimeSpan)"/>, absorbing interrupts (<paramref name="interrupted"/>).</summary>
    internal static bool Wait(Task task, TimeSpan timeout, ref bool interrupted)
    {
        long start = Stopwatch.GetTimestamp();
        while (true)
        {
            try
            {
                return task.Wait(Left(start, timeout));
            }
            catch (ThreadInterruptedException) when (Seen() && !InterruptibleForTesting)
            {
                interrupted = true;
            }
        }
    }

    /// <summary><see cref="Thread.Join(TimeSpan)"/>, absorbing interrupts (<paramref name="interrupted"/>).</summary>
    internal static bool Join(Thread thread, TimeSpan timeout, ref bool interrupted)
    {
        long start = Stopwatch.GetTimestamp();
        while (true)
        {
            try
            {
                return thread.Join(Left(start, timeout));
            }
            catch (ThreadInterruptedException) when (Seen() && !InterruptibleForTesting)
            {
                interrupted = true;
            }
        }
    }

    /// <summary><see cref="Monitor.TryEnter(object, TimeSpan)"/>, absorbing interrupts (<paramref name="interrupted"/>).</summary>
    internal static bool TryEnter(object gate, TimeSpan timeout, ref bool interrupted)
    {
        long start = Stopwatch.GetTimestamp();
        while (true)
        {
            try
            {
                return Monitor.TryEnter(gate, Left(start, timeout));
            }
            catch (ThreadInterruptedException) when (Seen() && !InterruptibleForTesting)
            {
                interrupted = true;
            }
        }
    }

    /// <summary>What is left of <paramref name="timeout"/> since <paramref name="start"/> (infinite stays infinite).</summary>
    internal static TimeSpan Left(long start, TimeSpan timeout)
    {
        if (timeout == Timeout.InfiniteTimeSpan)
        {
            return timeout;
        }

        TimeSpan left = timeout - Stopwatch.GetElapsedTime(start);
        return left < TimeSpan.Zero ? TimeSpan.Zero : left;
    }

    /// <summary>Whether an interrupt just caught is absorbed (it is, unless a test's control lets it through).</summary>
    internal static bool Absorbs() => Seen() && !InterruptibleForTesting;

    /// <summary>Requests again an interrupt that a wait absorbed: it surfaces at the thread's next blocking wait.</summary>
    internal static void Restore(bool interrupted)
    {
        if (interrupted)
        {
            // Inside heap-wide work (a sweep's or Dispose's shield), when that work ends.
            InterruptShield.RequestInterrupt();
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
