using System;
using Xunit;

namespace Epvs.Tests;

/// <summary>G7: misuse throws, with a message that says what to do, and leaves everything usable.</summary>
public class MisuseTests
{
    [Fact]
    public void Leave_WithoutEnter_ThrowsAndSaysHowToFixIt()
    {
        using var scheme = new EpochProtectedVersionScheme();
        var ex = Assert.Throws<InvalidOperationException>(scheme.Leave);
        Assert.Contains("Enter()", ex.Message);
        Assert.Contains("same thread", ex.Message);
        Assert.StartsWith("Leave", ex.Message); // (it said "Suspend was called", a method the caller never called)

        scheme.Enter();
        scheme.Leave();
        Assert.Throws<InvalidOperationException>(scheme.Leave); // one too many
    }

    [Fact]
    public void Leave_Unprotected_AfterTheSchemeAndItsEpochWereDisposed_ThrowsObjectDisposed()
    {
        // A thread whose Refresh stepped aside when the scheme was disposed gets ObjectDisposedException from the Refresh,
        // which ends its protection; its Leave (a using, a finally) then says so again, rather than "not protected",
        // which would hide the first error.
        var scheme = new EpochProtectedVersionScheme();
        scheme.Dispose();
        Assert.Throws<ObjectDisposedException>(scheme.Leave);
        Assert.Throws<ObjectDisposedException>(scheme.Epoch.Suspend);
    }

    [Fact]
    public void TryAdvance_ToAnOldVersion_OnADisposedScheme_ThrowsObjectDisposed()
    {
        // It used to answer Fail (the target already reached) before looking at the flag.
        var scheme = new EpochProtectedVersionScheme();
        scheme.AdvanceVersionWithCriticalSection((_, _) => { }, spin: true);
        scheme.Dispose();
        Assert.Throws<ObjectDisposedException>(() => scheme.TryAdvanceVersionWithCriticalSection((_, _) => { }, targetVersion: 1));
    }

    [Fact]
    public void Leave_OnAnotherThreadThanEnter_Throws()
    {
        using var scheme = new EpochProtectedVersionScheme();
        scheme.Enter();
        Exception? other = null;
        GuardedThread.Start(() => other = Record.Exception(scheme.Leave)).Join();
        Assert.IsType<InvalidOperationException>(other);
        scheme.Leave();
    }

    [Fact]
    public void Refresh_AndProtectAndDrain_Unprotected_Throw()
    {
        using var scheme = new EpochProtectedVersionScheme();
        Assert.StartsWith("Refresh", Assert.Throws<InvalidOperationException>(() => scheme.Refresh()).Message);
        Assert.Throws<InvalidOperationException>(scheme.Epoch.ProtectAndDrain);
        Assert.Throws<InvalidOperationException>(scheme.Epoch.Suspend);
    }

    [Theory]
    [InlineData(true)]
    [InlineData(false)]
    public void ExecuteStateMachine_UnderProtection_ThrowsInsteadOfDeadlocking(bool spin)
    {
        using var scheme = new EpochProtectedVersionScheme();
        scheme.Enter();
        var ex = Assert.Throws<InvalidOperationException>(() => scheme.ExecuteStateMachine(new PhaseMachine(2), spin));
        Assert.Contains("Leave()", ex.Message);
        Assert.Throws<InvalidOperationException>(() => scheme.AdvanceVersionWithCriticalSection((_, _) => { }, spin: spin));
        // Nothing was started; the thread is still protected and can carry on.
        Assert.Equal(VersionSchemeState.Make(VersionSchemeState.Rest, 1), scheme.CurrentState);
        scheme.Leave();
        Assert.True(scheme.AdvanceVersionWithCriticalSection((_, _) => { }, spin: true));
    }

    [Fact]
    public void ExecuteStateMachine_UnderProtectionOfASharedEpoch_Throws()
    {
        using var epoch = new LightEpoch();
        using var a = new EpochProtectedVersionScheme(epoch);
        using var b = new EpochProtectedVersionScheme(epoch);
        a.Enter();
        Assert.Throws<InvalidOperationException>(() => b.ExecuteStateMachine(new PhaseMachine(2), spin: true));
        a.Leave();
    }

    [Fact]
    public void StateMachine_ExecutedTwice_Throws()
    {
        using var scheme = new EpochProtectedVersionScheme();
        var machine = new PhaseMachine(2);
        Assert.True(scheme.ExecuteStateMachine(machine, spin: true));
        var ex = Assert.Throws<InvalidOperationException>(() => scheme.TryExecuteStateMachine(machine));
        Assert.Contains("new instance", ex.Message);
    }

    [Fact]
    public void UseAfterDispose_ThrowsObjectDisposed()
    {
        var scheme = new EpochProtectedVersionScheme();
        scheme.Dispose();
        scheme.Dispose(); // idempotent
        Assert.Throws<ObjectDisposedException>(() => scheme.Enter());
        Assert.Throws<ObjectDisposedException>(() => scheme.EnterScope(out _));
        Assert.Throws<ObjectDisposedException>(() => scheme.TryAdvanceVersionWithCriticalSection((_, _) => { }));
        Assert.Throws<ObjectDisposedException>(() => scheme.TryExecuteStateMachine(new PhaseMachine(2)));
        Assert.Throws<ObjectDisposedException>(scheme.SignalStepAvailable);
        Assert.Throws<ObjectDisposedException>(scheme.Epoch.Resume);
        Assert.Throws<ObjectDisposedException>(() => scheme.Epoch.BumpCurrentEpoch());
        Assert.Throws<ObjectDisposedException>(() => scheme.Epoch.BumpCurrentEpoch(() => { }));
    }

    [Fact]
    public void UseAfterDispose_TheOtherEntryPoints_ThrowObjectDisposedToo()
    {
        // Refresh and ProtectAndDrain used to say "not protected" (InvalidOperationException), and AdvanceVersionAsync
        // returned a task faulted later instead of throwing at the call, as its documentation says.
        var scheme = new EpochProtectedVersionScheme();
        scheme.Dispose();
        Assert.Throws<ObjectDisposedException>(() => scheme.Refresh());
        Assert.Throws<ObjectDisposedException>(scheme.Epoch.ProtectAndDrain);
        Assert.Throws<ObjectDisposedException>(() => { _ = scheme.AdvanceVersionAsync((_, _) => { }); });
        Assert.Throws<ObjectDisposedException>(() => scheme.AdvanceVersionWithCriticalSection((_, _) => { }, spin: true));
        Assert.Throws<ObjectDisposedException>(() => scheme.ExecuteStateMachine(new PhaseMachine(2), spin: true));
        Assert.Throws<ObjectDisposedException>(() => { _ = scheme.Epoch.BumpCurrentEpochAsync(() => { }); });
        Assert.Throws<ObjectDisposedException>(() =>
        {
            using LightEpoch.Scope scope = scheme.Epoch.EnterScope();
        });
        Assert.False(scheme.Epoch.ThisInstanceProtected());
        Assert.True(scheme.Epoch.TryDispose()); // already disposed: still true, no throw
    }

    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void StartsAndSignals_OnASchemeWhoseEpochIsDisposed_ThrowObjectDisposedAsEnterDoes_AndNothingRuns(bool sharedEpoch)
    {
        // The epoch, not the scheme, is disposed: a shared one under a scheme still in use, or an owned one through
        // scheme.Epoch. Enter threw, but the starts returned Ok and ran their critical sections inline, on an epoch that no
        // longer protects anything.
        var scheme = sharedEpoch ? new EpochProtectedVersionScheme(new LightEpoch()) : new EpochProtectedVersionScheme();
        scheme.Epoch.Dispose();
        string expected = sharedEpoch ? nameof(LightEpoch) : nameof(EpochProtectedVersionScheme);
        Assert.Equal(expected, Assert.Throws<ObjectDisposedException>(() => scheme.Enter()).ObjectName);

        int ran = 0;
        var machine = new PhaseMachine(2) { OnEntering = (_, _) => ran++ };
        void Refused(Action call) => Assert.Equal(expected, Assert.Throws<ObjectDisposedException>(call).ObjectName);
        Refused(() => scheme.TryExecuteStateMachine(machine));
        Refused(() => scheme.ExecuteStateMachine(machine, spin: true));
        Refused(() => scheme.TryAdvanceVersionWithCriticalSection((_, _) => ran++));
        Refused(() => scheme.AdvanceVersionWithCriticalSection((_, _) => ran++, spin: true));
        Refused(() => { _ = scheme.AdvanceVersionAsync((_, _) => ran++); });
        Refused(scheme.SignalStepAvailable);
        var disposed = Assert.Throws<ObjectDisposedException>(() => scheme.TryExecuteStateMachine(machine));
        Assert.Contains("epoch", disposed.Message, StringComparison.OrdinalIgnoreCase);

        Assert.Equal(0, ran);
        Assert.False(machine.IsCompleted);
        Assert.Null(scheme.ActiveStateMachine);
        Assert.Equal(VersionSchemeState.Make(VersionSchemeState.Rest, 1), scheme.CurrentState);
        scheme.Dispose();
        // Refused before it was marked started: the instance can still run on a live scheme.
        using var live = new EpochProtectedVersionScheme();
        Assert.True(live.ExecuteStateMachine(machine, spin: true));
        Assert.Equal(2, ran); // its two steps
    }

    [Fact]
    public void UseAfterDispose_SchemeOnSharedEpoch_ThrowsAndEpochStaysUsable()
    {
        using var epoch = new LightEpoch();
        var scheme = new EpochProtectedVersionScheme(epoch);
        scheme.Enter();
        scheme.Leave();
        scheme.Dispose();
        Assert.Throws<ObjectDisposedException>(() => scheme.Enter());
        Assert.False(epoch.ThisInstanceProtected()); // the failed Enter did not leave the thread protected
        using var other = new EpochProtectedVersionScheme(epoch);
        Assert.Equal(1, other.Enter().Version);
        other.Leave();
    }

    [Fact]
    public void Dispose_WhileThisThreadIsProtected_Throws()
    {
        var epoch = new LightEpoch();
        epoch.Resume();
        Assert.Throws<InvalidOperationException>(epoch.Dispose);
        epoch.Suspend();
        epoch.Dispose();
    }

    [Fact]
    public void Dispose_WhileAnotherThreadIsProtected_ThrowsAndEpochStaysUsable()
    {
        var epoch = new LightEpoch();
        using (new ParkedThread(epoch.Resume, epoch.Suspend))
        {
            var ex = Assert.Throws<InvalidOperationException>(epoch.Dispose);
            Assert.Contains("1 thread(s)", ex.Message);
            epoch.Resume(); // not disposed
            epoch.Suspend();
        }
        int ran = 0;
        epoch.BumpCurrentEpoch(() => ran = 1);
        Assert.Equal(1, ran);
        epoch.Dispose();
    }

    [Fact]
    public void Dispose_WithPendingActions_RunsThem()
    {
        var epoch = new LightEpoch();
        int ran = 0;
        using (var parked = new ParkedThread(epoch.Resume, epoch.Suspend))
        {
            epoch.BumpCurrentEpoch(() => ran++);
            Assert.Equal(0, ran);
        }
        Assert.Equal(1, ran);
        epoch.Dispose();
    }

    [Fact]
    public void Dispose_WhileAMachineRuns_ThrowsUntilItCompletes()
    {
        var scheme = new EpochProtectedVersionScheme();
        var machine = new PhaseMachine(3);
        machine.HoldStep(1);
        Assert.True(scheme.ExecuteStateMachine(machine));
        Assert.Throws<InvalidOperationException>(scheme.Dispose);
        machine.ReleaseStep();
        scheme.SignalStepAvailable();
        Assert.True(machine.Completion.Wait(GuardedThread.DefaultTimeout));
        scheme.Dispose();
    }

    /// <summary>
    /// Dispose from inside a callback of the scheme's own running machine used to say "wait for its Completion first",
    /// advice that waits for ever there (the machine ends only after the callback returns). It now says so, as
    /// ExecuteStateMachine does from a callback.
    /// </summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void Dispose_FromInsideTheRunningMachinesOwnCallback_ThrowsWithAdviceThatFits(bool fromTheCriticalSection)
    {
        var scheme = new EpochProtectedVersionScheme();
        InvalidOperationException? seen = null;
        void DisposeFromHere()
        {
            try
            {
                scheme.Dispose();
            }
            catch (InvalidOperationException ex)
            {
                seen ??= ex; // swallowed: the machine carries on
            }
        }
        var machine = new PhaseMachine(2);
        if (fromTheCriticalSection)
            machine.OnEntering = (_, _) => DisposeFromHere();
        else
            machine.AfterEntering = _ => DisposeFromHere();

        Assert.True(scheme.ExecuteStateMachine(machine, spin: true));
        Assert.NotNull(seen);
        Assert.DoesNotContain("wait for its Completion first", seen!.Message, StringComparison.Ordinal);
        Assert.Contains("inside a callback", seen.Message, StringComparison.Ordinal);
        Assert.Contains("outside", seen.Message, StringComparison.Ordinal);

        // Refused, so nothing changed: the machine completed, and the scheme disposes from outside.
        Assert.Null(machine.Fault);
        Assert.Equal(2, scheme.CurrentState.Version);
        scheme.Dispose();
        Assert.Throws<ObjectDisposedException>(() => scheme.Enter());
    }

    [Fact]
    public void BadArguments_Throw()
    {
        using var scheme = new EpochProtectedVersionScheme();
        Assert.Throws<ArgumentNullException>(() => scheme.TryAdvanceVersionWithCriticalSection(null!));
        Assert.Throws<ArgumentNullException>(() => scheme.TryExecuteStateMachine(null!));
        Assert.Throws<ArgumentNullException>(() => new EpochProtectedVersionScheme(null!));
        Assert.Throws<ArgumentNullException>(() => scheme.Epoch.BumpCurrentEpoch(null!));
        Assert.Throws<ArgumentOutOfRangeException>(() => new LightEpoch(0));
        Assert.Throws<ArgumentOutOfRangeException>(() => new PhaseMachine(2, toVersion: -2));
        Assert.Throws<ArgumentOutOfRangeException>(() => VersionSchemeState.Make(0, -1));
        Assert.Throws<ArgumentOutOfRangeException>(() => VersionSchemeState.Make(0, VersionSchemeState.MaxVersion + 1));
        Assert.Throws<ArgumentOutOfRangeException>(() => scheme.StallThreshold = TimeSpan.Zero);
        scheme.StallThreshold = TimeSpan.FromTicks(12_345);
        Assert.Equal(TimeSpan.FromTicks(12_345), scheme.StallThreshold);
        Assert.Equal("initialVersion", Assert.Throws<ArgumentOutOfRangeException>(() => new EpochProtectedVersionScheme(null, VersionSchemeState.MaxVersion + 1)).ParamName);
        using var shared = new LightEpoch();
        Assert.Equal("initialVersion", Assert.Throws<ArgumentOutOfRangeException>(() => new EpochProtectedVersionScheme(shared, -1)).ParamName);
    }

    [Fact]
    public void UseAfterDispose_NamesTheDisposedObject_TheSchemeForAnEpochItOwns()
    {
        var owning = new EpochProtectedVersionScheme();
        owning.Dispose();
        Assert.Equal(nameof(EpochProtectedVersionScheme), Assert.Throws<ObjectDisposedException>(() => owning.Enter()).ObjectName);
        Assert.Equal(nameof(EpochProtectedVersionScheme), Assert.Throws<ObjectDisposedException>(() => owning.Epoch.Resume()).ObjectName);

        // A shared epoch disposed under a scheme is the epoch's own failure.
        var epoch = new LightEpoch();
        using var scheme = new EpochProtectedVersionScheme(epoch);
        epoch.Dispose();
        Assert.Equal(nameof(LightEpoch), Assert.Throws<ObjectDisposedException>(() => scheme.Enter()).ObjectName);
    }

    [Fact]
    public void AdvancePastMaxVersion_Throws_AndCompletesTheMachine()
    {
        using var scheme = new EpochProtectedVersionScheme(null, VersionSchemeState.MaxVersion);
        var machine = new PhaseMachine(2);
        Assert.Throws<InvalidOperationException>(() => scheme.TryExecuteStateMachine(machine));

        // Whoever awaits the machine learns that it will never run (it used to stay started and never complete).
        Assert.True(machine.IsCompleted);
        Assert.IsType<InvalidOperationException>(machine.Fault);
        Assert.True(machine.Completion.IsFaulted);

        // The slot was given back (a start would get Retry otherwise): the scheme stays usable.
        Assert.Throws<InvalidOperationException>(() => scheme.TryAdvanceVersionWithCriticalSection((_, _) => { }));
        Assert.Equal(VersionSchemeState.MaxVersion, scheme.CurrentState.Version);
        scheme.Enter();
        scheme.Leave();
    }

    [Fact]
    public void Scope_DisposedTwiceOrDefault_LeavesOnlyOnce()
    {
        using var scheme = new EpochProtectedVersionScheme();
        scheme.Enter();
        var scope = scheme.EnterScope(out _);
        scope.Dispose();
        scope.Dispose();
        default(EpochProtectedVersionScheme.Scope).Dispose();
        default(LightEpoch.Scope).Dispose();
        Assert.True(scheme.Epoch.ThisInstanceProtected()); // the outer Enter still holds
        scheme.Leave();
        Assert.False(scheme.Epoch.ThisInstanceProtected());
    }

    [Fact]
    public void Refresh_NestedOnADisposedSchemeOfASharedEpoch_ThrowsAndKeepsTheOuterRegion()
    {
        using var epoch = new LightEpoch();
        using var outer = new EpochProtectedVersionScheme(epoch);
        var inner = new EpochProtectedVersionScheme(epoch);
        outer.Enter();
        inner.Enter();
        inner.Dispose();
        Assert.Throws<ObjectDisposedException>(() => inner.Refresh());
        inner.Leave();                              // the inner level is still there to leave
        Assert.True(epoch.ThisInstanceProtected()); // and the outer region still holds
        outer.Leave();
        Assert.False(epoch.ThisInstanceProtected());
    }

    [Fact]
    public void Enter_FromInsideTheCriticalSectionOfTheSameScheme_ThrowsInsteadOfDeadlocking()
    {
        using var scheme = new EpochProtectedVersionScheme();
        var ex = Assert.Throws<InvalidOperationException>(() =>
            scheme.AdvanceVersionWithCriticalSection((_, _) => scheme.Enter(), spin: true));
        Assert.Contains("OnEnteringState", ex.Message);
        Assert.False(scheme.Epoch.ThisInstanceProtected());
        Assert.Equal(VersionSchemeState.Make(VersionSchemeState.Rest, 1), scheme.CurrentState);
        Assert.True(scheme.AdvanceVersionWithCriticalSection((_, _) => { }, spin: true)); // still usable
    }

    /// <summary>
    /// Enter on scheme X from the critical section of another scheme Y that runs inside X's own critical section (X's
    /// critical section starts Y's transition, which runs inline): X's critical section is up this thread's stack, so the
    /// Enter waits for itself. It hung, and every later Enter on X with it: only the innermost critical section was
    /// checked (found by an adversarial round, session 17). It throws as the direct case does.
    /// </summary>
    [Theory]
    [InlineData(true)]
    [InlineData(false)]
    public void Enter_FromACriticalSectionNestedInsideTheSameSchemes_ThrowsInsteadOfDeadlocking(bool blockingInnerStart)
    {
        using var x = new EpochProtectedVersionScheme();
        using var y = new EpochProtectedVersionScheme();
        Exception? fromEnter = null;
        var worker = new GuardedThread(() =>
        {
            x.AdvanceVersionWithCriticalSection((_, _) =>
            {
                Action<long, long> inner = (_, _) => fromEnter = Record.Exception(() =>
                {
                    x.Enter();
                    x.Leave();
                });
                if (blockingInnerStart)
                    y.AdvanceVersionWithCriticalSection(inner, spin: true);
                else
                    Assert.Equal(StateMachineExecutionStatus.Ok, y.TryAdvanceVersionWithCriticalSection(inner)); // inline: nobody protected on y
            }, spin: true);
        }, "nested critical sections");
        worker.Start();
        bool finished = worker.TryJoin(TimeSpan.FromSeconds(10));
        if (!finished)
        {
            worker.Interrupt(); // the Enter's wait is interruptible
            worker.TryJoin(TimeSpan.FromSeconds(10));
        }
        Assert.True(finished, "X.Enter() from Y's critical section inside X's critical section waited for itself");
        var refusal = Assert.IsType<InvalidOperationException>(fromEnter);
        Assert.Contains("OnEnteringState", refusal.Message);
        Assert.Equal(VersionSchemeState.Make(VersionSchemeState.Rest, 2), x.CurrentState); // the refusal was caught: X's step completed
        Assert.True(x.AdvanceVersionWithCriticalSection((_, _) => { }, spin: true)); // still usable
    }

    [Fact]
    public void Dispose_ThenStartingAMachine_ThrowsObjectDisposedAndNothingRuns()
    {
        using var epoch = new LightEpoch();
        var scheme = new EpochProtectedVersionScheme(epoch);
        scheme.Dispose();
        int ran = 0;
        Assert.Throws<ObjectDisposedException>(() => scheme.TryAdvanceVersionWithCriticalSection((_, _) => ran++));
        Assert.Throws<ObjectDisposedException>(() => scheme.TryExecuteStateMachine(new PhaseMachine(2)));
        Assert.Null(scheme.ActiveStateMachine);
        Assert.Equal(0, ran);
    }

    /// <summary>
    /// A probe's finding: the try form answered a target below -1 with Fail ("already reached") and one above
    /// MaxVersion, while another machine was active, with Retry (an argument no retry can make valid), before it
    /// checked the argument as documented. All three forms now throw ArgumentOutOfRangeException, whatever the state.
    /// </summary>
    [Theory]
    [InlineData(-2L)]
    [InlineData(long.MinValue)]
    [InlineData(VersionSchemeState.MaxVersion + 1)]
    [InlineData(long.MaxValue)]
    public void AnInvalidTargetVersion_ThrowsArgumentOutOfRange_FromEveryAdvanceForm(long target)
    {
        using var scheme = new EpochProtectedVersionScheme();
        bool ran = false;
        Action<long, long> criticalSection = (_, _) => ran = true;
        Assert.Throws<ArgumentOutOfRangeException>(() => scheme.TryAdvanceVersionWithCriticalSection(criticalSection, target));
        Assert.Throws<ArgumentOutOfRangeException>(() => scheme.AdvanceVersionWithCriticalSection(criticalSection, target));
        Assert.Throws<ArgumentOutOfRangeException>(() => { _ = scheme.AdvanceVersionAsync(criticalSection, target); });

        // The same while another machine is active (started by a protected thread, it waits for this thread's Leave).
        scheme.Enter();
        try
        {
            Assert.Equal(StateMachineExecutionStatus.Ok, scheme.TryAdvanceVersionWithCriticalSection((_, _) => { }));
            Assert.Throws<ArgumentOutOfRangeException>(() => scheme.TryAdvanceVersionWithCriticalSection(criticalSection, target));
        }
        finally
        {
            scheme.Leave();
        }

        Assert.False(ran);
    }
}
