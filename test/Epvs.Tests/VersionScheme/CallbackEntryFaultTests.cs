using System;
using System.Threading;
using Xunit;

namespace Epvs.Tests;

/// <summary>
/// G6: marking a thread as inside a machine's callback may allocate (a thread-static list grows), so it may fail with
/// OutOfMemoryException. Such a failure must be handled like the callback's own exception. It used to happen before the
/// callback's try: before OnEnteringState it left the step owned and the scheme intermediate for ever (every Enter then
/// waits for ever) and the thread marked as inside the critical section; before AfterEnteringState it left the machine
/// running for ever (every later start got Retry); before GetNextStep it escaped from the start of a machine that stayed
/// published. Deterministic: a test hook fails the chosen call on the starting thread (nobody is protected, so the whole
/// machine runs there).
/// </summary>
public class CallbackEntryFaultTests
{
    [Theory]
    [InlineData(1, 1)] // before GetNextStep: no step taken
    [InlineData(2, 1)] // before OnEnteringState: the step did not happen
    [InlineData(3, 2)] // before AfterEnteringState: the machine ends in the state it entered
    public void AllocationFailureEnteringACallback_FaultsTheMachine_AndTheSchemeMovesOn(int failingCall, long versionAfter)
    {
        var scheme = new EpochProtectedVersionScheme();
        var machine = new CriticalSectionStateMachine((_, _) => { }, -1);
        Exception? start = null;
        StateMachineExecutionStatus status = default;
        VersionSchemeState stateAfter = default;
        Exception? enterAfter = null;
        GuardedThread.Start(() =>
        {
            int me = Environment.CurrentManagedThreadId;
            int calls = 0;
            EpochProtectedVersionScheme.EnterCallbackHookForTesting = () =>
            {
                if (Environment.CurrentManagedThreadId == me && ++calls == failingCall)
                    throw new OutOfMemoryException("simulated: growing the list of callbacks");
            };
            try
            {
                start = Record.Exception(() => status = scheme.TryExecuteStateMachine(machine));
            }
            finally
            {
                EpochProtectedVersionScheme.EnterCallbackHookForTesting = null;
            }
            stateAfter = scheme.CurrentState;
            // The thread must not be left marked as inside the critical section (Enter would refuse), nor the scheme
            // wedged (Enter would wait for ever): only tried once the machine is seen to have ended at rest.
            if (machine.IsCompleted && !stateAfter.IsIntermediate)
                enterAfter = Record.Exception(() => { scheme.Enter(); scheme.Leave(); });
        }, "starter").Join();

        Assert.Null(start);
        Assert.Equal(StateMachineExecutionStatus.Ok, status);
        Assert.True(machine.IsCompleted, $"the machine never ended (state {stateAfter})");
        Assert.IsType<OutOfMemoryException>(machine.Fault);
        Assert.Equal(VersionSchemeState.Make(VersionSchemeState.Rest, versionAfter), stateAfter);
        Assert.Null(enterAfter);
        Assert.True(scheme.AdvanceVersionWithCriticalSection((_, _) => { }, spin: true));
        Assert.Equal(versionAfter + 1, scheme.CurrentState.Version);
        scheme.Dispose();
    }
}
