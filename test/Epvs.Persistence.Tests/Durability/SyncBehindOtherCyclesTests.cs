using System;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// A Sync that finds the cycle gate held by another thread returns as soon as that thread's cycles make its version
/// durable, not when the gate is finally free. It used to wait for the gate alone: a monitor is not fair, and a
/// background advancer behind its schedule takes the gate again as soon as it lets it go, so under full-speed writers a
/// Sync waited through several cycles after its version was durable (its p99 was 8.6–10.2 advance periods under two
/// in the benchmark, 2.2–3.6 under one). Here the test's thread stands for that advancer: it holds the gate, and inside it runs a whole cycle
/// (the gate is re-entrant) that makes the Sync's version durable, then keeps the gate until the Sync has returned or
/// the test gives up. The order is fixed by a hook (the Sync is waiting before the cycle runs), not by timing.
/// </summary>
public sealed class SyncBehindOtherCyclesTests
{
    private const long Capacity = 4 << 20;

    [Fact]
    public void Sync_WhoseVersionAnotherThreadsCycleMakesDurable_ReturnsWhileThatThreadKeepsTheGate()
    {
        (Exception? failure, long target, long frontier, _) = SyncBehindAHeldGate(DurabilityFaults.None, TimeSpan.FromSeconds(3), holdAtTheFrontier: false);
        Assert.Null(failure);
        Assert.True(frontier >= target, $"the Sync returned with frontier {frontier}, below its version {target}");
    }

    /// <summary>The control waits for the gate alone: it times out although its version became durable just after it began waiting.</summary>
    [Fact]
    public void Control_ASyncThatWaitsForTheGateAlone_TimesOutAlthoughItsVersionIsDurable()
    {
        (Exception? failure, long target, long frontier, _) = SyncBehindAHeldGate(DurabilityFaults.WaitForTheCycleGateAlone, TimeSpan.FromSeconds(3), holdAtTheFrontier: false);
        Assert.IsType<TimeoutException>(failure);
        Assert.True(frontier >= target);
    }

    /// <summary>
    /// The Sync returns while the cycle that made its version durable is still running (held in a hook right after its
    /// frontier moved, until the Sync has ended or 5 s have passed), not when that cycle lets the gate go: the frontier's
    /// move wakes it. (The test above is passed by the wake of the nested cycle's release alone.)
    /// </summary>
    [Fact]
    public void Sync_ReturnsInsideTheCycleThatMakesItsVersionDurable()
    {
        (Exception? failure, _, _, bool? endedInsideTheCycle) = SyncBehindAHeldGate(DurabilityFaults.None, TimeSpan.FromSeconds(30), holdAtTheFrontier: true);
        Assert.Null(failure);
        Assert.True(endedInsideTheCycle == true, $"the Sync did not return while the cycle that made its version durable ran (the hook ran: {endedInsideTheCycle is not null})");
    }

    /// <summary>The control waits for the gate alone: it returns only once the cycle has let the gate go.</summary>
    [Fact]
    public void Control_ASyncThatWaitsForTheGateAlone_DoesNotReturnInsideTheCycle()
    {
        (Exception? failure, _, _, bool? endedInsideTheCycle) = SyncBehindAHeldGate(DurabilityFaults.WaitForTheCycleGateAlone, TimeSpan.FromSeconds(30), holdAtTheFrontier: true);
        Assert.Null(failure);
        Assert.True(endedInsideTheCycle == false);
    }

    /// <summary>
    /// A heap driven by hand; this thread takes the cycle gate, another calls Sync (<paramref name="syncTimeout"/>) and
    /// waits for it; this thread then runs a cycle inside the gate. Unless <paramref name="holdAtTheFrontier"/>, it keeps
    /// the gate until the Sync's thread ends (at most 30 s); if it is set, the cycle waits in its
    /// <see cref="BufferedDurableHeap.FrontierMovedForTesting"/> hook for the Sync's thread to end (at most 5 s), and the
    /// gate is let go after the cycle. Returns the Sync's failure, its target version, the durable frontier when it
    /// ended, and (with the hook) whether it ended inside the cycle.
    /// </summary>
    private static (Exception? Failure, long Target, long Frontier, bool? EndedInsideTheCycle) SyncBehindAHeldGate(DurabilityFaults faults, TimeSpan syncTimeout, bool holdAtTheFrontier)
    {
        using var domain = new SimulatedPersistenceDomain(Capacity);
        using HeapFile file = HeapFile.Create(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, Faults = faults });
        var map = new PersistentHashMap<long, long>(heap, DurableWorkload.MapTypeId);
        map.Set(1, 10);
        long target = heap.CurrentVersion;
        Assert.True(heap.DurableFrontier < target);

        using var waiting = new ManualResetEventSlim();
        heap.WaitingForTheCycleGateForTesting = waiting.Set;
        Exception? failure = null;
        long frontier = -1;
        var syncer = new Thread(() =>
        {
            try
            {
                heap.Sync(syncTimeout);
            }
            catch (Exception e)
            {
                failure = e;
            }

            // Read on the Sync's thread as it ends: what it returned (or gave up) with.
            frontier = heap.DurableFrontier;
        });

        bool? endedInsideTheCycle = null;
        if (holdAtTheFrontier)
        {
            heap.FrontierMovedForTesting = moved =>
            {
                if (moved >= target)
                {
                    endedInsideTheCycle ??= syncer.Join(TimeSpan.FromSeconds(5));
                }
            };
        }

        bool endedWhileHeld;
        Monitor.Enter(heap.CycleGateForTesting);
        try
        {
            syncer.Start();
            Assert.True(waiting.Wait(TimeSpan.FromSeconds(30)), "the Sync never waited for the gate");
            Assert.True(heap.AdvanceVersion(TimeSpan.FromSeconds(30)) >= target);
            endedWhileHeld = holdAtTheFrontier || syncer.Join(TimeSpan.FromSeconds(30));
        }
        finally
        {
            Monitor.Exit(heap.CycleGateForTesting);
        }

        Assert.True(endedWhileHeld, "the Sync did not end while the other thread kept the gate (neither returned nor timed out)");
        Assert.True(syncer.Join(TimeSpan.FromSeconds(30)), "the Sync did not end once the gate was free");
        return (failure, target, frontier, endedInsideTheCycle);
    }
}
