using System;
using System.Threading;

namespace Epvs;

/// <summary>A wait past the per-thread depth bound hands what it waits for to a drain on a fresh stack.</summary>
public sealed partial class LightEpoch
{
    /// <summary>
    /// This thread's drain handed off from a wait past <see cref="MaxThreadWaitingDepth"/>, while it runs (one at a time
    /// per waiting thread: a wait loops, and must not start a thread on every turn).
    /// </summary>
    [ThreadStatic] private static HandOff? t_handOff;

    private sealed class HandOff
    {
        internal int Running;
    }

    /// <summary>
    /// For a wait past <see cref="MaxThreadWaitingDepth"/> (its waiter unprotected, or announced past the step it waits
    /// for: what it waits for may run on any thread): when something of this epoch is safe to run, runs it on a new thread
    /// instead of one level deeper here. A chain of critical sections that each start the next scheme's transition and
    /// then Refresh inside a region of it ran each step inside the previous one's wait, one level deeper each time, until
    /// the stack overflowed (about 12,000 levels on a 16 MB stack); now every 512 levels the chain goes on on a fresh
    /// stack, the threads below waiting for it. Returns false when the drain must run here instead: the waiter's previous
    /// hand-off still runs (it could be waiting for this thread), or no thread could be started.
    /// </summary>
    private bool HandOffDeepDrain()
    {
        if (DeepWaitDrainsInlineForTesting)
            return false;
        // Nothing safe to run yet (as Drain decides, without publishing): the waiter's loop looks again.
        long current = Volatile.Read(ref currentEpoch.Value);
        if (table.OldestAnnounced(current) - 1 < Volatile.Read(ref pendingHint.Value))
            return true;
        HandOff handOff = t_handOff ??= new HandOff();
        if (Volatile.Read(ref handOff.Running) != 0)
            return false;
        handOff.Running = 1;
        try
        {
            var drainer = new Thread(() =>
            {
                try
                {
                    Drain(waiting: true);
                }
                catch (Exception)
                {
                    // A drain reports its actions' faults itself (DeferredActionFailed); one that fails (out of memory)
                    // leaves them pending for the next drain, which the waiter's loop makes. Never an unhandled exception.
                }
                finally
                {
                    Volatile.Write(ref handOff.Running, 0);
                }
            })
            {
                IsBackground = true,
                Name = "Epvs deep-wait drain",
            };
#if NET5_0_OR_GREATER
            drainer.UnsafeStart();
#else
            drainer.Start();
#endif
            Interlocked.Increment(ref HandedOffDrainsForTesting);
            return true;
        }
        catch (Exception)
        {
            // No thread (out of memory, a thread limit): run it here, one level deeper, as before.
            Volatile.Write(ref handOff.Running, 0);
            return false;
        }
    }
}
