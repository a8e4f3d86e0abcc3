using System;
using System.Threading;
using System.Threading.Tasks;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// Issue 10, sweeps of parked frees running side by side: a sweep writes its frees back and fences outside the sweep's
/// lock, so another sweep (an allocating thread's, inside its operation, while the stocker sweeps) does not wait for
/// it; and a flush of every parked free — which must be complete before an anti-payload is freed — still waits for
/// the sweeps in flight.
/// </summary>
public sealed class SweepConcurrencyTests
{
    private static readonly TimeSpan Wait = TimeSpan.FromSeconds(30);

    [Fact]
    public void ASweepInFlight_DoesNotHoldUpAnotherThreadsSweep()
    {
        Assert.True(SweepBesideASweepInFlight(HeapFaults.None), "a sweep waited for another one's write-back and fence");
    }

    [Fact]
    public void SweepingUnderTheGate_IsCaughtHoldingUpAnotherThreadsSweep()
    {
        Assert.False(SweepBesideASweepInFlight(HeapFaults.SweepUnderTheGate), "the control (sweeps under the lock) was not caught");
    }

    [Fact]
    public void AFlush_WaitsForTheSweepsInFlight()
    {
        (bool early, long pendingAfter) = FlushBesideASweepInFlight(HeapFaults.None);
        Assert.False(early, "the flush returned while another thread's sweep had not made its frees durable");
        Assert.Equal(0, pendingAfter);
    }

    [Fact]
    public void AFlushThatDoesNotWaitForSweepsInFlight_IsCaught()
    {
        (bool early, _) = FlushBesideASweepInFlight(HeapFaults.FlushWithoutWaitingForSweepsInFlight);
        Assert.SkipWhen(!early, "inconclusive: the control's flush did not return within 300 ms on this run");
        Assert.True(early);
    }

    [Fact]
    public void AFlush_DoesNotWaitForSweepsTakenAfterIt()
    {
        Assert.True(FlushBesideALaterSweep(HeapFaults.None, TimeSpan.FromSeconds(30)), "the flush waited for a sweep taken after it");
    }

    [Fact]
    public void AFlushWaitingForEverySweepInFlight_IsCaught()
    {
        Assert.False(FlushBesideALaterSweep(HeapFaults.WaitForEverySweepInFlight, TimeSpan.FromSeconds(2)), "the control (a flush waits for every sweep in flight) was not caught");
    }

    /// <summary>
    /// Review E: a flush used to wait until no sweep at all was in flight, so sweeps that other threads keep starting
    /// (the stocker, writers refilling) could hold it for ever. Holds sweep A in flight, starts a flush (its own sweep
    /// takes every parked free and ends), parks new frees, holds sweep B (taken after the flush) in flight, releases A.
    /// Returns whether the flush returned within <paramref name="bound"/> while B was still held.
    /// </summary>
    private static bool FlushBesideALaterSweep(HeapFaults faults, TimeSpan bound)
    {
        using var fixture = new ParkedFrees(faults);
        PersistentHeap heap = fixture.Heap.Heap;
        using var heldA = new ManualResetEventSlim();
        using var heldB = new ManualResetEventSlim();
        using var releaseA = new ManualResetEventSlim();
        using var releaseB = new ManualResetEventSlim();
        Thread? a = null;
        Thread? b = null;
        heap.AfterSweepMarkedForTesting = () =>
        {
            if (Thread.CurrentThread == a)
            {
                heldA.Set();
                releaseA.Wait();
            }
            else if (Thread.CurrentThread == b)
            {
                heldB.Set();
                releaseB.Wait();
            }
        };
        a = new Thread(() => heap.SweepPendingFrees(1, 0)) { IsBackground = true };
        b = new Thread(() => heap.SweepPendingFrees(1, 0)) { IsBackground = true };
        var flush = new Thread(heap.FlushPendingFrees) { IsBackground = true };
        try
        {
            a.Start();
            Assert.True(heldA.Wait(Wait), "sweep A never marked its frees");
            flush.Start();
            Assert.True(SpinWait.SpinUntil(() => heap.SweepsEndedForTesting >= 1, Wait), "the flush's own sweep never ended");

            // New parked frees after the flush took everything: one more round of replacements, reclaimed two versions on.
            PersistentHashMap<long, long> map = fixture.Map;
            for (long k = 0; k < 4096; k++)
            {
                map.Set(k, -k);
            }

            fixture.Heap.AdvanceVersion(Wait);
            fixture.Heap.AdvanceVersion(Wait);
            Assert.True(heap.PendingFreeBlocks > 0, "no frees parked after the flush");
            b.Start();
            Assert.True(heldB.Wait(Wait), "sweep B never marked its frees");
            releaseA.Set();
            return flush.Join(bound);
        }
        finally
        {
            releaseA.Set();
            releaseB.Set();
            foreach (Thread thread in new[] { a, b, flush })
            {
                if ((thread.ThreadState & ThreadState.Unstarted) == 0)
                {
                    thread.Join(Wait);
                }
            }
        }
    }

    /// <summary>
    /// Holds one thread's sweep in flight (after its marks, before its write-back) and runs a second sweep of the same
    /// class on another thread, bounded to 2 s. Returns whether the second one completed while the first was held.
    /// </summary>
    private static bool SweepBesideASweepInFlight(HeapFaults faults)
    {
        using var fixture = new ParkedFrees(faults);
        PersistentHeap heap = fixture.Heap.Heap;
        Task first = fixture.StartHeldSweep();
        try
        {
            long before = heap.PendingFreeBlocks;
            Task<long> second = Task.Run(() => heap.SweepPendingFrees(1, 0));
            bool completed = second.Wait(TimeSpan.FromSeconds(2));
            if (completed)
            {
                Assert.True(second.Result > 0, "the second sweep found nothing to sweep");
                Assert.True(heap.PendingFreeBlocks < before);
            }

            return completed;
        }
        finally
        {
            fixture.Release();
            Assert.True(first.Wait(Wait));
        }
    }

    /// <summary>
    /// Holds one thread's sweep in flight and flushes every parked free on another thread; once the flush's own sweep
    /// has ended, gives the flush 300 ms to return before the held sweep is released. Returns whether it returned in that time, and the parked frees left after.
    /// </summary>
    private static (bool Early, long PendingAfter) FlushBesideASweepInFlight(HeapFaults faults)
    {
        using var fixture = new ParkedFrees(faults);
        PersistentHeap heap = fixture.Heap.Heap;
        Task first = fixture.StartHeldSweep();
        Task flush = Task.Run(heap.FlushPendingFrees);
        bool early;
        try
        {
            // Once the flush's own sweep has ended (the held one cannot), a flush that does not wait returns at once.
            Assert.True(SpinWait.SpinUntil(() => heap.SweepsEndedForTesting >= 1, Wait), "the flush's own sweep never ended");
            early = flush.Wait(TimeSpan.FromMilliseconds(300));
        }
        finally
        {
            fixture.Release();
        }

        Assert.True(first.Wait(Wait));
        Assert.True(flush.Wait(Wait));
        return (early, heap.PendingFreeBlocks);
    }

}
