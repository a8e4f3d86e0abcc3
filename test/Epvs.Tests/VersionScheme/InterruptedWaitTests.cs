using System;
using System.Threading;
using Xunit;

namespace Epvs.Tests;

/// <summary>
/// G6/G8: an Enter or Refresh whose wait for a transition fails part-way (here <see cref="Thread.Interrupt"/>, which
/// SpinWait's sleeps surface as <see cref="ThreadInterruptedException"/>: the asynchronous failure .NET has instead of
/// thread aborts) leaves protection as its caller expects. An Enter that throws has added no level (its caller will not
/// Leave); a Refresh that throws keeps its region entered (its caller will Leave), as for ObjectDisposedException.
/// Deterministic: the interrupt is requested on the waiting thread itself before the call, and a parked thread holds
/// the transition back, so the wait spins until the interrupt surfaces.
/// </summary>
public class InterruptedWaitTests
{
    /// <summary>
    /// A region of scheme A, entered after B's transition was published, nests an Enter of B (same epoch) that waits
    /// for that transition, which a parked thread holds back; the wait is interrupted. Returns the thread's depth
    /// after the failed Enter and whether it is still protected after leaving A's region.
    /// </summary>
    private static (int DepthAfterFailedEnter, bool ProtectedAfterOuterLeave) InterruptNestedEnter()
    {
        using var epoch = new LightEpoch();
        var outer = new EpochProtectedVersionScheme(epoch);
        var inner = new EpochProtectedVersionScheme(epoch);
        int depthAfter = -1;
        bool protectedAfter = false;
        Exception? failure = null;
        using (var parked = new ParkedThread(() => inner.Enter(), inner.Leave))
        {
            Assert.Equal(StateMachineExecutionStatus.Ok, inner.TryAdvanceVersionWithCriticalSection((_, _) => { }));
            Assert.True(inner.CurrentState.IsIntermediate);
            GuardedThread.Start(() =>
            {
                outer.Enter(); // announced after the step's bump: the step does not wait for this thread, the nested Enter waits for it
                Thread.CurrentThread.Interrupt(); // surfaces at the wait's first interruptible point
                failure = Record.Exception(() => inner.Enter());
                depthAfter = epoch.ProtectionDepth;
                outer.Leave();
                protectedAfter = epoch.ThisInstanceProtected();
                while (epoch.ThisInstanceProtected())
                    epoch.Suspend(); // the stranded level (control): give it back so the test can end
            }, "nested enter").Join();
        }
        Assert.IsType<ThreadInterruptedException>(failure);
        Assert.Equal(2, inner.CurrentState.Version); // the parked thread's Leave ran the step
        return (depthAfter, protectedAfter);
    }

    [Fact]
    public void NestedEnter_WhoseWaitIsInterrupted_AddsNoLevel()
    {
        (int depth, bool stillProtected) = InterruptNestedEnter();
        Assert.Equal(1, depth);
        Assert.False(stillProtected, "the thread stayed protected after leaving its only region: every transition would wait for it for ever");
    }

    [Fact]
    public void NestedEnter_WhoseWaitIsInterrupted_KeepsItsLevel_Control()
    {
        // The behaviour before: the failed Enter kept the level it added, so the thread stayed protected.
        EpochProtectedVersionScheme.LegacyFailedWaitForTesting = true;
        try
        {
            (int depth, bool stillProtected) = InterruptNestedEnter();
            Assert.Equal(2, depth);
            Assert.True(stillProtected);
        }
        finally
        {
            EpochProtectedVersionScheme.LegacyFailedWaitForTesting = false;
        }
    }

    /// <summary>
    /// A region starts a transition, which waits for it and for a parked thread; its Refresh steps aside and the wait is
    /// interrupted. Returns whether the thread is still protected after the failed Refresh and what its Leave threw.
    /// </summary>
    private static (bool ProtectedAfterFailedRefresh, Exception? Leave) InterruptSteppedAsideRefresh()
    {
        using var scheme = new EpochProtectedVersionScheme();
        bool protectedAfter = false;
        Exception? failure = null, leave = null;
        using (var parked = new ParkedThread(() => scheme.Enter(), scheme.Leave))
        {
            GuardedThread.Start(() =>
            {
                scheme.Enter();
                Assert.Equal(StateMachineExecutionStatus.Ok, scheme.TryAdvanceVersionWithCriticalSection((_, _) => { }));
                Thread.CurrentThread.Interrupt();
                failure = Record.Exception(() => scheme.Refresh());
                protectedAfter = scheme.Epoch.ThisInstanceProtected();
                leave = Record.Exception(scheme.Leave);
            }, "refresh").Join();
        }
        Assert.IsType<ThreadInterruptedException>(failure);
        Assert.Equal(2, scheme.CurrentState.Version);
        return (protectedAfter, leave);
    }

    [Fact]
    public void Refresh_WhoseWaitIsInterruptedWhileSteppedAside_KeepsTheRegionEntered()
    {
        (bool stillProtected, Exception? leave) = InterruptSteppedAsideRefresh();
        Assert.True(stillProtected, "the failed Refresh left the region its caller is still in");
        Assert.Null(leave);
    }

    [Fact]
    public void Refresh_WhoseWaitIsInterruptedWhileSteppedAside_LeavesTheRegion_Control()
    {
        // The behaviour before: the region was gone, and the caller's Leave threw "not protected", hiding the failure.
        EpochProtectedVersionScheme.LegacyFailedWaitForTesting = true;
        try
        {
            (bool stillProtected, Exception? leave) = InterruptSteppedAsideRefresh();
            Assert.False(stillProtected);
            Assert.IsType<InvalidOperationException>(leave);
        }
        finally
        {
            EpochProtectedVersionScheme.LegacyFailedWaitForTesting = false;
        }
    }

    /// <summary>
    /// A Refresh stepped aside for a transition comes back while a Dispose of its (shared) epoch is deciding: its slot is
    /// marked, so its Resume waits for the Dispose, which finds it counted as stepped aside and gives up. That wait is
    /// interrupted. Returns what the Refresh threw, whether the thread is still protected after it, what its Leave and
    /// the Dispose threw, and whether the interrupt was still pending after the Refresh.
    /// </summary>
    private static (Exception? Refresh, bool ProtectedAfter, Exception? Leave, Exception? Dispose, bool InterruptPending) InterruptComeBackWhileDisposeDecides()
    {
        var epoch = new LightEpoch();
        var scheme = new EpochProtectedVersionScheme(epoch);
        using var aside = new ManualResetEventSlim();
        using var comeBack = new ManualResetEventSlim();
        using var closing = new ManualResetEventSlim();
        using var decide = new ManualResetEventSlim();
        Exception? refresh = null, leave = null, dispose = null;
        bool protectedAfter = false, interruptPending = false;
        int turns = 0;
        scheme.AfterStepAsideHookForTesting = () =>
        {
            scheme.AfterStepAsideHookForTesting = null;
            aside.Set();
            Assert.True(comeBack.Wait(GuardedThread.DefaultTimeout), "never let come back");
            Thread.CurrentThread.Interrupt(); // surfaces at the thread's next interruptible wait
        };
        // Far more turns than SpinWait takes to sleep (about 15): then let the Dispose decide. A bound, not a timing.
        epoch.WaitWhileClosingHookForTesting = () =>
        {
            if (++turns == 200)
                decide.Set();
        };
        epoch.ClosingHookForTesting = () =>
        {
            closing.Set();
            Assert.True(decide.Wait(GuardedThread.DefaultTimeout), "the Dispose was never let decide");
        };
        GuardedThread refresher;
        using (var parked = new ParkedThread(() => scheme.Enter(), scheme.Leave))
        {
            refresher = GuardedThread.Start(() =>
            {
                scheme.Enter();
                Assert.Equal(StateMachineExecutionStatus.Ok, scheme.TryAdvanceVersionWithCriticalSection((_, _) => { }));
                refresh = Record.Exception(() => scheme.Refresh());
                decide.Set(); // if the Refresh threw before the Dispose decided
                protectedAfter = epoch.ThisInstanceProtected();
                interruptPending = PendingInterrupt.TryConsume(); // consumed, so it cannot hit a later wait of this thread
                leave = Record.Exception(scheme.Leave);
            }, "refresh");
            Assert.True(aside.Wait(GuardedThread.DefaultTimeout), "the Refresh never stepped aside");
        } // the parked thread leaves: the transition completes while the Refresh is stepped aside
        Assert.Equal(2, scheme.CurrentState.Version);
        var disposer = GuardedThread.Start(() => dispose = Record.Exception(epoch.Dispose), "dispose");
        Assert.True(closing.Wait(GuardedThread.DefaultTimeout), "the Dispose never marked the slots");
        comeBack.Set();
        refresher.Join();
        disposer.Join();
        epoch.ClosingHookForTesting = null;
        epoch.WaitWhileClosingHookForTesting = null;
        if (epoch.ThisInstanceProtected() is false)
            epoch.Dispose(); // the Refresh's region is left by now
        return (refresh, protectedAfter, leave, dispose, interruptPending);
    }

    [Fact]
    public void Refresh_InterruptedComingBackWhileADisposeDecides_KeepsTheRegionEntered()
    {
        (Exception? refresh, bool stillProtected, Exception? leave, Exception? dispose, bool interruptPending) = InterruptComeBackWhileDisposeDecides();
        Assert.Null(refresh);
        Assert.True(stillProtected, "the Refresh returned without its region");
        Assert.Null(leave);
        Assert.IsType<InvalidOperationException>(dispose); // the stepped-aside Refresh counts as protected
        Assert.True(interruptPending, "the interrupt was swallowed instead of kept for the thread's next wait");
    }

    [Fact]
    public void ExecuteStateMachineWithSpin_InterruptedWhileWaiting_Throws_AndTheMachineCarriesOn()
    {
        // Documented on ExecuteStateMachine: interrupted while it waits for its own machine, the call throws and the
        // machine, started, completes without the caller.
        using var scheme = new EpochProtectedVersionScheme();
        var machine = new CriticalSectionStateMachine((_, _) => { }, -1);
        Exception? failure = null;
        using (var parked = new ParkedThread(() => scheme.Enter(), scheme.Leave))
        {
            GuardedThread.Start(() =>
            {
                Thread.CurrentThread.Interrupt(); // the step waits for the parked thread: the wait spins until it surfaces
                failure = Record.Exception(() => scheme.ExecuteStateMachine(machine, spin: true));
            }, "executor").Join();
            Assert.IsType<ThreadInterruptedException>(failure);
            Assert.Equal(2, machine.ActualToVersion);
            Assert.False(machine.IsCompleted);
        }
        Assert.True(machine.Completion.Wait(GuardedThread.DefaultTimeout));
        Assert.Equal(VersionSchemeState.Make(VersionSchemeState.Rest, 2), scheme.CurrentState);
    }
}
