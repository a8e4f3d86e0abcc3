using System;
using System.Threading;
using Xunit;

namespace Epvs.Tests;

/// <summary>
/// G7: a scheme's Dispose racing another Dispose and machine starts. The race is made deterministic by the epoch's
/// closing hook, which runs on the disposing thread while its Dispose has claimed the machine slot and may still fail.
/// </summary>
public class SchemeDisposeTests
{
    [Fact]
    public void WhileADisposeThatWillFailIsClosing_ASecondDisposeReturns_AStartRetries_AndTheSchemeStaysUsable()
    {
        var scheme = new EpochProtectedVersionScheme();
        // A protected thread: the epoch's Dispose finds it and reverts, so the scheme's Dispose fails.
        using var parked = new ParkedThread(() => scheme.Enter(), scheme.Leave);
        Exception? secondDispose = null;
        bool secondReturned = false;
        StateMachineExecutionStatus? startedMeanwhile = null;
        scheme.Epoch.ClosingHookForTesting = () =>
            GuardedThread.Start(() =>
            {
                // It used to carry on past the first Dispose's sentinel into the epoch's Dispose, which waits for the
                // first one to decide (a hang here, while the first waits for this thread).
                secondDispose = Record.Exception(scheme.Dispose);
                secondReturned = true;
                // It used to throw ObjectDisposedException although the scheme is not disposed (the Dispose fails).
                startedMeanwhile = scheme.TryAdvanceVersionWithCriticalSection((_, _) => { });
            }).Join();

        Assert.Throws<InvalidOperationException>(scheme.Dispose);
        scheme.Epoch.ClosingHookForTesting = null;
        Assert.True(secondReturned);
        Assert.Null(secondDispose);
        Assert.Equal(StateMachineExecutionStatus.Retry, startedMeanwhile);

        // The failed Dispose changed nothing: the scheme advances, and disposes once the thread has left.
        parked.Release();
        Assert.True(scheme.AdvanceVersionWithCriticalSection((_, _) => { }, spin: true));
        Assert.Equal(2, scheme.CurrentState.Version);
        scheme.Dispose();
        Assert.Throws<ObjectDisposedException>(() => scheme.Enter());

        // The last state, at rest (Dispose's own mark, which sends every Enter to its slow path, is not a transition).
        Assert.False(scheme.CurrentState.IsIntermediate);
        Assert.Equal(2, scheme.CurrentState.Version);
    }

    [Theory]
    [InlineData(false)]
    [InlineData(true)] // a second scheme on the owner's epoch: the owner's Dispose must count its Refresh too
    public void DisposeWhileARefreshStepsAside_Refuses_AndTheRefreshCarriesOn(bool onASharingScheme)
    {
        (Exception? dispose, Exception? refresh) = DisposeWhileARefreshStepsAside(legacyStepAside: false, onASharingScheme);
        Assert.IsType<InvalidOperationException>(dispose);
        Assert.Null(refresh);
    }

    [Fact]
    public void Control_RefreshAsideUncounted_IsCaught()
    {
        // The behaviour before: the epoch found the slot free and closed under the region, whose Refresh then threw.
        (Exception? dispose, Exception? refresh) = DisposeWhileARefreshStepsAside(legacyStepAside: true, onASharingScheme: false);
        Assert.Null(dispose);
        Assert.IsType<ObjectDisposedException>(refresh);
    }

    [Fact]
    public void AnEnterSteppedAside_WhenTheTransitionFailsAndTheSchemeIsDisposed_ThrowsInsteadOfWaitingForEver()
    {
        // An Enter steps aside on I(v); the critical section throws, so the state goes back to v; a handler of the fault
        // disposes the scheme, whose mark is I(v) again: the state the Enter waits to see change. It used to spin for
        // ever, unprotected. The order is fixed by the hook: all of it happens once the Enter has stepped aside.
        var scheme = new EpochProtectedVersionScheme();
        using var parked = new ParkedThread(() => scheme.Enter(), scheme.Leave);
        Exception? disposeInHandler = null;
        scheme.StateMachineFaulted += (_, _) => disposeInHandler = Record.Exception(scheme.Dispose);
        var machine = new PhaseMachine(2) { OnEntering = (_, _) => throw new InvalidOperationException("critical section failed") };
        Assert.Equal(StateMachineExecutionStatus.Ok, scheme.TryExecuteStateMachine(machine));
        scheme.AfterStepAsideHookForTesting = () =>
        {
            scheme.AfterStepAsideHookForTesting = null;
            parked.Release(); // its Leave runs the critical section, which fails; the handler disposes the scheme
        };

        Exception? enter = null;
        var entering = GuardedThread.Start(() => enter = Record.Exception(() => scheme.Enter()));
        entering.Join();
        Assert.Null(disposeInHandler);
        Assert.IsType<ObjectDisposedException>(enter);
        Assert.True(machine.Completion.IsFaulted);
    }

    /// <summary>
    /// A thread inside a region calls Refresh while a transition waits for it: it steps aside (its epoch slot parked),
    /// the transition completes, and — through the scheme's hook, before the thread takes its protection back —
    /// another thread disposes the epoch's owner. Returns what Dispose threw and what the Refresh threw.
    /// </summary>
    private static (Exception? Dispose, Exception? Refresh) DisposeWhileARefreshStepsAside(bool legacyStepAside, bool onASharingScheme)
    {
        var owner = new EpochProtectedVersionScheme();
        owner.Epoch.LegacyStepAsideForTesting = legacyStepAside; // the slot freed while aside, and not counted (as before)
        EpochProtectedVersionScheme scheme = onASharingScheme ? new EpochProtectedVersionScheme(owner.Epoch) : owner;
        using var entered = new ManualResetEventSlim();
        using var started = new ManualResetEventSlim();
        using var aside = new ManualResetEventSlim();
        using var disposeTried = new ManualResetEventSlim();
        Exception? refresh = null;
        var machine = new PhaseMachine(2);
        scheme.BeforeComingBackHookForTesting = () =>
        {
            aside.Set();
            Assert.True(disposeTried.Wait(GuardedThread.DefaultTimeout));
        };
        var region = GuardedThread.Start(() =>
        {
            scheme.Enter();
            entered.Set();
            Assert.True(started.Wait(GuardedThread.DefaultTimeout));
            refresh = Record.Exception(() => scheme.Refresh());
            if (refresh is null)
                scheme.Leave();
        });

        Assert.True(entered.Wait(GuardedThread.DefaultTimeout));
        Assert.Equal(StateMachineExecutionStatus.Ok, scheme.TryExecuteStateMachine(machine));
        started.Set();
        Assert.True(aside.Wait(GuardedThread.DefaultTimeout));
        scheme.BeforeComingBackHookForTesting = null;
        // The transition the Refresh waited for has completed (its own drain ran it): no machine holds Dispose back.
        Assert.True(machine.Completion.Wait(GuardedThread.DefaultTimeout));
        Exception? dispose = Record.Exception(owner.Dispose);
        disposeTried.Set();
        region.Join();
        if (dispose is not null)
        {
            Assert.Equal(2, scheme.CurrentState.Version);
            owner.Dispose(); // the region has left
        }

        Assert.Throws<ObjectDisposedException>(() => owner.Enter());
        Assert.Throws<ObjectDisposedException>(() => owner.Epoch.Resume());
        return (dispose, refresh);
    }
}
