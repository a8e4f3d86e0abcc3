using System;
using System.Runtime.CompilerServices;
using System.Threading;

namespace Epvs.Persistence;

// The stocker: with a background advancer, a second thread stocks the heap's pools for the allocating threads after
// each cycle, off the cycle gate, so that the next transition does not wait for it.
// Why. Stocking is bursty: once the heap has no free segment left it sweeps parked frees in whole segments, a few
// cycles' demand at a time (a write-back and a fence of every page it frees). Inside the cycle, a cycle that swept
// took about twice the period under one full-speed writer through the page cache (a write-back of 4–9 ms, a seal of
// 4–9 ms, a sweep of 13–29 ms), so the next version started late and grew, its write-back grew in turn, and the
// durability lag's p99 was about three periods. Nothing of a version's durability depends on the stocking: the
// frontier is persisted and the waiters completed before it, and an allocating thread that finds its class's pool
// empty sweeps or formats for itself, as it did before the pools were stocked.
// What a cycle may still wait for. A sweep holds the sweep's lock only while it takes its blocks off the bitmaps
// (it writes them back outside it: see PersistentHeap.FlushPendingFrees), so a cycle parking its frees
// waits for that much at most. A cycle whose version deleted something flushes every parked free before it frees the
// anti-payloads, and so waits for the sweeps in flight (an anti-payload's free must not reach the file before a
// cancelled copy's). Freeing a large block takes the segment gate, which a stocking holds while it formats free
// segments.
// Safety. The stocking takes the heap's own locks (the segment gate, the sweep's gate, the pools'), as the
// allocating threads' own sweeps and formats do while a cycle runs; one thread stocks at a time (this one, or without
// a background advancer the cycle itself, under its gate). A failure is recorded as the advancer's, as it was when the
// cycle stocked: nothing more becomes durable. Dispose stops this thread before its last cycles, which stock nothing.
public sealed partial class BufferedDurableHeap
{
    private Thread? _stocker;

    /// <summary>Blocks the cycles allocated since the stocker's last run (bounds its sweep of an excess of parked frees); under <see cref="_stockGate"/>.</summary>
    private long _allocatedSinceStock;

    /// <summary>The stocker's gate (in the background link, which its thread holds instead of the heap).</summary>
    private object _stockGate => _link.StockGate;

    /// <summary>Test hook: runs as a stocking begins, on the stocker's thread or in the cycle (a throw stands for a failure in it).</summary>
    internal Action? StockingForTesting { get; set; }

    /// <summary>Test hook: runs in Dispose as it stops the stocker, before it waits for a stocking in progress.</summary>
    internal Action? StoppingStockerForTesting { get; set; }

    /// <summary>The stocker's thread, null without one (tests).</summary>
    internal Thread? StockerForTesting => _stocker;

    /// <summary>Stockings the stocker thread finished (tests).</summary>
    internal long StockerRunsForTesting => Volatile.Read(ref _stockerRuns);

    private long _stockerRuns;

    /// <summary>
    /// After a cycle's reclamation: keeps about two cycles' allocations of each class ready, so allocating threads
    /// neither sweep nor format segments themselves (free segments first, then the class's densest parked frees: see
    /// <see cref="PersistentHeap.StockPools"/>), and sweeps a few cycles' worth of an excess of parked frees. With a
    /// background advancer the stocker thread does it; without one, the cycle (the caller drives versions by hand).
    /// Not in Dispose's last cycles: nobody allocates any more, and a segment formatted for a class stays in it.
    /// </summary>
    /// <param name="allocated">How many blocks the cycle's version allocated.</param>
    private void StockAfterCycle(long allocated)
    {
        if (_stocker is null || (_faults & DurabilityFaults.StockInsideTheCycle) != 0)
        {
            // Volatile.Read: as in RunCycle.
            if (Volatile.Read(ref _disposingThread) == 0)
            {
                Stock(allocated);
            }

            return;
        }

        using (InterruptShield.Hold(_stockGate))
        {
            _allocatedSinceStock += allocated;
            _link.StockRequested = true;
            Monitor.Pulse(_stockGate);
        }
    }

    /// <summary>The stocking itself (one thread at a time: the stocker, or the cycle under its gate).</summary>
    private void Stock(long allocated)
    {
        StockingForTesting?.Invoke();

        // With a background advancer, the demand's rate over a few periods (PersistentHeap.StockHorizonPeriods: half of
        // it, the low-water mark, covers a stocking's own formatting and fences under load); cycles driven by hand have
        // no rate.
        _heap.StockPools(StockReserveBytes, _stocker is null || (_faults & DurabilityFaults.StockOnlyAfterCycles) != 0 ? TimeSpan.Zero : _period);

        // Bounded: at most three quarters of the file parked, so old copies do not stay on the file (and recoverable)
        // for ever. Past the bound, each stocking sweeps a few cycles' worth more, not everything at once (one long pause).
        long excess = _heap.PendingFreeBytes - (_heap.File.Size / 4 * 3);
        if (excess > 0)
        {
            _heap.SweepForStocking(Math.Min(excess / HeapLayout.HeaderSize, 4 * ((2L * allocated) + 1024)), -1);
        }
    }

    private void StartStocker()
    {
        _stocker = new Thread(StockerLoop) { IsBackground = true, Name = "epvs-stocker" };
        _stocker.Start(_link);
        // (Both broken controls stock after cycles only: StockInsideTheCycle in the cycle, as before the stocker.)
        if ((_faults & (DurabilityFaults.StockOnlyAfterCycles | DurabilityFaults.StockInsideTheCycle)) == 0)
        {
            _heap.PoolRunningLow = WakeStocker;
        }
    }

    /// <summary>Asks the stocker for a stocking now (tests).</summary>
    internal void WakeStockerForTesting() => WakeStocker();

    /// <summary>An allocating thread left a class's pool below its low-water mark (see <see cref="PersistentHeap.PoolRunningLow"/>): stock now, not after the next cycle.</summary>
    private void WakeStocker()
    {
        using (InterruptShield.Hold(_stockGate))
        {
            _link.StockRequested = true;
            Monitor.Pulse(_stockGate);
        }
    }

    /// <summary>The stocker's thread: holds the heap only while it stocks (see <see cref="BackgroundLink"/>).</summary>
    private static void StockerLoop(object? state)
    {
        var link = (BackgroundLink)state!;
        try
        {
            StockUntilStopped(link);
        }
        catch (Exception e)
        {
            // Nothing may leave the thread (it would end the process): recorded, as a failed stocking is.
            RecordEscaped(link, e);
        }
    }

    private static void StockUntilStopped(BackgroundLink link)
    {
        while (true)
        {
            using (InterruptShield.Hold(link.StockGate))
            {
                while (!link.StockRequested && !link.StockerStopping)
                {
                    Monitor.Wait(link.StockGate);
                }

                if (link.StockerStopping)
                {
                    return;
                }

                link.StockRequested = false;
            }

            if (!StockOnce(link))
            {
                return;
            }
        }
    }

    /// <summary>One stocking of the link's heap, if it is still alive; false when the stocker ends.</summary>
    [MethodImpl(MethodImplOptions.NoInlining)]
    private static bool StockOnce(BackgroundLink link) => link.Heap.TryGetTarget(out BufferedDurableHeap? heap) && heap.StockOnRequest();

    /// <summary>The stocking the stocker was asked for; false after a failure (the stocker ends).</summary>
    private bool StockOnRequest()
    {
        long allocated;
        using (InterruptShield.Hold(_stockGate))
        {
            allocated = _allocatedSinceStock;
            _allocatedSinceStock = 0;
        }

        try
        {
            Stock(allocated);
            Interlocked.Increment(ref _stockerRuns);
        }
        catch (Exception e)
        {
            // As when the cycle stocked (its failure was the cycle's): nothing more becomes durable, and Sync and
            // SyncAsync report why. Not under the cycle gate, which a Sync may hold for as long as a thread stays
            // inside an operation (Dispose then waited for this thread, and reported it, instead of the straggler):
            // a cycle that runs meanwhile is sound (no stocking is part of a version's durability), and the next one
            // refuses. Never throws (see RecordBackgroundFault): out of memory, the stocking's own exception is recorded.
            Exception fault = e;
            try
            {
                fault = new InvalidOperationException($"Stocking the heap's pools after an advance cycle failed: {e.Message}", e);
            }
            catch (Exception)
            {
            }

            RecordBackgroundFault(fault);
            return false;
        }

        return true;
    }

    /// <summary>Tells the stocker to stop after a stocking in progress (Dispose, before its last cycles; a failed open), inside the caller's shield.</summary>
    private void SignalStockerToStop()
    {
        StoppingStockerForTesting?.Invoke();

        // Uninterruptible, as every wait of Dispose: an interrupt must not leave the stocker running.
        InterruptShield.Lock(_stockGate);
        try
        {
            _link.StockerStopping = true;
            Monitor.Pulse(_stockGate);
        }
        finally
        {
            Monitor.Exit(_stockGate);
        }
    }

    /// <summary>Waits up to <paramref name="wait"/> for the stocker, told to stop, to end (a stocking in progress first).</summary>
    /// <returns>Whether it ended (or there is none).</returns>
    private bool StockerStopped(TimeSpan wait) =>
        (_faults & DurabilityFaults.DisposeWithoutWaitingForTheStocker) != 0 || _stocker is not { } thread || InterruptShield.Join(thread, wait);
}
