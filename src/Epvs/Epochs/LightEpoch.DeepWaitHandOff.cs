using System;
using System.Diagnostics;
using System.Threading;

namespace Epvs;

// A wait past the per-thread depth bound hands what it waits for to a drain on a fresh stack.
public sealed partial class LightEpoch
{
    /// <summary>
    /// The drains this thread handed off from a wait past <see cref="MaxThreadWaitingDepth"/>: a wait loops, and starts
    /// another only once the last one has begun to drain (so not a thread on every turn while one starts up), and only while
    /// fewer than <see cref="MaxLiveHandOffs"/> of them are still draining.
    /// </summary>
    [ThreadStatic] private static HandOffs? t_handOffs;

    /// <summary>How many hand-off threads of one waiter may be draining at once. Each runs the waiter's step first, so
    /// another is needed only while the earlier ones are inside long actions (one may wait for the waiter); past the bound
    /// a thread that runs only the waiter's step stands in, once the step is safe.</summary>
    private const int MaxLiveHandOffs = 4;

    /// <summary>What a thread that takes over a deep wait's step must know of the waiter's thread (the version scheme's
    /// callbacks it is inside): captured on the waiter, with the action it waits for, and restored on the new thread
    /// before it drains.</summary>
    internal interface IWaiterContext
    {
        object? Capture(Action awaited);

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

        /// <summary>What the waiter that started it waits for.</summary>
        internal Action? Awaited;
    }

    private sealed class HandOffs
    {
        internal HandOff? Last;

        /// <summary>The last thread started past the bound to run only the waiter's step.</summary>
        internal HandOff? AwaitedOnly;

        /// <summary>Started and not done (incremented by the waiter, decremented by the hand-off thread).</summary>
        internal int Live;
    }

    /// <summary>How long a hand-off drains before the waiter may start another (10 ms, in timestamp ticks).</summary>
    private static readonly long HandOffPatience = Stopwatch.Frequency / 100;

    /// <summary>
    /// For a wait past <see cref="MaxThreadWaitingDepth"/> (its waiter unprotected, or announced past the step it waits
    /// for: what it waits for may run on any thread): when something of this epoch is safe to run, runs it on a new thread
    /// instead of one level deeper here. A chain of critical sections that each start the next scheme's transition and
    /// then Refresh inside a region of it ran each step inside the previous one's wait, one level deeper each time, until
    /// the stack overflowed (about 12,000 levels on a 16 MB stack); now every 512 levels the chain goes on on a fresh
    /// stack, the threads below waiting for it. A hand-off thread runs what the waiter waits for first (not behind a
    /// backlog of other actions), then drains the rest. Once the last drain handed off has drained a while, something still
    /// safe to run gets another, up to <see cref="MaxLiveHandOffs"/> at once: the last one may be inside an action that
    /// waits for this thread, ahead of what this thread waits for. Past that bound, a thread that runs only what the waiter
    /// waits for, once it is safe (one at a time): running it here would nest again, and a chain of such steps would grow
    /// this stack as before. Returns false only when no thread could be started: the caller then runs what it waits for
    /// here.
    /// </summary>
    private bool HandOffDeepDrain(Action awaited)
    {
        if (DeepWaitDrainsInlineForTesting)
            return false;
        // Nothing safe to run yet (as Drain decides, without publishing): the waiter's loop looks again.
        long current = Volatile.Read(ref currentEpoch.Value);
        long safe = table.OldestAnnounced(current) - 1;
        if (safe < Volatile.Read(ref pendingHint.Value))
            return true;
        HandOffs mine = t_handOffs ??= new HandOffs();
        if (mine.Last is { } last)
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
        // Acquire: pairs with the decrement at a hand-off's end.
        if (Volatile.Read(ref mine.Live) < MaxLiveHandOffs || UnboundedHandOffsForTesting)
            return StartHandOff(mine, awaited, awaitedOnly: false);
        if (mine.AwaitedOnly is { } running && running.Awaited == awaited && Volatile.Read(ref running.State) != HandOff.Done)
            return true; // it runs the step as soon as it can (one for another scheme's step, still running, is not this)
        if (HandOffCapRunsInlineForTesting)
            return false;
        if (!drainList.HasEligible(safe, awaited))
            return true; // not safe yet: the waiter's loop looks again
        return StartHandOff(mine, awaited, awaitedOnly: true);
    }

    /// <summary>Starts a hand-off thread (see <see cref="HandOffDeepDrain"/>); false if none could be started.</summary>
    private bool StartHandOff(HandOffs mine, Action awaited, bool awaitedOnly)
    {
        var handOff = new HandOff { Awaited = awaited };
        bool counted = false;
        try
        {
            IWaiterContext? carrier = HandOffWithoutWaiterContextForTesting ? null : WaiterContext;
            object? context = carrier?.Capture(awaited);
            var drainer = new Thread(
                () =>
            {
                Volatile.Write(ref handOff.DrainingSince, Stopwatch.GetTimestamp());
                Volatile.Write(ref handOff.State, HandOff.Draining);
                try
                {
                    carrier?.Restore(context);
                    // What the waiter waits for first, then everything else that is safe (unless it only stands in for the
                    // waiter's own step, past the bound on threads that drain everything).
                    if (!UnboundedHandOffsForTesting)
                        Drain(waiting: true, awaited, onlyAwaited: true);
                    if (!awaitedOnly)
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
                    if (!awaitedOnly)
                        Interlocked.Decrement(ref mine.Live);
                }
            },
                HandOffStackSizeForTesting != 0 ? HandOffStackSizeForTesting : HandOffStackSize)
            {
                IsBackground = true,
                Name = "Epvs deep-wait drain",
            };
            if (!awaitedOnly)
            {
                Interlocked.Increment(ref mine.Live);
                counted = true;
            }
            // The waiter's ExecutionContext (its AsyncLocal values) does not flow, on every target alike (SuppressFlow
            // throws where the waiter has suppressed it already).
            if (ExecutionContext.IsFlowSuppressed())
                drainer.Start();
            else
            {
                using (ExecutionContext.SuppressFlow())
                    drainer.Start();
            }
            if (awaitedOnly)
                mine.AwaitedOnly = handOff;
            else
                mine.Last = handOff;
            return true;
        }
        catch (Exception)
        {
            // No thread (out of memory, a thread limit): run it here, one level deeper, as before.
            if (counted)
                Interlocked.Decrement(ref mine.Live);
            return false;
        }
    }
}
