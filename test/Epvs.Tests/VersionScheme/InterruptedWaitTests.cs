using System;
using System.Threading;
using Xunit;

namespace Epvs.Tests;

/// <summary>
/// G1/G2/G6/G8: an Enter or Refresh whose wait is interrupted (<see cref="Thread.Interrupt"/>, which SpinWait's sleeps
/// surface as <see cref="ThreadInterruptedException"/>: the asynchronous failure .NET has instead of thread aborts) leaves
/// protection as its caller expects. A nested Enter that throws has added no level (its caller will not Leave). An
/// outermost Refresh, stepped aside from its region while it waits, is not interrupted at all: coming back early would put
/// its region inside a transition that no longer waits for it, so it returns after the transition and the interrupt stays
/// pending. Nor is an outermost Enter that waits for a Dispose deciding whether the epoch can close: the epoch may stay
/// live. Deterministic: the interrupt is requested on the waiting thread itself before the call, and a parked thread holds
/// the transition (or the Dispose's decision) back, so the wait spins until the interrupt surfaces.
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
    /// A region starts a transition, which waits for it and for a holder (a parked thread); the region's Refresh, with an
    /// interrupt pending, steps aside. The holder is let go once the Refresh has taken 200 turns of its wait (far more than
    /// SpinWait takes to sleep, about 15, where an interruptible wait throws: a bound, not a timing) or has returned,
    /// whichever comes first; its Leave runs the critical section, which records whether the region after the Refresh was
    /// open. Returns what the Refresh threw, the state it returned, whether the critical section ran inside the region,
    /// whether the thread was protected after the Refresh, and whether the interrupt was still pending then.
    /// </summary>
    private static (Exception? Refresh, VersionSchemeState Returned, bool Overlap, bool ProtectedAfter, bool InterruptPending) InterruptSteppedAsideRefresh(bool interruptible)
    {
        using var scheme = new EpochProtectedVersionScheme { InterruptibleStepAsideWaitForTesting = interruptible };
        using var letHolderGo = new ManualResetEventSlim();
        using var leave = new ManualResetEventSlim();
        int regionOpen = 0, turns = 0;
        bool overlap = false, protectedAfter = false, interruptPending = false;
        Exception? refresh = null;
        VersionSchemeState returned = default;
        scheme.SteppedAsideWaitHookForTesting = () =>
        {
            if (++turns == 200)
                letHolderGo.Set();
        };
        using (var holder = new ParkedThread(() => scheme.Enter(), scheme.Leave))
        {
            var refresher = GuardedThread.Start(() =>
            {
                scheme.Enter();
                Volatile.Write(ref regionOpen, 1);
                Assert.Equal(StateMachineExecutionStatus.Ok, scheme.TryAdvanceVersionWithCriticalSection((_, _) => overlap = Volatile.Read(ref regionOpen) != 0));
                Thread.CurrentThread.Interrupt();
                Volatile.Write(ref regionOpen, 0); // the Refresh ends the region that observed version 1 ...
                refresh = Record.Exception(() => returned = scheme.Refresh());
                Volatile.Write(ref regionOpen, 1); // ... and its caller is inside the next one from here, thrown or not
                protectedAfter = scheme.Epoch.ThisInstanceProtected();
                interruptPending = PendingInterrupt.TryConsume(); // consumed, so it cannot hit the wait below
                letHolderGo.Set(); // the Refresh came back before 200 turns
                Assert.True(leave.Wait(GuardedThread.DefaultTimeout), "never let leave");
                Volatile.Write(ref regionOpen, 0);
                scheme.Leave();
            }, "refresh");
            Assert.True(letHolderGo.Wait(GuardedThread.DefaultTimeout), "the Refresh neither waited nor returned");
            holder.Release(); // its Leave runs the critical section: nobody else holds it back any more
            leave.Set();
            refresher.Join();
        }
        Assert.Equal(VersionSchemeState.Make(VersionSchemeState.Rest, 2), scheme.CurrentState);
        return (refresh, returned, overlap, protectedAfter, interruptPending);
    }

    [Fact]
    public void Refresh_InterruptedWhileSteppedAside_ReturnsAfterTheTransition_AndKeepsTheInterruptPending()
    {
        (Exception? refresh, VersionSchemeState returned, bool overlap, bool stillProtected, bool interruptPending) = InterruptSteppedAsideRefresh(interruptible: false);
        Assert.Null(refresh);
        Assert.Equal(VersionSchemeState.Make(VersionSchemeState.Rest, 2), returned);
        Assert.False(overlap, "the critical section ran inside the region the interrupted Refresh came back to (G1)");
        Assert.True(stillProtected);
        Assert.True(interruptPending, "the interrupt was swallowed instead of kept for the thread's next wait");
    }

    [Fact]
    public void Refresh_InterruptedWhileSteppedAside_ComingBackEarly_OverlapsTheCriticalSection_Control()
    {
        // The behaviour before: the wait threw, and the Refresh came back into its region (announcing the current epoch,
        // which the pending step does not wait for) and rethrew; the critical section then ran inside that region.
        (Exception? refresh, _, bool overlap, bool stillProtected, _) = InterruptSteppedAsideRefresh(interruptible: true);
        Assert.IsType<ThreadInterruptedException>(refresh);
        Assert.True(stillProtected);
        Assert.True(overlap);
    }

    /// <summary>
    /// An outermost Enter on an epoch whose Dispose is deciding (it marked every free slot and checks whether a thread is
    /// protected; a holder is, so it will give up) waits for that Dispose in Resume's slow path, with an interrupt
    /// pending. The Dispose is let decide once the wait has taken 200 turns (far more than SpinWait takes to sleep, about
    /// 15: a bound, not a timing), or once the Enter has returned. Returns what the Enter threw, whether the thread was
    /// protected after it, whether the interrupt was still pending then, how many turns the wait took, and what the
    /// Dispose threw.
    /// </summary>
    private static (Exception? Enter, bool ProtectedAfter, bool InterruptPending, int Turns, Exception? Dispose) InterruptEnterWhileADisposeDecides()
    {
        var epoch = new LightEpoch();
        var scheme = new EpochProtectedVersionScheme(epoch);
        using var closing = new ManualResetEventSlim();
        using var decide = new ManualResetEventSlim();
        Exception? enter = null, dispose = null;
        bool protectedAfter = false, interruptPending = false;
        int turns = 0;
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
        using (var holder = new ParkedThread(() => scheme.Enter(), scheme.Leave))
        {
            var disposer = GuardedThread.Start(() => dispose = Record.Exception(epoch.Dispose), "dispose");
            Assert.True(closing.Wait(GuardedThread.DefaultTimeout), "the Dispose never marked the slots");
            GuardedThread.Start(() =>
            {
                Thread.CurrentThread.Interrupt();
                enter = Record.Exception(() => scheme.Enter()); // its first: no slot yet, so Resume's slow path
                decide.Set(); // the Enter came back before 200 turns
                protectedAfter = epoch.ThisInstanceProtected();
                interruptPending = PendingInterrupt.TryConsume(); // consumed, so it cannot hit a later wait of this thread
                if (protectedAfter)
                    scheme.Leave();
            }, "enter").Join();
            disposer.Join();
        }
        epoch.ClosingHookForTesting = null;
        epoch.WaitWhileClosingHookForTesting = null;
        epoch.Dispose(); // nobody is protected any more
        return (enter, protectedAfter, interruptPending, turns, dispose);
    }

    [Fact]
    public void Enter_InterruptedWhileADisposeDecides_WaitsForItAndEnters_AndKeepsTheInterruptPending()
    {
        (Exception? enter, bool stillProtected, bool interruptPending, int turns, Exception? dispose) = InterruptEnterWhileADisposeDecides();
        Assert.True(turns >= 200, $"the Enter never waited in Resume's Closing wait ({turns} turns)");
        Assert.Null(enter);
        Assert.True(stillProtected, "the Enter returned without its region");
        Assert.True(interruptPending, "the interrupt was swallowed instead of kept for the thread's next wait");
        Assert.IsType<InvalidOperationException>(dispose); // the holder is protected: the Dispose gives up, the epoch stays live
    }

    [Fact]
    public void Enter_InterruptedWhileADisposeDecides_InterruptibleWait_FailsOnALiveEpoch_Control()
    {
        // A plain SpinWait in Resume's Closing wait: the interrupt fails the Enter, although the epoch stays live.
        LightEpoch.InterruptibleClosingWaitForTesting = true;
        try
        {
            (Exception? enter, bool stillProtected, _, int turns, Exception? dispose) = InterruptEnterWhileADisposeDecides();
            Assert.InRange(turns, 1, 199);
            Assert.IsType<ThreadInterruptedException>(enter);
            Assert.False(stillProtected);
            Assert.IsType<InvalidOperationException>(dispose);
        }
        finally
        {
            LightEpoch.InterruptibleClosingWaitForTesting = false;
        }
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
