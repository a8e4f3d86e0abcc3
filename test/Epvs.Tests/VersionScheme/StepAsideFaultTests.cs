using System;
using System.Threading;
using Xunit;

namespace Epvs.Tests;

/// <summary>
/// G6/G8: a Refresh never comes back from stepping aside without its region. It used to free its epoch slot while it
/// waited for a transition and claim one again to come back; when other threads had taken every slot meanwhile, the claim
/// had to grow the table, and an OutOfMemoryException there made the Refresh throw with its region gone: its caller's
/// Leave then threw "not protected" (hiding the failure), and an outer region's guarantees were lost. Now the slot stays
/// the thread's while it waits (marked as holding nothing back), and coming back is one exchange on it: nothing to
/// allocate, nothing to lose. Deterministic: the Refresh waits in a test hook while a third thread takes what is free
/// and the table's growth fails from then on.
/// </summary>
public class StepAsideFaultTests
{
    /// <summary>
    /// A two-slot epoch: a region (slot 1) and a holder (slot 2) hold a transition back. The region refreshes and steps
    /// aside; a third thread then resumes (taking slot 1 if it is free, else failing to grow the table); the holder
    /// refreshes, which runs the critical section; the region comes back. Returns what the Refresh threw, whether its
    /// thread was protected after it, what its Leave threw, and whether the epoch could be disposed at the end.
    /// </summary>
    private static (Exception? Refresh, bool ProtectedAfter, Exception? Leave, bool Disposed) RefreshComingBackToAFullTable(bool legacy)
    {
        var epoch = new LightEpoch(initialTableSize: 2) { LegacyStepAsideForTesting = legacy };
        var scheme = new EpochProtectedVersionScheme(epoch);
        TimeSpan timeout = GuardedThread.DefaultTimeout;
        using var entered = new ManualResetEventSlim();
        using var go = new ManualResetEventSlim();
        using var aside = new ManualResetEventSlim();
        using var comeBack = new ManualResetEventSlim();
        using var holderIn = new ManualResetEventSlim();
        using var holderRefresh = new ManualResetEventSlim();
        using var holderRefreshed = new ManualResetEventSlim();
        using var holderLeave = new ManualResetEventSlim();
        using var thirdTried = new ManualResetEventSlim();
        using var thirdLeave = new ManualResetEventSlim();
        Exception? refresh = null, leave = null, third = null;
        bool protectedAfter = false;
        int growthFails = 0;
        EpochSlotTable.GrowHookForTesting = () =>
        {
            if (Volatile.Read(ref growthFails) != 0)
                throw new OutOfMemoryException("simulated: growing the epoch table");
        };
        scheme.AfterStepAsideHookForTesting = () =>
        {
            scheme.AfterStepAsideHookForTesting = null;
            aside.Set();
            Assert.True(comeBack.Wait(timeout), "the stepped-aside Refresh was never let come back");
        };
        try
        {
            var region = GuardedThread.Start(() =>
            {
                scheme.Enter();
                entered.Set();
                Assert.True(go.Wait(timeout));
                refresh = Record.Exception(() => scheme.Refresh());
                protectedAfter = epoch.ThisInstanceProtected();
                leave = Record.Exception(scheme.Leave);
            }, "region");
            Assert.True(entered.Wait(timeout));
            var holder = GuardedThread.Start(() =>
            {
                scheme.Enter();
                holderIn.Set();
                Assert.True(holderRefresh.Wait(timeout));
                scheme.Refresh(); // lets the transition through, and stays protected (slot 2 stays taken)
                holderRefreshed.Set();
                Assert.True(holderLeave.Wait(timeout));
                scheme.Leave();
            }, "holder");
            Assert.True(holderIn.Wait(timeout));

            Assert.Equal(StateMachineExecutionStatus.Ok, scheme.TryAdvanceVersionWithCriticalSection((_, _) => { }));
            go.Set();
            Assert.True(aside.Wait(timeout), "the Refresh never stepped aside");
            Volatile.Write(ref growthFails, 1);
            var other = GuardedThread.Start(() =>
            {
                third = Record.Exception(epoch.Resume); // a free slot, or a growth that fails: either is fine for it
                thirdTried.Set();
                Assert.True(thirdLeave.Wait(timeout));
                if (third is null)
                    epoch.Suspend();
            }, "third");
            Assert.True(thirdTried.Wait(timeout));
            holderRefresh.Set();
            Assert.True(holderRefreshed.Wait(timeout));
            Assert.Equal(2, scheme.CurrentState.Version);
            comeBack.Set();
            region.Join();
            Volatile.Write(ref growthFails, 0);
            thirdLeave.Set();
            other.Join();
            holderLeave.Set();
            holder.Join();
        }
        finally
        {
            EpochSlotTable.GrowHookForTesting = null;
            scheme.AfterStepAsideHookForTesting = null;
        }
        bool disposed = epoch.TryDispose();
        return (refresh, protectedAfter, leave, disposed);
    }

    [Fact]
    public void Refresh_ComingBackWhenEverySlotIsTakenAndTheTableCannotGrow_KeepsItsRegion()
    {
        (Exception? refresh, bool protectedAfter, Exception? leave, bool disposed) = RefreshComingBackToAFullTable(legacy: false);
        Assert.Null(refresh);
        Assert.True(protectedAfter, "the Refresh came back without its region");
        Assert.Null(leave);
        Assert.True(disposed, "a slot is still held after every thread left");
    }

    [Fact]
    public void Refresh_ComingBackWhenEverySlotIsTakenAndTheTableCannotGrow_LosesItsRegion_Control()
    {
        // The behaviour before: the slot was freed while aside, taken by another thread, and the claim to come back failed.
        (Exception? refresh, bool protectedAfter, Exception? leave, bool disposed) = RefreshComingBackToAFullTable(legacy: true);
        Assert.IsType<OutOfMemoryException>(refresh);
        Assert.False(protectedAfter);
        Assert.IsType<InvalidOperationException>(leave);
        Assert.True(disposed);
    }

    /// <summary>
    /// A region starts a transition, which waits for it and for a parked thread; its Refresh steps aside, and the wait
    /// fails there (a test hook throws, standing for a drain that runs out of memory while the thread is aside: an
    /// interrupt no longer breaks that wait). Returns what the Refresh threw, whether the thread is still protected after
    /// it, and what its Leave threw.
    /// </summary>
    private static (Exception? Refresh, bool ProtectedAfterFailedRefresh, Exception? Leave) FailSteppedAsideRefresh()
    {
        using var scheme = new EpochProtectedVersionScheme();
        bool protectedAfter = false;
        Exception? failure = null, leave = null;
        scheme.AfterStepAsideHookForTesting = () => throw new OutOfMemoryException("simulated: a drain while stepped aside");
        using (var parked = new ParkedThread(() => scheme.Enter(), scheme.Leave))
        {
            GuardedThread.Start(() =>
            {
                scheme.Enter();
                Assert.Equal(StateMachineExecutionStatus.Ok, scheme.TryAdvanceVersionWithCriticalSection((_, _) => { }));
                failure = Record.Exception(() => scheme.Refresh());
                protectedAfter = scheme.Epoch.ThisInstanceProtected();
                leave = Record.Exception(scheme.Leave);
            }, "refresh").Join();
        }
        Assert.Equal(2, scheme.CurrentState.Version);
        return (failure, protectedAfter, leave);
    }

    [Fact]
    public void Refresh_WhoseWaitFailsWhileSteppedAside_ThrowsThatFailure_AndKeepsTheRegionEntered()
    {
        (Exception? refresh, bool stillProtected, Exception? leave) = FailSteppedAsideRefresh();
        Assert.IsType<OutOfMemoryException>(refresh);
        Assert.True(stillProtected, "the failed Refresh left the region its caller is still in");
        Assert.Null(leave);
    }

    [Fact]
    public void Refresh_WhoseWaitFailsWhileSteppedAside_LeavesTheRegion_Control()
    {
        // The behaviour before: the region was gone, and the caller's Leave threw "not protected", hiding the failure.
        EpochProtectedVersionScheme.LegacyFailedWaitForTesting = true;
        try
        {
            (Exception? refresh, bool stillProtected, Exception? leave) = FailSteppedAsideRefresh();
            Assert.IsType<OutOfMemoryException>(refresh);
            Assert.False(stillProtected);
            Assert.IsType<InvalidOperationException>(leave);
        }
        finally
        {
            EpochProtectedVersionScheme.LegacyFailedWaitForTesting = false;
        }
    }
}
