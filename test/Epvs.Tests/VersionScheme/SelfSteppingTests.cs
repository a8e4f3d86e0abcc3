using System;
using System.Linq;
using System.Threading;
using System.Threading.Tasks;
using Xunit;

namespace Epvs.Tests;

/// <summary>G4: machines step themselves; nobody has to Enter or Leave again for them to finish.</summary>
public class SelfSteppingTests
{
    private readonly ITestOutputHelper output;

    public SelfSteppingTests(ITestOutputHelper output) => this.output = output;

    [Fact]
    public void ThreePhaseMachine_StartedWhileReaderParked_CompletesAfterReaderLeavesWithNoFurtherCalls()
    {
        using var scheme = new EpochProtectedVersionScheme();
        var machine = new PhaseMachine(3);
        using var parked = new ParkedThread(() => scheme.Enter(), scheme.Leave);

        Assert.Equal(StateMachineExecutionStatus.Ok, scheme.TryExecuteStateMachine(machine));
        Assert.False(machine.IsCompleted);
        Assert.DoesNotContain(machine.Log, l => l.StartsWith("on", StringComparison.Ordinal));

        parked.Release(); // its Leave is the last call anyone makes
        Assert.True(machine.Completion.Wait(GuardedThread.DefaultTimeout), "machine did not finish on its own");
        Assert.Equal(new[]
        {
            "on [0,1]->[1,1]", "after [1,1]",
            "on [1,1]->[2,1]", "after [2,1]",
            "on [2,1]->[0,2]", "after [0,2]",
        }, machine.Log.ToArray());
        Assert.Equal(VersionSchemeState.Make(VersionSchemeState.Rest, 2), scheme.CurrentState);
    }

    [Fact]
    public void DelayedStep_CompletesOnlyAfterSignalStepAvailable()
    {
        using var scheme = new EpochProtectedVersionScheme();
        var machine = new PhaseMachine(3);
        machine.HoldStep(1);
        Assert.Equal(StateMachineExecutionStatus.Ok, scheme.TryExecuteStateMachine(machine));

        // The held step keeps it in phase 1 however often threads come and go (the checker can see "not done").
        for (int i = 0; i < 10; i++)
        {
            scheme.Enter();
            scheme.Leave();
        }
        Assert.False(machine.IsCompleted);
        Assert.Equal(VersionSchemeState.Make(1, 1), scheme.CurrentState);

        machine.ReleaseStep();
        scheme.SignalStepAvailable();
        Assert.True(machine.Completion.Wait(GuardedThread.DefaultTimeout));
        Assert.Equal(VersionSchemeState.Make(VersionSchemeState.Rest, 2), scheme.CurrentState);
    }

    [Fact]
    public void DelayedStep_SignalledFromAnotherThreadWhileStepping_IsNotLost()
    {
        // Many rounds of "make the step available and signal" racing with threads that are stepping the machine.
        using var scheme = new EpochProtectedVersionScheme();
        for (int round = 0; round < 200; round++)
        {
            var machine = new PhaseMachine(2);
            machine.HoldStep(1);
            Assert.True(scheme.ExecuteStateMachine(machine));
            using var start = new Barrier(2);
            var stepper = GuardedThread.Start(() =>
            {
                start.SignalAndWait();
                for (int i = 0; i < 20; i++)
                    scheme.SignalStepAvailable();
            });
            start.SignalAndWait();
            machine.ReleaseStep();
            scheme.SignalStepAvailable();
            stepper.Join();
            Assert.True(machine.Completion.Wait(GuardedThread.DefaultTimeout), $"round {round}: signal lost");
        }
    }

    /// <summary>
    /// The lost-wakeup race: a reader leaves at the same moment as a transition is requested. The leaver's check for
    /// pending actions can pass its own cleared slot in the store buffer, and the requester's scan can still see the
    /// slot taken. Returns how many rounds left a transition stranded (nobody makes another call).
    /// </summary>
    private static (int Stranded, int Rounds) LeaveRacesRequest(int rounds, TimeSpan strandTimeout, bool stopAtFirst)
    {
        using var scheme = new EpochProtectedVersionScheme();
        var meet = new SpinRendezvous();
        int stranded = 0;
        int stop = 0;
        var reader = GuardedThread.Start(() =>
        {
            // Seeded jitter sweeps the leave across the requester's path to its registration (part of the harness:
            // the same for the real scheme and the control).
            var rng = new Random(12345);
            for (long round = 0; Volatile.Read(ref stop) == 0; round++)
            {
                scheme.Enter();
                meet.Meet(3 * round + 1);
                Thread.SpinWait(rng.Next(0, 24));
                scheme.Leave(); // races the request below
                meet.Meet(3 * round + 2);
                meet.Meet(3 * round + 3); // the verdict: nobody calls anything until it is in
            }
        });

        int done = 0;
        bool finished = false;
        for (long round = 0; !finished; round++)
        {
            var machine = new PhaseMachine(1);
            meet.Meet(3 * round + 1);
            Assert.Equal(StateMachineExecutionStatus.Ok, scheme.TryExecuteStateMachine(machine));
            meet.Meet(3 * round + 2);
            done++;
            if (!machine.Completion.Wait(strandTimeout))
            {
                stranded++;
                scheme.Epoch.BumpCurrentEpoch(); // any later call drains it
                Assert.True(machine.Completion.Wait(GuardedThread.DefaultTimeout));
            }
            finished = done >= rounds || (stopAtFirst && stranded > 0);
            if (finished)
                Volatile.Write(ref stop, 1);
            meet.Meet(3 * round + 3);
        }
        reader.Join();
        return (stranded, done);
    }

    [Fact]
    public void Leave_RacingATransitionRequest_NeverStrandsTheTransition()
    {
        (int Stranded, int Rounds) control;
        LightEpoch.DisableLeaveRaceGuardForTesting = true;
        try
        {
            control = LeaveRacesRequest(rounds: 100_000, TimeSpan.FromMilliseconds(500), stopAtFirst: true);
        }
        finally
        {
            LightEpoch.DisableLeaveRaceGuardForTesting = false;
        }
        output.WriteLine($"control (no second look after a pending registration): {control.Stranded} stranded in {control.Rounds} rounds");

        (int Stranded, int Rounds) real = LeaveRacesRequest(rounds: 20_000, TimeSpan.FromSeconds(10), stopAtFirst: false);
        output.WriteLine($"real: {real.Stranded} stranded in {real.Rounds} rounds");

        Assert.Equal(0, real.Stranded);
        Assert.SkipWhen(control.Stranded == 0, $"inconclusive: the control (no second look after a pending registration) stranded nothing in {control.Rounds} rounds on this machine");
    }
}
