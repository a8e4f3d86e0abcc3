using System;
using System.Diagnostics;
using System.Threading;

namespace Epvs;

/// <summary>A wait past the per-thread depth bound hands what it waits for to a drain on a fresh stack.</summary>
public sealed partial class LightEpoch
{
    /// <summary>
    /// The last drain this thread handed off from a wait past <see cref="MaxThreadWaitingDepth"/>: a wait loops, and
    /// starts another only once that one has begun to drain (so not a thread on every turn while one starts up).
    /// </summary>
    [ThreadStatic] private static HandOff? t_handOff;

    /// <summary>What a thread that takes over a deep wait's step must know of the waiter's thread (the version scheme's
    /// callbacks it is inside): captured on the waiter, restored on the new thread before it drains.</summary>
    internal interface IWaiterContext
    {
        object? Capture();

        void Restore(object? context);
    }

    /// <summary>Set once by the first version scheme created (the epoch layer knows nothing of schemes).</summary>
    internal static IWaiterContext? WaiterContext;

    /// <summary>The hand-off thread's stack: reserved, not committed; it must hold up to <see cref="MaxThreadWaitingDepth"/>
    /// levels of actions however much the waiter's own stack was given (the default, 1.5 to 8 MB, held fewer than 512 levels
    /// of an action with a 16 KB frame).</summary>
    private const int HandOffStackSize = 64 << 20;

    private sealed class HandOff
    {
        internal const int Starting = 1;
        internal const int Draining = 2;
        internal const int Done = 3;
        internal int State = Starting;
        internal long DrainingSince;
    }

    /// <summary>How long a hand-off drains before the waiter may start another (10 ms, in timestamp ticks).</summary>
    private static readonly long HandOffPatience = Stopwatch.Frequency / 100;

    /// <summary>
    /// For a wait past <see cref="MaxThreadWaitingDepth"/> (its waiter unprotected, or announced past the step it waits
    /// for: what it waits for may run on any thread): when something of this epoch is safe to run, runs it on a new thread
    /// instead of one level deeper here. A chain of critical sections that each start the next scheme's transition and
    /// then Refresh inside a region of it ran each step inside the previous one's wait, one level deeper each time, until
    /// the stack overflowed (about 12,000 levels on a 16 MB stack); now every 512 levels the chain goes on on a fresh
    /// stack, the threads below waiting for it. Once the last drain handed off has begun, something still safe to run
    /// gets another: the last one may be inside an action that waits for this thread, ahead of what this thread waits
    /// for. Returns false when no thread could be started: the caller runs the drain here instead, as before.
    /// </summary>
    private bool HandOffDeepDrain()
    {
        if (DeepWaitDrainsInlineForTesting)
            return false;
        // Nothing safe to run yet (as Drain decides, without publishing): the waiter's loop looks again.
        long current = Volatile.Read(ref currentEpoch.Value);
        if (table.OldestAnnounced(current) - 1 < Volatile.Read(ref pendingHint.Value))
            return true;
        if (t_handOff is { } last)
        {
            int state = Volatile.Read(ref last.State);
            if (state == HandOff.Starting)
                return true; // it has not looked yet
            // Draining: a long action may keep the hint stale meanwhile, which would start a thread on every turn of the
            // waiter's loop; another one only once it has drained a while (it may be inside an action that waits for
            // this thread, ahead of what this thread waits for).
            if (state == HandOff.Draining && Stopwatch.GetTimestamp() - Volatile.Read(ref last.DrainingSince) < HandOffPatience)
                return true;
        }
        var handOff = new HandOff();
        try
        {
            IWaiterContext? carrier = HandOffWithoutWaiterContextForTesting ? null : WaiterContext;
            object? context = carrier?.Capture();
            var drainer = new Thread(
                () =>
            {
                Volatile.Write(ref handOff.DrainingSince, Stopwatch.GetTimestamp());
                Volatile.Write(ref handOff.State, HandOff.Draining);
                try
                {
                    carrier?.Restore(context);
                    Drain(waiting: true);
                }
                catch (Exception)
                {
                    // A drain reports its actions' faults itself (DeferredActionFailed); one that fails (out of memory)
                    // leaves them pending for the next drain, which the waiter's loop makes. Never an unhandled exception.
                }
                finally
                {
                    Volatile.Write(ref handOff.State, HandOff.Done);
                }
            },
                HandOffStackSizeForTesting != 0 ? HandOffStackSizeForTesting : HandOffStackSize)
            {
                IsBackground = true,
                Name = "Epvs deep-wait drain",
            };
            // The waiter's ExecutionContext (its AsyncLocal values) does not flow, on every target alike (SuppressFlow
            // throws where the waiter has suppressed it already).
            if (ExecutionContext.IsFlowSuppressed())
                drainer.Start();
            else
            {
                using (ExecutionContext.SuppressFlow())
                    drainer.Start();
            }
            t_handOff = handOff;
            return true;
        }
        catch (Exception)
        {
            // No thread (out of memory, a thread limit): run it here, one level deeper, as before.
            return false;
        }
    }
}
