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

    [Fact]
    public void DisposeWhileARefreshStepsAside_Refuses_AndTheRefreshCarriesOn()
    {
        (Exception? dispose, Exception? refresh) = DisposeWhileARefreshStepsAside(uncounted: false);
        Assert.IsType<InvalidOperationException>(dispose);
        Assert.Null(refresh);
    }

    [Fact]
    public void Control_RefreshAsideUncounted_IsCaught()
    {
        // The behaviour before: the epoch found the slot free and closed under the region, whose Refresh then threw.
        (Exception? dispose, Exception? refresh) = DisposeWhileARefreshStepsAside(uncounted: true);
        Assert.Null(dispose);
        Assert.IsType<ObjectDisposedException>(refresh);
    }

    /// <summary>
    /// A thread inside a region calls Refresh while a transition waits for it: it steps aside (its epoch slot free),
    /// the transition completes, and — through the scheme's hook, before the thread takes its protection back —
    /// another thread disposes the scheme. Returns what Dispose threw and what the Refresh threw.
    /// </summary>
    private static (Exception? Dispose, Exception? Refresh) DisposeWhileARefreshStepsAside(bool uncounted)
    {
        var scheme = new EpochProtectedVersionScheme { UncountedRefreshAsideForTesting = uncounted };
        using var entered = new ManualResetEventSlim();
        using var started = new ManualResetEventSlim();
        using var aside = new ManualResetEventSlim();
        using var disposeTried = new ManualResetEventSlim();
        Exception? refresh = null;
        var machine = new PhaseMachine(2);
        scheme.SteppedAsideHookForTesting = () =>
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
        scheme.SteppedAsideHookForTesting = null;
        // The transition the Refresh waited for has completed (its own drain ran it): no machine holds Dispose back.
        Assert.True(machine.Completion.Wait(GuardedThread.DefaultTimeout));
        Exception? dispose = Record.Exception(scheme.Dispose);
        disposeTried.Set();
        region.Join();
        if (dispose is not null)
        {
            Assert.Equal(2, scheme.CurrentState.Version);
            scheme.Dispose(); // the region has left
        }

        Assert.Throws<ObjectDisposedException>(() => scheme.Enter());
        return (dispose, refresh);
    }
}
