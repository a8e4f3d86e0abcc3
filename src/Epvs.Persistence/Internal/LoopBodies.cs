using System;
using System.Threading;
using System.Threading.Tasks;

namespace Epvs.Persistence;

/// <summary>
/// Counts the bodies of one <see cref="InterruptShield.RunToItsEnd"/> loop that are running, so that the call ends only
/// once none is: <see cref="Close"/> turns away the bodies that start after it and waits for those already inside.
/// </summary>
/// <remarks>
/// <para>Why. A <see cref="Parallel"/> loop runs bodies on its calling thread too, and waits on that thread for its other
/// workers. A body that interrupts its own thread (user code: a visitor of <see cref="PersistentHeap.ForEachAllocated"/>,
/// a recovery filter, a key's <see cref="object.GetHashCode"/>) broke that wait: the loop threw while its workers went
/// on reading the mapping, the call returned, and a Dispose right after unmapped under them — an access violation that
/// ended the process. Nothing the loop's own thread waits on can be made immune to an interrupt its bodies raise, so
/// the call no longer relies on the loop's wait: it waits for the bodies themselves.</para>
/// <para>Ordering. <see cref="TryEnter"/> counts the body in, then reads the closed flag; <see cref="Close"/> sets the flag,
/// then reads the count. Both sides use interlocked operations (full fences), so at least one sees the other: either the
/// body sees the flag and backs out, or the close sees the body and waits for it. A body that ends after the close and
/// leaves the count at 0 pulses the waiter under the lock the waiter holds between its read and its wait, so the wake-up
/// is never lost; it takes that lock inside a shield, so an interrupt its thread carries cannot skip the pulse.</para>
/// </remarks>
internal sealed class LoopBodies
{
    private readonly object _gate = new();
    private int _running;
    private int _closed;

    /// <summary>Test-only: <see cref="Close"/> does not wait for the bodies still running (the broken control).</summary>
    internal static bool CloseWithoutWaitingForTesting { get; set; }

    /// <summary>Counts a body in; false (counted out again) once the loop's call has ended: the body must then do nothing.</summary>
    internal bool TryEnter()
    {
        // Interlocked: full fence, before the read of the flag (see the remarks).
        Interlocked.Increment(ref _running);
        if (Volatile.Read(ref _closed) != 0)
        {
            Exit();
            return false;
        }

        return true;
    }

    /// <summary>Test-only: <see cref="Exit"/> takes the lock for its pulse with a plain, interruptible lock (the broken control).</summary>
    internal static bool ExitPulsesWithoutShieldForTesting { get; set; }

    /// <summary>Counts a body out (after a <see cref="TryEnter"/> that returned true).</summary>
    internal void Exit()
    {
        // Interlocked: full fence, before the read of the flag (see the remarks).
        if (Interlocked.Decrement(ref _running) == 0 && Volatile.Read(ref _closed) != 0)
        {
            if (ExitPulsesWithoutShieldForTesting)
            {
                lock (_gate)
                {
                    Monitor.PulseAll(_gate);
                }

                return;
            }

            // In a shield: this thread may carry an interrupt its body raised (the case this type is for), which a
            // contended lock would throw before the pulse — and the count is 0 now, so nothing would pulse again and
            // Close would wait for ever (a review found it). The outermost shield requests the interrupt again.
            using (InterruptShield.Enter())
            using (InterruptShield.Hold(_gate))
            {
                Monitor.PulseAll(_gate);
            }
        }
    }

    /// <summary>Turns away the bodies that have not started, and waits (absorbing interrupts) until the running ones have
    /// ended. Not under either broken control (this one's, or <see cref="InterruptShield.RunLoopsInlineForTesting"/>:
    /// both loops as before).</summary>
    internal void Close()
    {
        // Interlocked.Exchange: full fence, before the read of the count (see the remarks).
        Interlocked.Exchange(ref _closed, 1);
        if (CloseWithoutWaitingForTesting || InterruptShield.RunLoopsInlineForTesting)
        {
            return;
        }

        using (InterruptShield.Enter())
        using (InterruptShield.Hold(_gate))
        {
            while (Volatile.Read(ref _running) != 0)
            {
                InterruptShield.Wait(_gate, Timeout.InfiniteTimeSpan);
            }
        }
    }

    /// <summary>A body that runs <paramref name="body"/> only while the loop's call has not ended.</summary>
    internal Action<T> Guard<T>(Action<T> body) => item =>
    {
        if (!TryEnter())
        {
            return;
        }

        try
        {
            body(item);
        }
        finally
        {
            Exit();
        }
    };

    /// <summary>A body with the loop's state that runs <paramref name="body"/> only while the loop's call has not ended (else it stops the loop).</summary>
    internal Action<int, ParallelLoopState> Guard(Action<int, ParallelLoopState> body) => (index, state) =>
    {
        if (!TryEnter())
        {
            state.Stop();
            return;
        }

        try
        {
            body(index, state);
        }
        finally
        {
            Exit();
        }
    };

    /// <summary>A body with thread-local state that runs <paramref name="body"/> only while the loop's call has not ended (else it stops the loop and keeps the state).</summary>
    internal Func<int, ParallelLoopState, TLocal, TLocal> Guard<TLocal>(Func<int, ParallelLoopState, TLocal, TLocal> body) => (index, state, local) =>
    {
        if (!TryEnter())
        {
            state.Stop();
            return local;
        }

        try
        {
            return body(index, state, local);
        }
        finally
        {
            Exit();
        }
    };
}
