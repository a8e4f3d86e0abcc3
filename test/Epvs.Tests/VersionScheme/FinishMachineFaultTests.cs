using System;
using Xunit;

namespace Epvs.Tests;

/// <summary>
/// G6: retiring a machine allocates (completing its task, the fault's event data), so it may fail with
/// OutOfMemoryException. The step must be released all the same. It used to be released only after the machine was
/// retired, so such a failure left the step owned for ever: every later machine started (Ok) and never took a step.
/// Deterministic: a test hook fails the retirement on the starting thread (nobody is protected, so the whole machine runs
/// there); the failure escapes the step, which is a deferred action, so it is reported through DeferredActionFailed.
/// </summary>
public class FinishMachineFaultTests
{
    [Theory]
    [InlineData(true)] // the critical section throws: retired with its fault (a StateMachineFaulted handler listens)
    [InlineData(false)] // the machine reaches its target: retired without a fault
    public void AllocationFailureRetiringAMachine_LetsTheNextMachineRun(bool criticalSectionThrows)
    {
        var scheme = new EpochProtectedVersionScheme();
        scheme.StateMachineFaulted += (_, _) => { };
        Exception? reported = null;
        scheme.Epoch.DeferredActionFailed += (_, e) => reported ??= e.Exception;
        var first = new CriticalSectionStateMachine((_, _) =>
        {
            if (criticalSectionThrows)
                throw new InvalidOperationException("the critical section's own fault");
        }, -1);
        var next = new CriticalSectionStateMachine((_, _) => { }, -1);
        StateMachineExecutionStatus nextStatus = default;
        GuardedThread.Start(() =>
        {
            int me = Environment.CurrentManagedThreadId;
            int calls = 0;
            EpochProtectedVersionScheme.FinishMachineHookForTesting = () =>
            {
                if (Environment.CurrentManagedThreadId == me && ++calls == 1)
                    throw new OutOfMemoryException("simulated: retiring the machine");
            };
            try
            {
                Assert.Equal(StateMachineExecutionStatus.Ok, scheme.TryExecuteStateMachine(first));
            }
            finally
            {
                EpochProtectedVersionScheme.FinishMachineHookForTesting = null;
            }
            nextStatus = scheme.TryExecuteStateMachine(next);
        }, "starter").Join();

        long afterFirst = criticalSectionThrows ? 1 : 2;
        Assert.True(first.IsCompleted);
        Assert.IsType<OutOfMemoryException>(reported);
        Assert.Equal(StateMachineExecutionStatus.Ok, nextStatus);
        Assert.True(next.IsCompleted, $"the next machine never took a step (state {scheme.CurrentState})");
        Assert.Equal(VersionSchemeState.Make(VersionSchemeState.Rest, afterFirst + 1), scheme.CurrentState);
        scheme.Dispose();
    }
}
