using System;
using System.IO;
using System.Threading;
using System.Threading.Tasks;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// Issue 10, the stocker: with a background advancer the heap's pools are stocked on a thread of their own, after each
/// cycle and off its gate, so the next transition (and every Sync) never waits for a sweep; Dispose waits for a
/// stocking in progress before it closes the heap; a failed stocking is the advancer's fault, as it was in the cycle.
/// </summary>
public sealed class StockerTests
{
    private const int TypeId = 23;
    private static readonly TimeSpan Wait = TimeSpan.FromSeconds(30);
    private static readonly TimeSpan Period = TimeSpan.FromMilliseconds(5);

    [Fact]
    public void WithABackgroundAdvancer_SyncDoesNotWaitForAStockingInProgress()
    {
        Assert.True(SyncWhileAStockingIsHeld(DurabilityFaults.None), "Sync timed out while a stocking was held: the cycle waited for it");
    }

    [Fact]
    public void StockingInsideTheCycle_IsCaughtHoldingUpSync()
    {
        Assert.False(SyncWhileAStockingIsHeld(DurabilityFaults.StockInsideTheCycle), "the control (the cycle stocks) was not caught: Sync completed while the cycle's stocking was held");
    }

    [Fact]
    public void ASyncThatRunsTheCycle_DoesNotWaitForTheStockersSweepInFlight()
    {
        Assert.True(SyncWhileTheStockersSweepIsHeld(HeapFaults.None, Wait), "Sync did not return while the stocker's sweep was held");
    }

    [Fact]
    public void SweepingUnderTheGate_IsCaughtHoldingUpTheCycleBehindTheStocker()
    {
        Assert.False(SyncWhileTheStockersSweepIsHeld(HeapFaults.SweepUnderTheGate, TimeSpan.FromSeconds(3)), "the control (the stocker's sweep holds the sweep's lock) was not caught");
    }

    [Fact]
    public void AnOpenWhoseAdvancerThreadCannotStart_StopsTheStocker()
    {
        using var domain = new SimulatedPersistenceDomain(8 << 20);
        using HeapFile file = HeapFile.Create(domain);
        Thread? stocker = null;
        var failing = new BufferedDurableHeapOptions
        {
            AdvancePeriod = Period,
            StartingAdvancerThreadForTesting = starting =>
            {
                stocker = starting.StockerForTesting;
                throw new OutOfMemoryException("simulated: no thread for the advancer");
            },
        };
        Assert.Throws<OutOfMemoryException>(() => BufferedDurableHeap.Open(file, failing));
        Assert.NotNull(stocker);
        Assert.True(stocker.Join(Wait), "the stocker outlived the failed open");
        using BufferedDurableHeap again = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Period });
        new PersistentHashMap<long, long>(again, TypeId).Set(1, 1);
        again.Sync();
    }

    [Fact]
    public void Dispose_WaitsForAStockingInProgress_ThenClosesCleanly()
    {
        (bool early, Exception? failure) = DisposeDuringAStocking(DurabilityFaults.None);
        Assert.False(early, "Dispose completed while the stocker was still inside a stocking");
        Assert.Null(failure);
    }

    [Fact]
    public void DisposeWithoutWaitingForTheStocker_IsCaught()
    {
        (bool early, _) = DisposeDuringAStocking(DurabilityFaults.DisposeWithoutWaitingForTheStocker);
        Assert.SkipWhen(!early, "inconclusive: the control's Dispose did not complete within 300 ms on this run");
        Assert.True(early);
    }

    /// <summary>
    /// A stocker that does not stop within Dispose's wait (stuck in a system call, say) still runs afterwards and
    /// writes through the heap's file: Dispose reports it and closes the file as with a thread left inside an
    /// operation, so the caller's file refuses another heap (which would have the old stocker formatting segments under
    /// it). The control releases the file anyway: another heap opens on it.
    /// </summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void AStockerThatDoesNotStop_KeepsItsFileFromHostingAnotherHeap(bool control)
    {
        var domain = new SimulatedPersistenceDomain(8 << 20);
        HeapFile file = HeapFile.Create(domain);
        using var entered = new ManualResetEventSlim();
        using var release = new ManualResetEventSlim();
        BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions
        {
            AdvancePeriod = Period,
            Faults = control ? DurabilityFaults.ReleaseTheFileUnderARunningBackgroundThread : DurabilityFaults.None,
        });
        heap.BackgroundStopWait = TimeSpan.FromMilliseconds(100);
        heap.StockingForTesting = Hold(entered, release);
        Thread stocker = heap.StockerForTesting!;
        try
        {
            new PersistentHashMap<long, long>(heap, TypeId).Set(1, 1);
            Assert.True(entered.Wait(Wait), "no stocking began");

            TimeoutException stuck = Assert.Throws<TimeoutException>(heap.Dispose);
            Assert.Contains("stocker", stuck.Message);
            AssertTheFileHostsNoOtherHeap(file, control);
        }
        finally
        {
            heap.StockingForTesting = null;
            release.Set();
        }

        Assert.True(stocker.Join(Wait), "the stocker did not stop once released");
        DisposeTheQuarantinedFile(file, domain, control);
    }

    /// <summary>
    /// The same for the advancer, stuck inside its cycle (holding the cycle gate): Dispose used to wait for the gate
    /// without a bound once the advancer had not stopped (twice: before its last advance, for SyncTimeout, here infinite,
    /// and at its close), for as long as the cycle stayed stuck. It now closes the heap
    /// without it (the scheme left undisposed, a transition may be in flight), the file quarantined and refused to
    /// another heap, and says so. The control releases the file anyway: another heap opens on it.
    /// </summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void AnAdvancerStuckInItsCycle_DoesNotHoldDisposeForEver_NorLetAnotherHeapOpen(bool control)
    {
        var domain = new SimulatedPersistenceDomain(8 << 20);
        HeapFile file = HeapFile.Create(domain);
        using var entered = new ManualResetEventSlim();
        using var release = new ManualResetEventSlim();
        // An infinite SyncTimeout: no wait of Dispose may fall back on it.
        BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions
        {
            AdvancePeriod = Period,
            SyncTimeout = Timeout.InfiniteTimeSpan,
            Faults = control ? DurabilityFaults.ReleaseTheFileUnderARunningBackgroundThread : DurabilityFaults.None,
        });
        heap.BackgroundStopWait = TimeSpan.FromMilliseconds(100);
        Func<Thread?> advancer = HoldTheAdvancersNextCycle(heap, entered, release);
        try
        {
            Assert.True(entered.Wait(Wait), "the advancer ran no cycle");
            Exception? failure = null;
            var disposer = new Thread(() => failure = Record.Exception(heap.Dispose)) { IsBackground = true };
            disposer.Start();
            Assert.True(disposer.Join(Wait), "Dispose waited for the stuck advancer's cycle");
            TimeoutException stuck = Assert.IsType<TimeoutException>(failure);
            Assert.Contains("advancer", stuck.Message);
            AssertTheFileHostsNoOtherHeap(file, control);
        }
        finally
        {
            release.Set();
        }

        Assert.True(advancer()!.Join(Wait), "the advancer did not stop once released");
        DisposeTheQuarantinedFile(file, domain, control);
    }

    /// <summary>
    /// Both background threads stuck at once (a failing disk holds both in the kernel): Dispose waited for each in turn
    /// and reported the advancer only. It now waits for both together and names both.
    /// </summary>
    [Fact]
    public void AnAdvancerAndAStockerBothStuck_AreBothReported_AndTheFileKept()
    {
        var domain = new SimulatedPersistenceDomain(8 << 20);
        HeapFile file = HeapFile.Create(domain);
        using var stocking = new ManualResetEventSlim();
        using var cycling = new ManualResetEventSlim();
        using var release = new ManualResetEventSlim();
        BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Period });
        heap.BackgroundStopWait = TimeSpan.FromMilliseconds(100);
        Thread stocker = heap.StockerForTesting!;
        heap.StockingForTesting = Hold(stocking, release);
        Func<Thread?> advancer = () => null;
        try
        {
            heap.WakeStockerForTesting();
            Assert.True(stocking.Wait(Wait), "no stocking began");
            advancer = HoldTheAdvancersNextCycle(heap, cycling, release);
            Assert.True(cycling.Wait(Wait), "the advancer ran no cycle");

            TimeoutException stuck = Assert.Throws<TimeoutException>(heap.Dispose);
            Assert.Contains("advancer and stocker threads did not stop", stuck.Message);
            AssertTheFileHostsNoOtherHeap(file, control: false);
        }
        finally
        {
            release.Set();
        }

        Assert.True(stocker.Join(Wait), "the stocker did not stop once released");
        Assert.True(advancer()!.Join(Wait), "the advancer did not stop once released");
        DisposeTheQuarantinedFile(file, domain, control: false);
    }

    /// <summary>
    /// An open that fails after it started the stocker (no thread for the advancer) while the stocker is stuck in a
    /// stocking: it released the file (and, on a file it opened itself, unmapped it) under the stocker. It now keeps the
    /// file as Dispose does then: another heap is refused while the stocker may still write. The control releases it.
    /// </summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void AFailedOpenWhoseStockerDoesNotStop_KeepsTheFileFromAnotherHeap(bool control)
    {
        var domain = new SimulatedPersistenceDomain(8 << 20);
        HeapFile file = HeapFile.Create(domain);
        using var entered = new ManualResetEventSlim();
        using var release = new ManualResetEventSlim();
        Thread? stocker = null;
        var failing = new BufferedDurableHeapOptions
        {
            AdvancePeriod = Period,
            Faults = control ? DurabilityFaults.ReleaseTheFileUnderARunningBackgroundThread : DurabilityFaults.None,
            StartingAdvancerThreadForTesting = starting =>
            {
                stocker = starting.StockerForTesting;
                starting.BackgroundStopWait = TimeSpan.FromMilliseconds(100);
                starting.StockingForTesting = Hold(entered, release);
                starting.WakeStockerForTesting();
                Assert.True(entered.Wait(Wait), "no stocking began");
                throw new OutOfMemoryException("simulated: no thread for the advancer");
            },
        };
        try
        {
            Assert.Throws<OutOfMemoryException>(() => BufferedDurableHeap.Open(file, failing));
            AssertTheFileHostsNoOtherHeap(file, control);
        }
        finally
        {
            release.Set();
        }

        Assert.True(stocker!.Join(Wait), "the stocker did not stop once released");
        DisposeTheQuarantinedFile(file, domain, control);
    }

    [Fact]
    public void AFailedStocking_IsTheAdvancersFault_AndWhatWasSyncedSurvives()
    {
        using var domain = new SimulatedPersistenceDomain(8 << 20);
        using (HeapFile file = HeapFile.Create(domain))
        {
            BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Period });
            InvalidOperationException sync;
            try
            {
                var map = new PersistentHashMap<long, long>(heap, TypeId);
                map.Set(1, 10);
                heap.Sync();
                heap.StockingForTesting = () => throw new IOException("simulated medium error in a sweep");

                // The next background cycle asks for a stocking; the stocker records the failure and stops. (A write, so
                // that the next period runs a cycle: an idle heap's advancer runs none. The stocking the Sync's cycle
                // asked for may have failed first, and the write is then refused.)
                Record.Exception(() => map.Set(3, 30));
                Assert.True(heap.StockerForTesting!.Join(Wait), "the stocker did not stop after its stocking failed");
                Assert.Throws<InvalidOperationException>(() => map.Set(2, 20));
                sync = Assert.Throws<InvalidOperationException>(() => heap.Sync());
            }
            finally
            {
                Assert.Throws<InvalidOperationException>(heap.Dispose);
            }

            Assert.Contains("Stocking the heap's pools", sync.Message, StringComparison.Ordinal);
            Exception? cause = sync;
            while (cause is not null and not IOException)
            {
                cause = cause.InnerException;
            }

            Assert.NotNull(cause);
        }

        using HeapFile reopened = HeapFile.Open(domain);
        using BufferedDurableHeap again = BufferedDurableHeap.Open(reopened, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
        var recovered = new PersistentHashMap<long, long>(again, TypeId);
        Assert.True(recovered.TryGetValue(1, out long value));
        Assert.Equal(10, value);
    }

    [Fact]
    public void TheStocker_StocksThePoolsForTheWriters()
    {
        using var domain = new SimulatedPersistenceDomain(8 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Period });
        var map = new PersistentHashMap<long, long>(heap, TypeId);
        for (long k = 0; k < 20_000; k++)
        {
            map.Set(k, k);
        }

        heap.Sync();
        Assert.True(SpinWait.SpinUntil(() => heap.Heap.StockFormattedSegments > 0, Wait), "no segment was formatted for the pools after a version of 20,000 allocations");
        Assert.True(heap.StockerRunsForTesting > 0);
    }

    /// <summary>
    /// A background advancer that does not fire during the test (cycles run by hand, one at a time, but the heap has a
    /// stocker, which stocks after them only here): writes and advances until the stocker sweeps, holds its first sweep
    /// in flight (after its marks, before its write-back), then writes and runs a Sync on another thread. Returns
    /// whether that Sync returned within <paramref name="bound"/> while the sweep was held (it covers its version either
    /// way: the frontier moves before the reclamation). Adapted from review D's demonstration that the cycle used to wait
    /// for the stocker's sweep.
    /// </summary>
    private static bool SyncWhileTheStockersSweepIsHeld(HeapFaults faults, TimeSpan bound)
    {
        const int Keys = 2048;
        using var domain = new SimulatedPersistenceDomain(1 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using var entered = new ManualResetEventSlim();
        using var release = new ManualResetEventSlim();
        int once = 0;
        // No back-pressure: a write would run a cycle to help reclaim (on this thread), behind a held sweep with the
        // broken control.
        BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromHours(1), ReclaimBacklogLimit = long.MaxValue, HeapFaults = faults });
        Thread? sync = null;
        try
        {
            Assert.NotNull(heap.StockerForTesting);

            // The stocker sweeps after cycles only here (no writer wakes it between them: see LowWaterStockingTests), so
            // no sweep is held while this thread's Sync runs a cycle, which with the broken control would wait for it.
            heap.Heap.PoolRunningLow = null;
            heap.Heap.AfterSweepMarkedForTesting = () =>
            {
                if (Thread.CurrentThread == heap.StockerForTesting && Interlocked.Exchange(ref once, 1) == 0)
                {
                    entered.Set();
                    release.Wait();
                }
            };

            var map = new PersistentHashMap<long, long>(heap, TypeId);
            for (int round = 0; round < 200 && !entered.IsSet; round++)
            {
                for (long k = 0; k < Keys; k++)
                {
                    map.Set(k, k + round);
                }

                // One cycle (a Sync may run two, the second behind a sweep the first one's stocking holds: with the
                // broken control it would wait for ever), then the stocking it asked for, ended or held.
                long runs = heap.StockerRunsForTesting;
                heap.AdvanceVersion(Wait);
                Assert.True(SpinWait.SpinUntil(() => entered.IsSet || heap.StockerRunsForTesting > runs, Wait));
            }

            Assert.True(entered.IsSet, "the stocker never swept");

            map.Set(0, -1);
            long target = heap.CurrentVersion;
            sync = new Thread(() => heap.Sync(TimeSpan.FromSeconds(30))) { IsBackground = true };
            sync.Start();
            Assert.True(SpinWait.SpinUntil(() => heap.DurableFrontier >= target, Wait), "the frontier never covered the target");
            return sync.Join(bound);
        }
        finally
        {
            release.Set();
            sync?.Join(Wait);
            heap.Dispose();
        }
    }

    /// <summary>
    /// Holds the first stocking (the stocker's, or with the control the cycle's) and runs a Sync meanwhile, bounded to 2
    /// s. Returns whether the Sync completed (its version durable) while the stocking was still held.
    /// </summary>
    private static bool SyncWhileAStockingIsHeld(DurabilityFaults faults)
    {
        using var domain = new SimulatedPersistenceDomain(8 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using var entered = new ManualResetEventSlim();
        using var release = new ManualResetEventSlim();
        BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Period, Faults = faults });
        int testThread = Environment.CurrentManagedThreadId;
        int held = 0;
        try
        {
            // Held once, never on this thread: with the control, a cycle this thread runs (helping an old version) stocks too.
            heap.StockingForTesting = () =>
            {
                if (Environment.CurrentManagedThreadId != testThread && Interlocked.Exchange(ref held, 1) == 0)
                {
                    entered.Set();
                    release.Wait();
                }
            };
            var map = new PersistentHashMap<long, long>(heap, TypeId);
            map.Set(1, 1);
            Assert.True(entered.Wait(Wait), "no stocking began");
            map.Set(2, 2);
            long target = heap.CurrentVersion;
            try
            {
                heap.Sync(TimeSpan.FromSeconds(2));
            }
            catch (TimeoutException)
            {
                return false;
            }

            Assert.True(heap.DurableFrontier >= target);
            Assert.False(release.IsSet);
            return true;
        }
        finally
        {
            release.Set();
            heap.Dispose();
        }
    }

    /// <summary>
    /// Holds a stocking of the stocker and disposes the heap on another thread; once Dispose is stopping the stocker,
    /// gives it 300 ms to complete before the stocking is released. Returns whether it completed in that time, and what
    /// it threw.
    /// </summary>
    private static (bool Early, Exception? Failure) DisposeDuringAStocking(DurabilityFaults faults)
    {
        using var domain = new SimulatedPersistenceDomain(8 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using var entered = new ManualResetEventSlim();
        using var stopping = new ManualResetEventSlim();
        using var release = new ManualResetEventSlim();
        BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Period, Faults = faults });
        heap.StockingForTesting = Hold(entered, release);
        heap.StoppingStockerForTesting = stopping.Set;
        var map = new PersistentHashMap<long, long>(heap, TypeId);
        map.Set(1, 1);
        Assert.True(entered.Wait(Wait), "no stocking began");
        Task dispose = Task.Run(heap.Dispose);
        bool early;
        try
        {
            Assert.True(stopping.Wait(Wait), "Dispose never stopped the stocker");
            early = dispose.Wait(TimeSpan.FromMilliseconds(300));
        }
        catch (AggregateException)
        {
            early = true;
        }
        finally
        {
            release.Set();
        }

        try
        {
            Assert.True(dispose.Wait(Wait), "Dispose did not complete once the stocking was released");
            return (early, null);
        }
        catch (AggregateException e)
        {
            return (early, e.InnerException);
        }
    }

    /// <summary>While a thread of the closed heap may still write through <paramref name="file"/>: it hosts no other heap
    /// (the control released it: another heap opens).</summary>
    private static void AssertTheFileHostsNoOtherHeap(HeapFile file, bool control)
    {
        if (control)
        {
            BufferedDurableHeap.Open(file).Dispose();
        }
        else
        {
            Assert.Throws<InvalidOperationException>(() => BufferedDurableHeap.Open(file));
        }
    }

    /// <summary>Once that thread has stopped: the file is disposed, its domain stays mapped, quarantined as after a
    /// straggler (the file cannot know the thread has gone); the control's is released.</summary>
    private static void DisposeTheQuarantinedFile(HeapFile file, SimulatedPersistenceDomain domain, bool control)
    {
        file.Dispose();
        if (control)
        {
            domain.Dispose();
        }
        else
        {
            Assert.Throws<InvalidOperationException>(domain.Dispose);
        }
    }

    /// <summary>A hook that holds the thread running it: signals <paramref name="entered"/>, then waits for <paramref name="release"/>.</summary>
    private static Action Hold(ManualResetEventSlim entered, ManualResetEventSlim release) => () =>
    {
        entered.Set();
        release.Wait();
    };

    /// <summary>Holds the advancer inside the next cycle it begins (the transition's critical section) until
    /// <paramref name="release"/>; returns the advancer's thread once <paramref name="entered"/> is set.</summary>
    private static Func<Thread?> HoldTheAdvancersNextCycle(BufferedDurableHeap heap, ManualResetEventSlim entered, ManualResetEventSlim release)
    {
        Thread? advancer = null;
        heap.VersionBeginsForTesting = _ =>
        {
            if (Thread.CurrentThread.Name == "epvs-advancer" && !entered.IsSet)
            {
                advancer = Thread.CurrentThread;
                entered.Set();
                release.Wait();
            }
        };

        AdvancerCycles.AskForOne(heap);
        return () => advancer;
    }
}
