using System;
using System.Collections.Concurrent;
using System.Threading;
using System.Threading.Tasks;
using Xunit;

namespace Epvs.Tests;

/// <summary>
/// G4: a machine started while the previous machine's step is being released is always stepped. The release cleared the
/// step's ownership with a release store and then looked for an active machine; a starter publishes its machine with a
/// full fence and then reads the ownership. The releaser's load could pass its own store (store buffering): it saw no
/// machine, the starter saw the step still owned, and the new machine never took a step (found by a race of
/// TryAdvanceVersionWithCriticalSection against AdvanceVersionAsync: a machine active at rest, nothing pending, for ever).
/// Deterministic: a test hook starts the new machine inside the release; the control reads before it clears (the order
/// a release store allows), which is the lost interleaving.
/// </summary>
public class StepReleaseRaceTests
{
    /// <summary>Runs one machine; inside its step's release, another thread starts a second. Returns whether the second
    /// had completed when the first call returned (nobody is protected: a stepped machine completes at once).</summary>
    private static bool MachineStartedDuringARelease_Completes(bool legacy)
    {
        using var scheme = new EpochProtectedVersionScheme { LegacyReleaseStepForTesting = legacy };
        var second = new CriticalSectionStateMachine((_, _) => { }, -1);
        StateMachineExecutionStatus secondStatus = default;
        scheme.ReleaseStepHookForTesting = () =>
        {
            scheme.ReleaseStepHookForTesting = null;
            GuardedThread.Start(() => secondStatus = scheme.TryExecuteStateMachine(second), "second starter").Join();
        };
        Assert.Equal(StateMachineExecutionStatus.Ok, scheme.TryAdvanceVersionWithCriticalSection((_, _) => { }));
        Assert.Equal(StateMachineExecutionStatus.Ok, secondStatus);
        bool completed = second.IsCompleted;
        if (!completed)
            scheme.SignalStepAvailable(); // the stranded machine (control): step it so the scheme can be disposed
        Assert.True(second.IsCompleted);
        Assert.Equal(VersionSchemeState.Make(VersionSchemeState.Rest, 3), scheme.CurrentState);
        return completed;
    }

    [Fact]
    public void MachineStartedWhileTheLastStepIsReleased_IsSteppedWithNoFurtherCalls()
    {
        Assert.True(MachineStartedDuringARelease_Completes(legacy: false), "the machine started during the release was never stepped");
    }

    [Fact]
    public void MachineStartedWhileTheLastStepIsReleased_ReadBeforeTheClear_IsStranded_Control()
    {
        Assert.False(MachineStartedDuringARelease_Completes(legacy: true));
    }

    [Fact]
    public void TryAdvanceRacingAdvanceVersionAsync_EveryMachineCompletes()
    {
        // The race that found it, on real hardware (before the fix it stranded a machine within a few rounds here). Bounded:
        // 200 rounds of 2 x 1,000 starts; every task gets 30 s.
        for (int round = 0; round < 200; round++)
        {
            using var scheme = new EpochProtectedVersionScheme();
            var tasks = new ConcurrentQueue<Task<bool>>();
            using var go = new Barrier(2);
            var tries = GuardedThread.Start(() =>
            {
                go.SignalAndWait(GuardedThread.DefaultTimeout);
                for (int i = 0; i < 1_000; i++)
                    scheme.TryAdvanceVersionWithCriticalSection((_, _) => { });
            }, "try advance");
            var asyncs = GuardedThread.Start(() =>
            {
                go.SignalAndWait(GuardedThread.DefaultTimeout);
                for (int i = 0; i < 1_000; i++)
                    tasks.Enqueue(scheme.AdvanceVersionAsync((_, _) => { }));
            }, "advance async");
            tries.Join();
            asyncs.Join();
            foreach (Task<bool> t in tasks)
            {
                Assert.True(((IAsyncResult)t).AsyncWaitHandle.WaitOne(GuardedThread.DefaultTimeout),
                    $"round {round}: an AdvanceVersionAsync never completed; state {scheme.CurrentState}, active machine to " +
                    $"{scheme.ActiveStateMachine?.ActualToVersion} never stepped");
                Assert.True(t.Result);
            }
        }
    }
}
