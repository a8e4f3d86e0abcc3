using System;
using System.Linq;
using System.Threading;
using Xunit;

namespace Epvs.Tests;

/// <summary>The LightEpoch API on its own: protection, deferred actions, guards, growth, snapshots.</summary>
public class LightEpochTests
{
    [Fact]
    public void BumpWithAction_NobodyProtected_RunsBeforeReturning()
    {
        using var epoch = new LightEpoch();
        int ran = 0;
        long prior = epoch.BumpCurrentEpoch(() => ran = 1);
        Assert.Equal(1, ran);
        Assert.Equal(prior + 1, epoch.CurrentEpoch);
        Assert.True(epoch.SafeToReclaimEpoch >= prior);
    }

    [Fact]
    public void BumpWithAction_ThreadProtected_RunsWhenItLeavesOrRefreshes()
    {
        using var epoch = new LightEpoch();
        int ran = 0;
        using (var parked = new ParkedThread(epoch.Resume, epoch.Suspend))
        {
            epoch.BumpCurrentEpoch(() => ran++);
            epoch.BumpCurrentEpoch();
            Assert.Equal(0, ran);
        }
        Assert.Equal(1, ran);

        int second = 0;
        using (var parked = new ParkedThread(epoch.Resume, epoch.Suspend, whileInside: () =>
        {
            epoch.ProtectAndDrain(); // refreshing past the action's epoch runs it, still inside protection
            Assert.Equal(1, Volatile.Read(ref second));
        }))
        {
            epoch.BumpCurrentEpoch(() => Interlocked.Increment(ref second));
            Assert.Equal(0, Volatile.Read(ref second));
        }
        Assert.Equal(1, second);
    }

    [Fact]
    public void Actions_RunInEpochOrderOfSafety_OldOnesNotHeldByNewProtection()
    {
        using var epoch = new LightEpoch();
        int first = 0, second = 0;
        var parked = new ParkedThread(epoch.Resume, epoch.Suspend);
        epoch.BumpCurrentEpoch(() => first = 1);
        // A thread protected after the first bump does not hold the first action back.
        using (new ParkedThread(epoch.Resume, epoch.Suspend))
        {
            epoch.BumpCurrentEpoch(() => second = 1);
            parked.Release();
            Assert.Equal(1, first);
            Assert.Equal(0, second);
        }
        Assert.Equal(1, second);
        parked.Dispose();
    }

    [Fact]
    public void EnterScope_ProtectsUntilDisposed()
    {
        using var epoch = new LightEpoch();
        using (epoch.EnterScope())
        {
            Assert.True(epoch.ThisInstanceProtected());
            using (epoch.EnterScope())
                Assert.True(epoch.ThisInstanceProtected());
            Assert.True(epoch.ThisInstanceProtected());
        }
        Assert.False(epoch.ThisInstanceProtected());
    }

    [Fact]
    public void Protection_IsPerInstance()
    {
        using var a = new LightEpoch();
        using var b = new LightEpoch();
        a.Resume();
        Assert.True(a.ThisInstanceProtected());
        Assert.False(b.ThisInstanceProtected());
        Assert.Throws<InvalidOperationException>(b.Suspend);
        a.Suspend();
    }

    [Fact]
    public void Table_MoreThreadsThanSlots_Grows()
    {
        using var epoch = new LightEpoch(initialTableSize: 1);
        using var allIn = new CountdownEvent(40);
        using var leave = new ManualResetEventSlim();
        var threads = Enumerable.Range(0, 40).Select(i => GuardedThread.Start(() =>
        {
            epoch.Resume();
            allIn.Signal();
            Assert.True(leave.Wait(GuardedThread.DefaultTimeout));
            epoch.Suspend();
        })).ToArray();
        Assert.True(allIn.Wait(GuardedThread.DefaultTimeout));
        EpochTableSnapshot snapshot = epoch.GetSnapshot();
        Assert.Equal(40, snapshot.ProtectedThreads.Count);
        Assert.True(snapshot.TableCapacity >= 40);
        Assert.Equal(40, snapshot.ProtectedThreads.Select(t => t.ManagedThreadId).Distinct().Count());
        leave.Set();
        foreach (GuardedThread t in threads)
            t.Join();
        Assert.Empty(epoch.GetSnapshot().ProtectedThreads);
    }

    [Fact]
    public void Snapshot_ShowsParkedThreadAndPendingActions_InAReadableDump()
    {
        using var epoch = new LightEpoch();
        using var parked = new ParkedThread(epoch.Resume, epoch.Suspend);
        epoch.BumpCurrentEpoch(() => { });
        epoch.BumpCurrentEpoch(() => { });

        EpochTableSnapshot snapshot = epoch.GetSnapshot();
        EpochSlotInfo slot = Assert.Single(snapshot.ProtectedThreads);
        Assert.Equal(parked.ManagedThreadId, slot.ManagedThreadId);
        Assert.Equal(2, snapshot.PendingActionEpochs.Count);
        string dump = snapshot.ToString();
        Assert.Contains($"thread {parked.ManagedThreadId} at epoch {slot.Epoch}", dump);
        Assert.Contains("pending actions: 2", dump);
    }

    [Fact]
    public void ThreadRecords_ManyShortLivedInstances_DoNotLeakIds()
    {
        // Disposed instances give their ids back, so per-thread records stay small. Counted as distinct ids seen rather
        // than as the last id's size: tests running in parallel may hold any number of live instances (and ids) at the
        // moment, but without recycling each of the 1,000 instances would get an id of its own.
        var ids = new System.Collections.Generic.HashSet<int>();
        for (int i = 0; i < 1000; i++)
        {
            using var epoch = new LightEpoch();
            epoch.Resume();
            epoch.Suspend();
            ids.Add(epoch.DebugId);
        }
        Assert.True(ids.Count < 500, $"{ids.Count} distinct instance ids for 1,000 short-lived instances: ids are not recycled");
    }

    /// <summary>Inside a deferred action of an epoch (its drain), <see cref="LightEpoch.ThisInstanceDraining"/> is true for that epoch only, and false outside.</summary>
    [Fact]
    public void ThisInstanceDraining_IsTrueOnlyInsideADrainOfThatEpoch()
    {
        using var epoch = new LightEpoch();
        using var other = new LightEpoch();
        bool inside = false, otherInside = true;
        Assert.False(epoch.ThisInstanceDraining());
        epoch.BumpCurrentEpoch(() =>
        {
            inside = epoch.ThisInstanceDraining();
            otherInside = other.ThisInstanceDraining();
        });
        using (epoch.EnterScope())
        {
        }

        Assert.True(inside);
        Assert.False(otherInside);
        Assert.False(epoch.ThisInstanceDraining());
    }
}
