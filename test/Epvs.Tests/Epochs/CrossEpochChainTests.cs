using System;
using System.Runtime.CompilerServices;
using Xunit;

namespace Epvs.Tests;

/// <summary>
/// A chain of deferred actions, each registering the next with another of many epochs (one per shard, say), with
/// nobody protected: each registration runs its action at once, inside the registering drain. The inline limit was
/// counted per epoch, so the chain nested 16 drains per epoch on one stack, and 128 epochs overflowed a 1.5 MB thread
/// stack (the process died). Drains of all epochs together are now bounded per thread; past the bound a drain is left
/// to the outermost one on the thread, which runs it before it returns, so the chain still runs to its end inside the
/// first registration.
/// </summary>
public class CrossEpochChainTests
{
    private const int ThreadLimit = 64; // LightEpoch.MaxThreadDrainDepth

    private sealed class Chain
    {
        public LightEpoch[] Epochs = Array.Empty<LightEpoch>();
        public int Remaining;
        public int Ran;
        public int Next;
        public bool StackNearlyExhausted;

        public void Link()
        {
            Ran++;
            if (!RuntimeHelpers.TryEnsureSufficientExecutionStack())
            {
                StackNearlyExhausted = true; // stop rather than kill the test host
                return;
            }
            if (--Remaining > 0)
                Epochs[Next++ % Epochs.Length].BumpCurrentEpoch(Link);
        }
    }

    /// <summary>Runs a chain of <paramref name="links"/> actions across <paramref name="epochs"/> epochs on a thread with a
    /// 1.5 MB stack; returns how many ran inside the first registration, and the deepest drain nesting on the thread.</summary>
    private static (int Ran, int Deepest, bool NearlyExhausted) RunChain(int epochs, int links, bool control)
    {
        var chain = new Chain { Remaining = links, Epochs = new LightEpoch[epochs] };
        for (int i = 0; i < epochs; i++)
            chain.Epochs[i] = new LightEpoch();
        int ranInsideFirst = 0;
        int deepest = 0;
        LightEpoch.RecordDrainDepthForTesting = true;
        LightEpoch.PerInstanceDrainDepthOnlyForTesting = control;
        try
        {
            var worker = new GuardedThread(() =>
            {
                LightEpoch.t_maxThreadDrainDepthForTesting = 0;
                chain.Epochs[chain.Next++ % epochs].BumpCurrentEpoch(chain.Link);
                ranInsideFirst = chain.Ran;
                deepest = LightEpoch.t_maxThreadDrainDepthForTesting;
            }, "chain across epochs", 1536 * 1024);
            worker.Start();
            worker.Join();
        }
        finally
        {
            LightEpoch.RecordDrainDepthForTesting = false;
            LightEpoch.PerInstanceDrainDepthOnlyForTesting = false;
        }
        foreach (LightEpoch epoch in chain.Epochs)
            epoch.Dispose();
        return (ranInsideFirst, deepest, chain.StackNearlyExhausted);
    }

    [Fact]
    public void AChainAcrossManyEpochs_StaysWithinTheThreadBound_AndRunsToItsEnd()
    {
        (int ran, int deepest, bool exhausted) = RunChain(epochs: 256, links: 20_000, control: false);
        Assert.False(exhausted, "the stack was nearly exhausted");
        Assert.Equal(20_000, ran);
        Assert.InRange(deepest, 1, ThreadLimit);
    }

    [Fact]
    public void BoundingEachEpochOnly_IsCaught()
    {
        // 32 epochs: deep enough to pass the thread bound many times over, shallow enough not to overflow the stack.
        (int ran, int deepest, bool exhausted) = RunChain(epochs: 32, links: 5_000, control: true);
        Assert.False(exhausted);
        Assert.Equal(5_000, ran);
        Assert.True(deepest > ThreadLimit, $"the control nested only {deepest} drains");
    }

    /// <summary>A machine whose phase-1 step waits for <see cref="Gate"/>; it gives up after <see cref="Patience"/> polls of
    /// that step without it (and says so), so that a test of a wait that never ends ends. A wait that runs the action it
    /// waits for opens the gate within its first few polls (the action runs in its first drain).</summary>
    private sealed class GatedMachine : VersionSchemeStateMachine
    {
        private const int Patience = 2_000;
        private int polls;

        public volatile bool Gate;

        public volatile bool GaveUp;

        public override bool GetNextStep(VersionSchemeState currentState, out VersionSchemeState nextState)
        {
            if (currentState.Phase == 1 && !Gate)
            {
                if (++polls < Patience)
                {
                    nextState = default;
                    return false;
                }
                GaveUp = true;
            }
            nextState = currentState.Phase + 1 >= 2
                ? VersionSchemeState.Make(VersionSchemeState.Rest, ActualToVersion)
                : VersionSchemeState.Make((byte)(currentState.Phase + 1), currentState.Version);
            return true;
        }

        public override void OnEnteringState(VersionSchemeState fromState, VersionSchemeState toState)
        {
        }

        public override void AfterEnteringState(VersionSchemeState state)
        {
        }
    }

    /// <summary>
    /// Past the thread bound, an action registered with another epoch (Y) is left to the outermost drain on the thread;
    /// if the thread then waits in a loop for it there (a blocking machine whose step the action releases), that
    /// outermost drain is stopped under the wait: the first version of the bound left the wait spinning for ever (unless
    /// another thread happened to drain Y). A waiting thread now runs the drains it left. The control does not.
    /// </summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void AWaitDeepInsideDrains_RunsTheDrainsItLeftToTheOutermost(bool control)
    {
        using var y = new LightEpoch();
        bool gaveUp = WaitBelowAChainOfDrains(
            (_, machine, _) => y.BumpCurrentEpoch(() => machine.Gate = true), // past the bound: left to the outermost drain
            on => LightEpoch.WaitIgnoresDrainsLeftToTheOutermostForTesting = on,
            control);
        Assert.Equal(control, gaveUp);
    }

    /// <summary>
    /// Past the thread bound, a registration with an epoch that already has a drain further up this thread's stack (here
    /// the chain's first epoch) is refused and left to that drain, which looks again when control returns to it. If the
    /// thread then waits in a loop for the action (a blocking machine whose step the action signals), that drain is
    /// stopped under the wait, and the epoch was not on the list the wait runs: the wait spun until another thread drained
    /// the epoch, for ever when nobody else did (G4). The control leaves the refused drain to the outer one only.
    /// </summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void AWaitDeepInsideDrains_RunsARefusedDrainOfAnEpochDrainingUpTheStack(bool control)
    {
        bool gaveUp = WaitBelowAChainOfDrains(
            (epochs, machine, scheme) => epochs[0].BumpCurrentEpoch(() => // its outermost drain is at the bottom of this stack
            {
                machine.Gate = true;
                scheme.SignalStepAvailable();
            }),
            on => LightEpoch.RefusedDrainOnlyAsksTheOuterOneForTesting = on,
            control);
        Assert.Equal(control, gaveUp);
    }

    /// <summary>
    /// Nests drains of <see cref="ThreadLimit"/> epochs on one thread (a chain of actions, nobody protected), then at the
    /// bottom registers with <paramref name="register"/> the action that opens a gated machine's gate, and waits for the
    /// machine (a blocking start), with the test-only switch <paramref name="setControl"/> set to <paramref name="control"/>.
    /// Returns whether the wait gave up (it polled the machine's step past its patience: the action never ran meanwhile).
    /// </summary>
    private static bool WaitBelowAChainOfDrains(Action<LightEpoch[], GatedMachine, EpochProtectedVersionScheme> register, Action<bool> setControl, bool control)
    {
        var epochs = new LightEpoch[ThreadLimit + 2];
        for (int i = 0; i < epochs.Length; i++)
            epochs[i] = new LightEpoch();
        var scheme = new EpochProtectedVersionScheme();
        var machine = new GatedMachine();
        int level = 0;
        Action? link = null;
        link = () =>
        {
            if (++level < ThreadLimit)
            {
                epochs[level].BumpCurrentEpoch(link!);
                return;
            }
            register(epochs, machine, scheme);
            scheme.ExecuteStateMachine(machine, spin: true); // waits, deep inside drains, for that action
        };
        setControl(control);
        try
        {
            var worker = new GuardedThread(() => epochs[0].BumpCurrentEpoch(link), "wait deep inside drains", 16 << 20);
            worker.Start();
            worker.Join();
        }
        finally
        {
            setControl(false);
        }

        Assert.True(machine.Gate, "the action never ran");
        foreach (LightEpoch epoch in epochs)
            epoch.Dispose();
        scheme.Dispose();
        return machine.GaveUp;
    }

    /// <summary>The same past the per-instance inline limit: 16 nested drains of one epoch, a registration with it (refused,
    /// left to its outermost drain), then a wait for that action on a scheme of another epoch.</summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void AWaitPastTheInlineLimit_RunsARefusedDrainOfTheEpochDrainingUpTheStack(bool control)
    {
        var x = new LightEpoch();
        var scheme = new EpochProtectedVersionScheme();
        var machine = new GatedMachine();
        int level = 0;
        Action? link = null;
        link = () =>
        {
            if (++level < 16) // LightEpoch.MaxInlineDrainDepth
            {
                x.BumpCurrentEpoch(link!);
                return;
            }
            x.BumpCurrentEpoch(() =>
            {
                machine.Gate = true;
                scheme.SignalStepAvailable();
            });
            scheme.ExecuteStateMachine(machine, spin: true);
        };
        RunRefusingDrains(() => x.BumpCurrentEpoch(link), control);

        Assert.Equal(control, machine.GaveUp);
        x.Dispose();
        scheme.Dispose();
    }

    private static void RunRefusingDrains(Action start, bool control)
    {
        LightEpoch.RefusedDrainOnlyAsksTheOuterOneForTesting = control;
        try
        {
            var worker = new GuardedThread(start, "wait below a refused drain", 16 << 20);
            worker.Start();
            worker.Join();
        }
        finally
        {
            LightEpoch.RefusedDrainOnlyAsksTheOuterOneForTesting = false;
        }
    }
}
