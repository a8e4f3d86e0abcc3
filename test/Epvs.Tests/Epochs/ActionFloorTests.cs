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
}
