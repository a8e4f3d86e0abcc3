using System;
using System.Runtime.CompilerServices;
using System.Threading;
using Xunit;

namespace Epvs.Tests;

/// <summary>
/// A chain of deferred actions, each making a blocking state-machine start on the next of many schemes, whose wait runs
/// the next action (registered just before, past the per-thread drain bound, and so left to the waits): one waiting drain
/// per scheme, and the per-instance waiting bound never applies. About 2,000 levels exhausted a 1.5 MB thread stack (a
/// stack overflow kills the process). Past a per-thread bound a blocking start now throws before it starts anything;
/// the action reports it through <see cref="LightEpoch.DeferredActionFailed"/>, and the chain goes on from the outermost
/// drain. Found while reviewing the waiting-drain residual (session 15). Deterministic, on one thread.
/// </summary>
public class WaitNestingBoundTests
{
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void AChainOfBlockingStartsAcrossManySchemes_NeverExhaustsTheStack(bool control)
    {
        const int Links = 3000;
        var schemes = new EpochProtectedVersionScheme[Links + 1];
        var machines = new GateMachine[Links + 1];
        int tooDeep = 0, otherFailures = 0;
        for (int i = 0; i <= Links; i++)
        {
            schemes[i] = new EpochProtectedVersionScheme();
            machines[i] = new GateMachine();
            schemes[i].Epoch.DeferredActionFailed += (_, e) =>
            {
                if (e.Exception is InvalidOperationException ex && ex.Message.Contains("drains deep on this thread", StringComparison.Ordinal))
                    tooDeep++;
                else
                    otherFailures++;
            };
        }

        int ran = 0;
        bool stackLow = false;
        var started = new bool[Links + 1];
        Action<int>? link = null;
        link = i =>
        {
            machines[i].Gate = true; // the wait for this machine (one level up) may now complete
            ran++;
            if (!RuntimeHelpers.TryEnsureSufficientExecutionStack())
            {
                stackLow = true; // stop rather than kill the test host
                return;
            }
            if (i == Links)
                return;
            schemes[i + 1].Epoch.BumpCurrentEpoch(() => link!(i + 1)); // inline, or (deep) left to the waits
            LightEpoch.ThrowIfTooDeepToBlock("(the test's probe)"); // what the start checks first: nothing starts past it
            started[i + 1] = true;
            schemes[i + 1].ExecuteStateMachine(machines[i + 1], spin: true); // its wait runs the action just registered
        };

        LightEpoch.UnboundedWaitingNestingForTesting = control;
        try
        {
            var worker = new GuardedThread(() => schemes[0].Epoch.BumpCurrentEpoch(() => link(0)), "blocking starts across schemes", 1536 * 1024);
            worker.Start();
            worker.Join();
        }
        finally
        {
            LightEpoch.UnboundedWaitingNestingForTesting = false;
        }

        // Every machine that started completes (a blocking start past the bound throws before it starts one).
        foreach (EpochProtectedVersionScheme scheme in schemes)
            scheme.SignalStepAvailable();
        for (int i = 1; i <= Links; i++)
            Assert.True(!started[i] || machines[i].Completion.Wait(GuardedThread.DefaultTimeout), $"machine {i} did not complete");
        foreach (EpochProtectedVersionScheme scheme in schemes)
            scheme.Dispose();

        if (control)
        {
            // (Near the end of its stack the control may also fail in the runtime's own checks: not counted.)
            Assert.True(stackLow, $"the control's chain never ran low on stack (the check would not catch it; {otherFailures} other failures)");
            return;
        }

        Assert.Equal(0, otherFailures);

        Assert.False(stackLow, $"the stack ran low after {ran} links");
        Assert.Equal(Links + 1, ran); // every action ran
        Assert.InRange(tooDeep, 1, Links); // some blocking starts threw instead of nesting deeper
    }
}
