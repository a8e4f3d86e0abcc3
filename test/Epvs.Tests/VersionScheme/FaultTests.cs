using System;
using System.Threading;
using System.Threading.Tasks;
using Xunit;

namespace Epvs.Tests;

/// <summary>G6: faults in callbacks and deferred actions do not wedge anything and reach the requester.</summary>
public class FaultTests
{
    private sealed class Boom : Exception
    {
        public Boom(string message) : base(message) { }
    }

    [Fact]
    public void CriticalSection_Throws_SpinningRequesterGetsTheExceptionAndTheVersionIsUnchanged()
    {
        using var scheme = new EpochProtectedVersionScheme();
        StateMachineFaultedEventArgs? reported = null;
        scheme.StateMachineFaulted += (_, e) => reported = e;

        var boom = new Boom("critical section failed");
        Boom thrown = Assert.Throws<Boom>(() => scheme.AdvanceVersionWithCriticalSection((_, _) => throw boom, spin: true));

        Assert.Same(boom, thrown);
        Assert.Same(boom, reported?.Exception);
        Assert.Equal(VersionSchemeState.Make(VersionSchemeState.Rest, 1), scheme.CurrentState);
        Assert.Equal(VersionSchemeState.Make(VersionSchemeState.Rest, 1), reported!.State);
        // Still usable: regions enter, and the same version can be advanced to.
        Assert.Equal(1, scheme.Enter().Version);
        scheme.Leave();
        Assert.True(scheme.AdvanceVersionWithCriticalSection((_, _) => { }, targetVersion: 2, spin: true));
        Assert.Equal(2, scheme.CurrentState.Version);
    }

    [Fact]
    public void CriticalSection_StartingAndWaitingForAnotherTransition_IsRefusedInsteadOfWaitingForEver()
    {
        // The running machine ends only after its critical section returns: a blocking start of another machine from
        // inside it used to retry for ever. It is refused now; the refusal is the critical section's fault.
        using var scheme = new EpochProtectedVersionScheme();
        Exception? thrown = null;
        var worker = new Thread(() =>
        {
            try
            {
                scheme.AdvanceVersionWithCriticalSection((_, _) => scheme.AdvanceVersionWithCriticalSection((_, _) => { }, spin: true), spin: true);
            }
            catch (Exception e)
            {
                thrown = e;
            }
        })
        { IsBackground = true };
        worker.Start();
        Assert.True(worker.Join(TimeSpan.FromSeconds(30)), "the nested blocking start waited for ever");
        Assert.IsType<InvalidOperationException>(thrown);
        Assert.Contains("callback of this scheme's running state machine", thrown!.Message, StringComparison.Ordinal);

        // Still usable, the version unchanged by the failed transition.
        Assert.Equal(VersionSchemeState.Make(VersionSchemeState.Rest, 1), scheme.CurrentState);
        Assert.True(scheme.AdvanceVersionWithCriticalSection((_, _) => { }, spin: true));
        Assert.Equal(2, scheme.CurrentState.Version);
    }

    [Fact]
    public void ADeferralThatThrowsAfterRegisteringTheStep_NeitherUndoesItNorReportsIt()
    {
        // The epoch's hook throws inside Defer after the step is registered (as an interrupted wait or an allocation
        // failure there would). The step used to be undone although it was still queued: its critical section never
        // ran, and the queued completion later ran against a retired machine.
        using var scheme = new EpochProtectedVersionScheme();
        bool thrown = false;
        int ran = 0;
        scheme.Epoch.LoweredPendingHintHookForTesting = () =>
        {
            if (!thrown)
            {
                thrown = true;
                throw new Boom("after registering");
            }
        };
        StateMachineExecutionStatus status = scheme.TryAdvanceVersionWithCriticalSection((_, _) => ran++, targetVersion: 2);
        scheme.Epoch.LoweredPendingHintHookForTesting = null;
        Assert.True(thrown);
        Assert.Equal(StateMachineExecutionStatus.Ok, status);

        // The queued step runs at the next drain; the scheme moves on past it.
        Assert.True(scheme.AdvanceVersionWithCriticalSection((_, _) => { }, targetVersion: 3, spin: true));
        Assert.Equal(1, ran);
        Assert.Equal(VersionSchemeState.Make(VersionSchemeState.Rest, 3), scheme.CurrentState);
    }

    [Fact]
    public void AThrowingMetricsListener_DoesNotWedgeTheScheme()
    {
        Assert.Null(AdvanceUnderAThrowingListener());
    }

    [Fact]
    public void AThrowingMetricsListener_LetThrough_BreaksTheAdvance_Control()
    {
        EpochDiagnostics.LetListenerExceptionsThroughForTesting = true;
        try
        {
            string? broken = AdvanceUnderAThrowingListener();
            Assert.True(broken is not null, "INCONCLUSIVE: the control (listener exceptions let through) advanced anyway; the check proves nothing on this run.");
        }
        finally
        {
            EpochDiagnostics.LetListenerExceptionsThroughForTesting = false;
        }
    }

    /// <summary>
    /// A <see cref="System.Diagnostics.Metrics.MeterListener"/> whose callback throws (on this test's thread only, so no
    /// other test is disturbed) while a transition runs on this thread. Returns what went wrong (the version did not
    /// advance, or the scheme was left intermediate), or null.
    /// </summary>
    private static string? AdvanceUnderAThrowingListener()
    {
        int testThread = Environment.CurrentManagedThreadId;
        bool armed = false;
        using var listener = new System.Diagnostics.Metrics.MeterListener();
        listener.InstrumentPublished = (instrument, l) =>
        {
            if (instrument.Meter.Name == EpochDiagnostics.MeterName)
                l.EnableMeasurementEvents(instrument);
        };
        listener.SetMeasurementEventCallback<long>((_, _, _, _) =>
        {
            if (armed && Environment.CurrentManagedThreadId == testThread)
                throw new Boom("a metrics listener failed");
        });
        listener.Start();

        var scheme = new EpochProtectedVersionScheme();
        armed = true;
        StateMachineExecutionStatus status;
        try
        {
            // No thread is protected: the step runs here, inside this call.
            status = scheme.TryAdvanceVersionWithCriticalSection((_, _) => { }, targetVersion: 2);
        }
        catch (Exception e)
        {
            return $"the advance threw {e.GetType().Name}: {e.Message}";
        }
        finally
        {
            armed = false;
        }

        var clock = System.Diagnostics.Stopwatch.StartNew();
        while ((scheme.CurrentState.Version != 2 || scheme.CurrentState.IsIntermediate) && clock.Elapsed < TimeSpan.FromSeconds(5))
            Thread.Yield();
        VersionSchemeState state = scheme.CurrentState;
        if (status != StateMachineExecutionStatus.Ok || state != VersionSchemeState.Make(VersionSchemeState.Rest, 2))
            return $"started {status}, then the state stayed {state}";
        scheme.Dispose();
        return null;
    }

    [Fact]
    public void FaultHandler_ThatStartsAndWaitsForAnotherTransition_SeesItComplete()
    {
        Assert.Null(RetryFromTheFaultHandler(raiseInsideStep: false, TimeSpan.FromSeconds(30)));
    }

    [Fact]
    public void FaultHandler_RaisedWhileTheStepIsStillOwned_CannotSeeItsRetryComplete_Control()
    {
        // The control: raised before the faulted step is released, the handler's transition cannot step until it returns.
        string? stuck = RetryFromTheFaultHandler(raiseInsideStep: true, TimeSpan.FromMilliseconds(500));
        Assert.True(stuck is not null, "INCONCLUSIVE: the control (event raised while the step is owned) let the retry complete; the check proves nothing on this run.");
    }

    /// <summary>
    /// A critical section throws; the <see cref="EpochProtectedVersionScheme.StateMachineFaulted"/> handler starts the
    /// same advance again and waits (at most <paramref name="wait"/>) for the version to reach it. Returns why the retry
    /// did not complete inside the handler, or null.
    /// </summary>
    private static string? RetryFromTheFaultHandler(bool raiseInsideStep, TimeSpan wait)
    {
        using var scheme = new EpochProtectedVersionScheme { RaiseFaultedInsideStepForTesting = raiseInsideStep };
        string? stuck = "the handler never ran";
        scheme.StateMachineFaulted += (_, e) =>
        {
            StateMachineExecutionStatus status = scheme.TryAdvanceVersionWithCriticalSection((_, _) => { }, targetVersion: 2);
            if (status != StateMachineExecutionStatus.Ok)
            {
                stuck = $"the retry did not start: {status}";
                return;
            }

            var clock = System.Diagnostics.Stopwatch.StartNew();
            var spinner = new SpinWait();
            while (scheme.CurrentState.Version != 2 || scheme.CurrentState.IsIntermediate)
            {
                if (clock.Elapsed > wait)
                {
                    stuck = $"the retry did not complete within {wait.TotalMilliseconds} ms (state {scheme.CurrentState})";
                    return;
                }

                spinner.SpinOnce();
            }

            stuck = null;
        };

        Assert.Throws<Boom>(() => scheme.AdvanceVersionWithCriticalSection((_, _) => throw new Boom("first try"), spin: true));

        // Either way the retry completes once the handler has returned.
        var after = System.Diagnostics.Stopwatch.StartNew();
        while (scheme.CurrentState.Version != 2 && after.Elapsed < TimeSpan.FromSeconds(30))
        {
            Thread.Yield();
        }

        Assert.Equal(VersionSchemeState.Make(VersionSchemeState.Rest, 2), scheme.CurrentState);
        return stuck;
    }

    [Fact]
    public void CriticalSection_ThrowsWhileOthersWait_WaitersReturnAndTheSchemeMovesOn()
    {
        using var scheme = new EpochProtectedVersionScheme();
        var faulted = new TaskCompletionSource<Exception>();
        scheme.StateMachineFaulted += (_, e) => faulted.TrySetResult(e.Exception);
        using var parked = new ParkedThread(() => scheme.Enter(), scheme.Leave);
        Assert.Equal(StateMachineExecutionStatus.Ok, scheme.TryAdvanceVersionWithCriticalSection((_, _) => throw new Boom("late")));

        // A thread trying to enter waits for the pending transition...
        long entered = 0;
        var waiter = GuardedThread.Start(() =>
        {
            entered = scheme.Enter().Version;
            scheme.Leave();
        });
        parked.Release(); // ...which runs now, throws, and must not leave the waiter stuck.
        waiter.Join();
        Assert.Equal(1, entered);
        Assert.True(faulted.Task.Wait(GuardedThread.DefaultTimeout));
        Assert.IsType<Boom>(faulted.Task.Result);
        Assert.False(scheme.CurrentState.IsIntermediate);
    }

    [Fact]
    public void CriticalSection_ThrowsInFasterCore_LeavesItWedged_Control()
    {
        // The control for the check above: FASTER.core lets the exception escape from the drain and leaves its state
        // intermediate, so every later Enter would spin forever. (We only look at the state; we do not Enter.)
        var epoch = new FASTER.core.LightEpoch();
        bool wedged = WedgesOnThrow(new FASTER.core.EpochProtectedVersionScheme(epoch));
        Assert.True(wedged, "control not caught: FASTER.core was expected to stay in the intermediate state");
    }

    private static bool WedgesOnThrow(FASTER.core.EpochProtectedVersionScheme scheme)
    {
        try
        {
            scheme.TryAdvanceVersionWithCriticalSection((_, _) => throw new Boom("in FASTER"));
        }
        catch (Boom)
        {
        }
        return scheme.CurrentState().IsIntermediate();
    }

    [Fact]
    public void AfterEnteringState_Throws_MachineFaultsInTheEnteredStateAndNextMachineRuns()
    {
        using var scheme = new EpochProtectedVersionScheme();
        var machine = new PhaseMachine(3) { AfterEntering = s => { if (s.Phase == 1) throw new Boom("after"); } };
        Assert.True(scheme.ExecuteStateMachine(machine));
        Assert.True(machine.IsCompleted);
        Assert.True(machine.Completion.IsFaulted);
        Assert.IsType<Boom>(machine.Fault);
        Assert.Equal(VersionSchemeState.Make(1, 1), scheme.CurrentState);

        // The next machine starts from there.
        var next = new PhaseMachine(3);
        Assert.True(scheme.ExecuteStateMachine(next, spin: true));
        Assert.Equal(VersionSchemeState.Make(VersionSchemeState.Rest, 2), scheme.CurrentState);
    }

    [Fact]
    public void GetNextStep_Throws_MachineFaultsAndSchemeStaysAtRest()
    {
        using var scheme = new EpochProtectedVersionScheme();
        var machine = new DelegateMachine(2, _ => throw new Boom("next"));
        Assert.True(scheme.ExecuteStateMachine(machine));
        Assert.IsType<Boom>(machine.Fault);
        Assert.Equal(VersionSchemeState.Make(VersionSchemeState.Rest, 1), scheme.CurrentState);
        Assert.True(scheme.AdvanceVersionWithCriticalSection((_, _) => { }, spin: true));
    }

    [Fact]
    public async Task DeferredAction_Throws_TaskFaultsEventFiresAndOtherActionsStillRun()
    {
        using var epoch = new LightEpoch();
        Exception? reported = null;
        epoch.DeferredActionFailed += (_, e) => reported = e.Exception;
        int before = 0, after = 0;
        Task failing;
        using (var parked = new ParkedThread(epoch.Resume, epoch.Suspend))
        {
            epoch.BumpCurrentEpoch(() => before = 1);
            failing = epoch.BumpCurrentEpochAsync(() => throw new Boom("deferred"));
            epoch.BumpCurrentEpoch(() => throw new Boom("fire and forget"));
            epoch.BumpCurrentEpoch(() => after = 1);
            Assert.False(failing.IsCompleted);
        } // the parked thread leaves and drains them all

        await Assert.ThrowsAsync<Boom>(() => failing);
        Assert.Equal((1, 1), (before, after));
        Assert.IsType<Boom>(reported);
        // Still usable.
        epoch.Resume();
        epoch.Suspend();
        await epoch.BumpCurrentEpochAsync(() => { });
    }
}
