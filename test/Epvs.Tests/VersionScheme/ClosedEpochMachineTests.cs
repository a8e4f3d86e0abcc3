using System;
using System.Threading;
using System.Threading.Tasks;
using Xunit;

namespace Epvs.Tests;

/// <summary>
/// A machine in flight when the epoch under its scheme is disposed (a shared epoch, the owned one through
/// <see cref="EpochProtectedVersionScheme.Epoch"/>, or the owner of a shared one disposed): its steps still run, so its
/// Completion comes and the scheme can be disposed. With a delayed step (GetNextStep false) neither happened:
/// <see cref="EpochProtectedVersionScheme.SignalStepAvailable"/> refused on the closed epoch, so the machine never ended
/// and the scheme refused every Dispose; an <see cref="EpochProtectedVersionScheme.AdvanceVersionAsync"/> waiting for
/// that machine never ended either, although it is documented to fault with <see cref="ObjectDisposedException"/>.
/// </summary>
public sealed class ClosedEpochMachineTests
{
    private static readonly TimeSpan Wait = TimeSpan.FromSeconds(30);

    public enum Closing
    {
        SharedEpoch,
        OwnedEpoch,
        OwnerScheme,
    }

    /// <summary>A scheme running a 3-phase machine held at phase 1 (its next step delayed), and how to close its epoch.</summary>
    private static (EpochProtectedVersionScheme Scheme, PhaseMachine Machine, Action CloseEpoch) StartHeld(Closing closing)
    {
        EpochProtectedVersionScheme scheme;
        Action closeEpoch;
        switch (closing)
        {
            case Closing.SharedEpoch:
                scheme = new EpochProtectedVersionScheme(new LightEpoch());
                closeEpoch = scheme.Epoch.Dispose;
                break;
            case Closing.OwnedEpoch:
                scheme = new EpochProtectedVersionScheme();
                closeEpoch = scheme.Epoch.Dispose;
                break;
            default:
                var owner = new EpochProtectedVersionScheme();
                scheme = new EpochProtectedVersionScheme(owner.Epoch);
                closeEpoch = owner.Dispose;
                break;
        }

        var machine = new PhaseMachine(3);
        machine.HoldStep(1);
        Assert.Equal(StateMachineExecutionStatus.Ok, scheme.TryExecuteStateMachine(machine));
        Assert.Equal(1, scheme.CurrentState.Phase);
        Assert.False(machine.Completion.IsCompleted);
        return (scheme, machine, closeEpoch);
    }

    [Theory]
    [InlineData(Closing.SharedEpoch)]
    [InlineData(Closing.OwnedEpoch)]
    [InlineData(Closing.OwnerScheme)]
    public void ADelayedStep_SignalledAfterTheEpochClosed_CompletesTheMachine_AndTheSchemeDisposes(Closing closing)
    {
        (EpochProtectedVersionScheme scheme, PhaseMachine machine, Action closeEpoch) = StartHeld(closing);
        closeEpoch();

        machine.ReleaseStep();
        scheme.SignalStepAvailable();

        Assert.True(machine.Completion.Wait(Wait), "the machine did not complete");
        Assert.Equal(VersionSchemeState.Make(VersionSchemeState.Rest, 2), scheme.CurrentState);
        scheme.Dispose();

        // With no machine in flight, a signal on the closed epoch reports it, as Enter does.
        var fresh = new EpochProtectedVersionScheme(new LightEpoch());
        fresh.Epoch.Dispose();
        Assert.Throws<ObjectDisposedException>(fresh.SignalStepAvailable);
        Assert.Throws<ObjectDisposedException>(scheme.SignalStepAvailable);
    }

    [Fact]
    public void RefusingTheSignalOnTheClosedEpoch_IsCaught()
    {
        (EpochProtectedVersionScheme scheme, PhaseMachine machine, Action closeEpoch) = StartHeld(Closing.SharedEpoch);
        scheme.LegacySignalOnClosedEpochForTesting = true;
        closeEpoch();

        machine.ReleaseStep();
        Assert.Throws<ObjectDisposedException>(scheme.SignalStepAvailable);

        // Nothing else can take the step: the machine is stuck for good, and the scheme refuses to be disposed.
        Assert.False(machine.Completion.IsCompleted, "the control's machine completed");
        Assert.Throws<InvalidOperationException>(scheme.Dispose);
    }

    [Theory]
    [InlineData(Closing.SharedEpoch, false)]
    [InlineData(Closing.OwnedEpoch, false)]
    [InlineData(Closing.OwnerScheme, false)]
    [InlineData(Closing.SharedEpoch, true)]
    public void AnAsyncAdvanceWaitingForAnotherMachine_FaultsWhenTheEpochCloses(Closing closing, bool control)
    {
        (EpochProtectedVersionScheme scheme, PhaseMachine machine, Action closeEpoch) = StartHeld(closing);
        scheme.LegacyAsyncWaitIgnoresEpochCloseForTesting = control;
        using var retried = new ManualResetEventSlim();
        scheme.AsyncRetryHookForTesting = retried.Set;
        bool ran = false;
        Task<bool> advance = scheme.AdvanceVersionAsync((_, _) => ran = true);
        Assert.True(retried.Wait(Wait), "AdvanceVersionAsync did not find the held machine active");
        scheme.AsyncRetryHookForTesting = null;

        closeEpoch();

        // The held machine never ends (its step is never signalled): only the epoch's close can end this wait.
        bool ended = ((IAsyncResult)advance).AsyncWaitHandle.WaitOne(control ? TimeSpan.FromMilliseconds(300) : Wait);
        if (control)
        {
            Assert.False(ended, "the control's advance ended although the machine it waits for never does");
            return;
        }

        Assert.True(ended, $"AdvanceVersionAsync was still {advance.Status} after the epoch closed");
        Assert.IsType<ObjectDisposedException>(advance.Exception?.InnerException);
        Assert.False(ran);
        Assert.False(machine.Completion.IsCompleted);
    }
}
