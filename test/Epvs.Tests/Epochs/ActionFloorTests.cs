using System;
using System.Threading;
using Xunit;

namespace Epvs.Tests;

/// <summary>
/// A deferred action runs in the drain of whichever thread leaves, refreshes, enters or bumps, and a drain made while
/// the thread is protected (its Refresh, its Enter, a bump inside its region) runs the action with that thread's
/// protection in place. An action that called Leave with no Enter of its own (a misuse) then ended the region of the
/// thread running it, silently: the thread went on as if inside its region while critical sections could run (G1),
/// and the misuse surfaced only at the thread's own Leave. Such a Leave is now refused like any unbalanced one
/// (reported through DeferredActionFailed), and the thread keeps its region. The control
/// (<see cref="LightEpoch.LeaveBelowActionFloorForTesting"/>) lets it through. A blocking start from such an action is
/// refused as before (it would wait for the thread running it), now with a message that says why.
/// </summary>
[Collection(nameof(ActionFloorTests))]
public sealed class ActionFloorTests
{
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void AnActionsUnbalancedLeave_RunByAProtectedThreadsRefresh_IsRefused_AndTheThreadKeepsItsRegion(bool control)
    {
        using var scheme = new EpochProtectedVersionScheme();
        Exception? failed = null;
        scheme.Epoch.DeferredActionFailed += (_, e) => failed = e.Exception;
        bool protectedAfterRefresh = false;
        Exception? ownLeave = null;
        LightEpoch.LeaveBelowActionFloorForTesting = control;
        try
        {
            GuardedThread thread = GuardedThread.Start(() =>
            {
                scheme.Enter();
                scheme.Epoch.BumpCurrentEpoch(() => scheme.Leave()); // the misuse: a Leave with no Enter of its own
                scheme.Refresh(); // runs the action (it is safe once this thread refreshed past its epoch)
                protectedAfterRefresh = scheme.Epoch.ThisInstanceProtected();
                ownLeave = Record.Exception(scheme.Leave);
            });
            thread.Join();
        }
        finally
        {
            LightEpoch.LeaveBelowActionFloorForTesting = false;
        }

        if (control)
        {
            // The old behaviour: the action's Leave ended the thread's region; its own Leave then failed.
            Assert.False(protectedAfterRefresh);
            Assert.NotNull(ownLeave);
            return;
        }

        Assert.Contains("inside a deferred action", Assert.IsType<InvalidOperationException>(failed).Message, StringComparison.Ordinal);
        Assert.True(protectedAfterRefresh, "the action's Leave ended the region of the thread that ran it");
        Assert.Null(ownLeave);
        Assert.False(scheme.Epoch.ThisInstanceProtected());
    }

    [Fact]
    public void AnAction_ThatEntersAndLeaves_RunByAProtectedThreadsRefresh_Works()
    {
        using var scheme = new EpochProtectedVersionScheme();
        Exception? failed = null;
        scheme.Epoch.DeferredActionFailed += (_, e) => failed = e.Exception;
        int ran = 0;
        GuardedThread thread = GuardedThread.Start(() =>
        {
            scheme.Enter();
            scheme.Epoch.BumpCurrentEpoch(() =>
            {
                scheme.Enter();
                scheme.Refresh();
                scheme.Leave();
                ran++;
            });
            scheme.Refresh();
            Assert.True(scheme.Epoch.ThisInstanceProtected());
            scheme.Leave();
        });
        thread.Join();
        Assert.Null(failed);
        Assert.Equal(1, ran);
    }

    /// <summary>A blocking start from an action run by a protected thread's Refresh is refused (it would wait for that
    /// thread), with a message that names the deferred action instead of advising a Leave the action cannot make; run by
    /// the thread's Leave (unprotected), it completes.</summary>
    [Theory]
    [InlineData(true)]
    [InlineData(false)]
    public void ABlockingStartFromAnAction_SaysWhyWhenAProtectedThreadRunsIt(bool viaRefresh)
    {
        using var scheme = new EpochProtectedVersionScheme();
        Exception? failed = null;
        scheme.Epoch.DeferredActionFailed += (_, e) => failed = e.Exception;
        bool? result = null;
        GuardedThread thread = GuardedThread.Start(() =>
        {
            scheme.Enter();
            scheme.Epoch.BumpCurrentEpoch(() => result = scheme.AdvanceVersionWithCriticalSection((_, _) => { }, spin: true));
            if (viaRefresh)
            {
                scheme.Refresh();
            }

            scheme.Leave();
        });
        thread.Join();
        if (!viaRefresh)
        {
            Assert.Null(failed);
            Assert.True(result);
            return;
        }

        InvalidOperationException e = Assert.IsType<InvalidOperationException>(failed);
        Assert.Contains("from a deferred action that a protected thread runs", e.Message, StringComparison.Ordinal);
        Assert.DoesNotContain("Call Leave() first", e.Message, StringComparison.Ordinal);
    }

    /// <summary>
    /// The same misuse with a Refresh (a review's finding): a protected thread requests a transition, whose critical
    /// section waits for the thread to leave or refresh (G5); the request's drain runs another thread's action that calls
    /// Refresh with no Enter of its own, at the requester's level, which moved the requester's region on under it: the
    /// critical section ran while the requester was inside its region (G1). Refused now, like the Leave.
    /// </summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void AnActionsRefreshAtTheRunningThreadsLevel_IsRefused_AndNoCriticalSectionRunsInsideItsRegion(bool control)
    {
        using var scheme = new EpochProtectedVersionScheme();
        LightEpoch e = scheme.Epoch;
        using var wGate = new ManualResetEventSlim();
        using var wStarted = new ManualResetEventSlim();
        using var uRegistered = new ManualResetEventSlim();
        using var tEntered = new ManualResetEventSlim();
        bool tInside = false, csInsideT = false, xRan = false;
        Exception? failed = null;
        e.DeferredActionFailed += (_, ev) => failed ??= ev.Exception;
        LightEpoch.LeaveBelowActionFloorForTesting = control;
        try
        {
            // U registers W (blocks in U's own drain once U leaves) and X (the misuse), both held back by U until it leaves.
            GuardedThread u = GuardedThread.Start(() =>
            {
                scheme.Enter();
                e.BumpCurrentEpoch(() =>
                {
                    wStarted.Set();
                    wGate.Wait(TimeSpan.FromSeconds(30));
                });
                e.BumpCurrentEpoch(() =>
                {
                    xRan = true;
                    scheme.Refresh();
                });
                uRegistered.Set();
                tEntered.Wait(TimeSpan.FromSeconds(30));
                scheme.Leave();
            });
            Assert.True(uRegistered.Wait(TimeSpan.FromSeconds(30)));

            // T, inside its region, requests a transition while W blocks U: the request's drain runs X on T.
            GuardedThread t = GuardedThread.Start(() =>
            {
                scheme.Enter();
                Volatile.Write(ref tInside, true);
                tEntered.Set();
                wStarted.Wait(TimeSpan.FromSeconds(30));
                scheme.TryAdvanceVersionWithCriticalSection((_, _) => csInsideT |= Volatile.Read(ref tInside));
                Volatile.Write(ref tInside, false);
                scheme.Leave();
            });
            t.Join();
            wGate.Set();
            u.Join();
        }
        finally
        {
            LightEpoch.LeaveBelowActionFloorForTesting = false;
            wGate.Set();
        }

        Assert.True(xRan);
        if (control)
        {
            Assert.True(csInsideT, "the control's critical section did not run inside the requester's region");
            return;
        }

        Assert.False(csInsideT, "a critical section ran inside the requester's region");
        Assert.Contains("Refresh (ProtectAndDrain) was called inside a deferred action", Assert.IsType<InvalidOperationException>(failed).Message, StringComparison.Ordinal);
    }

    /// <summary>Nested drains restore the outer floor: an action that enters, refreshes (a nested drain whose floor is its
    /// own level) and leaves still has its unbalanced Leave refused afterwards.</summary>
    [Fact]
    public void ANestedDrain_RestoresTheOuterFloor()
    {
        using var e = new LightEpoch();
        var faults = new System.Collections.Generic.List<Exception>();
        e.DeferredActionFailed += (_, ev) => faults.Add(ev.Exception);
        int innerRan = 0;
        bool protectedAfter = false;
        GuardedThread t = GuardedThread.Start(() =>
        {
            e.Resume();
            e.BumpCurrentEpoch(() =>
            {
                e.Resume();
                e.BumpCurrentEpoch(() =>
                {
                    e.Resume();
                    e.Suspend();
                    innerRan++;
                });
                e.ProtectAndDrain();
                e.Suspend();
                e.Suspend(); // unbalanced: refused (the floor is 1 again)
            });
            e.ProtectAndDrain();
            protectedAfter = e.ThisInstanceProtected();
            e.Suspend();
        });
        t.Join();
        Assert.True(protectedAfter);
        Assert.Single(faults);
        Assert.Equal(1, innerRan);
    }
}
