using System;
using System.Threading;

namespace Epvs.Persistence;

/// <summary>
/// Makes every Dispose of one object return only once the disposal is complete. The first call (the one whose exchange of
/// the object's disposed flag won) runs the disposal between <see cref="Begin"/> and <see cref="Complete"/>; any other call
/// waits in <see cref="WaitForCompletion"/>. A call on the disposing thread itself (from a callback the disposal runs)
/// cannot wait for it and throws instead.
/// </summary>
internal sealed class DisposalGate
{
    private readonly object _gate = new();

    /// <summary>The managed thread id of the disposal in progress (0 before it began).</summary>
    private int _owner;

    /// <summary>1 once the disposal is complete, whatever its outcome.</summary>
    private int _completed;

    /// <summary>Test hook: runs on a Dispose about to wait for the one in progress on another thread.</summary>
    internal Action? WaitsHookForTesting { get; set; }

    /// <summary>Test-only: a waiting Dispose returns at once (the old behaviour), for the tests' controls.</summary>
    internal bool ReturnAtOnceForTesting { get; set; }

    /// <summary>Test-only: a Dispose inside an operation waits like any other (the first version of the wait, which hung),
    /// for the tests' controls.</summary>
    internal bool WaitInsideOperationForTesting { get; set; }

    /// <summary>Test hook: runs on the first Dispose when it begins.</summary>
    internal Action? BeganHookForTesting { get; set; }

    /// <summary>Whether the disposal is complete (acquire: what it did is visible to the caller).</summary>
    internal bool IsCompleted => Volatile.Read(ref _completed) != 0;

    /// <summary>Whether the calling thread runs the Dispose that began and has not completed (a callback inside it): a Dispose there cannot wait for it.</summary>
    internal bool OnTheDisposingThread => !IsCompleted && Volatile.Read(ref _owner) == Environment.CurrentManagedThreadId;

    /// <summary>Called by the first Dispose, on its thread, right after its exchange of the disposed flag.</summary>
    internal void Begin()
    {
        Volatile.Write(ref _owner, Environment.CurrentManagedThreadId);
        BeganHookForTesting?.Invoke();
    }

    /// <summary>Called by the first Dispose when it is done (in a finally: also when it throws). Never throws.</summary>
    internal void Complete()
    {
        // Release: everything the disposal did happens-before a waiter's acquire read of the flag.
        Volatile.Write(ref _completed, 1);
        try
        {
            lock (_gate)
            {
                Monitor.PulseAll(_gate);
            }
        }
        catch (Exception)
        {
            // Out of memory taking the lock (a sync block): the waiters' bounded waits see the flag on their next look.
        }
    }

    /// <summary>
    /// Waits at most <paramref name="timeout"/> (or for ever: <see cref="Timeout.InfiniteTimeSpan"/>) for the disposal in
    /// progress to complete, without the checks of <see cref="WaitForCompletion"/>: for a caller that is neither the
    /// disposing thread nor inside an operation the disposal waits for. Interruptible.
    /// </summary>
    /// <returns>Whether the disposal is complete.</returns>
    internal bool TryWaitForCompletion(TimeSpan timeout)
    {
        lock (_gate)
        {
            if (!IsCompleted)
            {
                // One wait (the caller loops with its own deadline); pulsed by Complete.
                Monitor.Wait(_gate, timeout == Timeout.InfiniteTimeSpan || timeout > TimeSpan.FromMilliseconds(100) ? TimeSpan.FromMilliseconds(100) : timeout);
            }
        }

        return IsCompleted;
    }

    /// <summary>
    /// Returns once the disposal that another call began is complete. Interruptible: <see cref="Thread.Interrupt"/> makes
    /// it throw <see cref="ThreadInterruptedException"/> (the disposal carries on).
    /// </summary>
    /// <param name="typeName">The disposed type, for the message of the re-entrant call.</param>
    /// <param name="insideOperation">Whether the caller is inside an operation of the object, which the disposal in
    /// progress waits for: the two would wait for each other.</param>
    /// <exception cref="InvalidOperationException">Called on the thread that runs the disposal (from a callback inside it),
    /// which cannot complete before this call returns; or inside an operation, which the disposal waits for.</exception>
    internal void WaitForCompletion(string typeName, bool insideOperation = false)
    {
        if (IsCompleted || ReturnAtOnceForTesting)
        {
            return;
        }

        // The owner writes its id right after winning the exchange, on its own thread: a call on that thread sees it.
        if (OnTheDisposingThread)
        {
            ThrowHelper.ThrowInvalidOperation($"{typeName}.Dispose was called on the thread whose Dispose of the same object is still running (from a callback inside it): that Dispose cannot complete before this call returns, so this call cannot wait for it. It completes regardless; dispose the object once, outside its own callbacks.");
        }

        if (insideOperation && !WaitInsideOperationForTesting)
        {
            ThrowHelper.ThrowInvalidOperation($"{typeName}.Dispose was called inside an operation while another thread's Dispose of the same object is running: that Dispose waits for the operation to end, so this call cannot wait for it (the two would wait for each other for ever). End the operation; the other Dispose completes then.");
        }

        WaitsHookForTesting?.Invoke();
        lock (_gate)
        {
            while (!IsCompleted)
            {
                // Bounded only as a backstop for a Complete that could not take the lock (see there); the pulse wakes us.
                Monitor.Wait(_gate, 100);
            }
        }
    }
}
