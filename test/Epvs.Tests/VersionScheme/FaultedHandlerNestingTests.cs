using System;
using System.Threading;
using Xunit;

namespace Epvs.Tests;

/// <summary>
/// A <see cref="EpochProtectedVersionScheme.StateMachineFaulted"/> handler that retries (a handler may start another
/// machine) a machine whose first <see cref="VersionSchemeStateMachine.GetNextStep"/> throws: each retry faults inside the
/// handler's own call and raised the handler again one level deeper, with no drain in between for a drain bound to stop.
/// 20,000 retries overflowed a 1 MB stack at about 1,780 levels (the process died). Found by an adversarial round of
/// session 16. Past 16 raises on a thread a notice now waits for the outermost raise. The control raises every notice at
/// once (on a 16 MB stack, so that it nests without dying).
/// </summary>
public class FaultedHandlerNestingTests
{
    private sealed class FailsAtOnce : VersionSchemeStateMachine
    {
        public override bool GetNextStep(VersionSchemeState current, out VersionSchemeState next) => throw new ArithmeticException("no step");

        public override void OnEnteringState(VersionSchemeState from, VersionSchemeState to)
        {
        }

        public override void AfterEnteringState(VersionSchemeState state)
        {
        }
    }

    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void AHandlerThatRetriesAFailingMachine_NestsABoundedDepth_AndSeesEveryFault(bool control)
    {
        const int Retries = 1_000;
        using var scheme = new EpochProtectedVersionScheme();
        int raised = 0, depth = 0, deepest = 0, wrong = 0;
        scheme.StateMachineFaulted += (_, e) =>
        {
            // (The scheme ignores a handler's exceptions: what goes wrong here is counted, and checked after the join.)
            if (e.Exception is not ArithmeticException)
                wrong++;
            if (++raised >= Retries)
                return; // a bounded retry policy
            deepest = Math.Max(deepest, ++depth);
            try
            {
                if (scheme.TryExecuteStateMachine(new FailsAtOnce()) != StateMachineExecutionStatus.Ok)
                    wrong++;
            }
            catch (Exception)
            {
                wrong++;
            }
            depth--;
        };
        EpochProtectedVersionScheme.UnboundedFaultedNestingForTesting = control;
        try
        {
            var starter = new GuardedThread(() => Assert.Equal(StateMachineExecutionStatus.Ok, scheme.TryExecuteStateMachine(new FailsAtOnce())), "starter", 16 << 20);
            starter.Start();
            starter.Join();
        }
        finally
        {
            EpochProtectedVersionScheme.UnboundedFaultedNestingForTesting = false;
        }

        Assert.Equal(0, wrong);
        Assert.Equal(Retries, raised); // every fault raised, none dropped
        if (control)
            Assert.True(deepest >= Retries - 1, $"the control nested only {deepest} deep (the check would not catch it)");
        else
            Assert.InRange(deepest, 1, 16);
    }
}
