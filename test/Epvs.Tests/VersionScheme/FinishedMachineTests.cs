using System;
using System.Threading;
using Xunit;

namespace Epvs.Tests;

/// <summary>
/// Regression (reported by the samples, which hit it in the paper's Fig. 5 array and in Fig. 8 transfers): between
/// publishing a machine's final state and retiring it, threads on the slow path of Enter/Leave step the scheme; they
/// must never ask the finished machine for another step (G3, G4).
/// </summary>
public class FinishedMachineTests
{
    private readonly ITestOutputHelper output;

    public FinishedMachineTests(ITestOutputHelper output) => this.output = output;

    /// <summary>REST(v) → 1(v) → REST(v + 1), like Figs. 5 and 10; widens the window after its final state.</summary>
    private sealed class TwoStepMachine : VersionSchemeStateMachine
    {
        public int AskedAfterTarget;

        public override bool GetNextStep(VersionSchemeState currentState, out VersionSchemeState nextState)
        {
            if (currentState.Phase == VersionSchemeState.Rest)
            {
                if (currentState.Version >= ActualToVersion)
                {
                    Interlocked.Increment(ref AskedAfterTarget);
                    nextState = default;
                    return false; // refuse, so a caught control does not wedge the scheme
                }
                nextState = VersionSchemeState.Make(1, currentState.Version);
                return true;
            }
            nextState = VersionSchemeState.Make(VersionSchemeState.Rest, currentState.Version + 1);
            return true;
        }

        public override void OnEnteringState(VersionSchemeState fromState, VersionSchemeState toState)
        {
        }

        public override void AfterEnteringState(VersionSchemeState state)
        {
            if (state.Phase == VersionSchemeState.Rest)
            {
                for (int i = 0; i < 20; i++)
                    Thread.Yield();
            }
        }
    }

    private static (int Asked, int Faults) RunMachines(int count)
    {
        using var scheme = new EpochProtectedVersionScheme();
        int faults = 0, asked = 0, stop = 0;
        scheme.StateMachineFaulted += (_, _) => Interlocked.Increment(ref faults);
        var churn = new GuardedThread[2];
        for (int i = 0; i < churn.Length; i++)
        {
            churn[i] = GuardedThread.Start(() =>
            {
                while (Volatile.Read(ref stop) == 0)
                {
                    scheme.Enter(); // the slow path steps whatever machine is current
                    scheme.Leave();
                }
            });
        }
        try
        {
            for (int i = 0; i < count; i++)
            {
                var machine = new TwoStepMachine();
                Assert.True(scheme.ExecuteStateMachine(machine));
                Assert.True(machine.Completion.Wait(GuardedThread.DefaultTimeout), $"machine {i} did not finish");
                asked += machine.AskedAfterTarget;
            }
        }
        finally
        {
            Volatile.Write(ref stop, 1);
            foreach (GuardedThread t in churn)
                t.Join();
        }
        return (asked, faults);
    }

    [Fact]
    public void FinishedMachine_WhileOthersEnterAndLeave_IsNeverAskedForAnotherStep()
    {
        // Two mechanisms keep a finished machine from being asked again: the finished-machine guard, and the step
        // staying owned until AfterEnteringState returns (issue 9). The control turns both off.
        (int Asked, int Faults) control;
        EpochProtectedVersionScheme.DisableFinishedMachineGuardForTesting = true;
        EpochProtectedVersionScheme.DisableStepOwnershipForTesting = true;
        try
        {
            control = RunMachines(200);
        }
        finally
        {
            EpochProtectedVersionScheme.DisableFinishedMachineGuardForTesting = false;
            EpochProtectedVersionScheme.DisableStepOwnershipForTesting = false;
        }
        output.WriteLine($"control (guard and step ownership off): asked after target {control.Asked} times");

        (int Asked, int Faults) real = RunMachines(200);
        output.WriteLine($"real: asked after target {real.Asked} times, {real.Faults} faults");
        Assert.Equal(0, real.Asked);
        Assert.Equal(0, real.Faults);
        Assert.SkipWhen(control.Asked == 0, "inconclusive: the control (finished-machine guard and step ownership off) was never asked after its target");
    }

    [Fact]
    public void AdvanceVersionWithCriticalSection_UnderConcurrentEnterLeave_NeverReportsAFaultForASectionThatRan()
    {
        using var scheme = new EpochProtectedVersionScheme();
        int ran = 0, stop = 0;
        var churn = GuardedThread.Start(() =>
        {
            while (Volatile.Read(ref stop) == 0)
            {
                scheme.Enter();
                scheme.Leave();
            }
        });
        try
        {
            for (int i = 0; i < 5_000; i++)
                scheme.AdvanceVersionWithCriticalSection((_, _) => ran++, spin: true); // throws if faulted
        }
        finally
        {
            Volatile.Write(ref stop, 1);
            churn.Join();
        }
        Assert.Equal(5_000, ran);
        Assert.Equal(5_001, scheme.CurrentState.Version);
    }
}
