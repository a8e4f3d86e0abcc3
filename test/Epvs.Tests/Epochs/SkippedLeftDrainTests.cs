using System;
using System.Runtime.CompilerServices;
using System.Threading;
using Xunit;

namespace Epvs.Tests;

/// <summary>
/// A wait deep inside drains runs the drains left to the outermost one (RunDrainsLeftWhileWaiting), but not those of an
/// instance already 256 drains deep on the thread (MaxWaitingDrainDepth). Such an instance used to be dropped from the
/// list: a shallower wait further up the stack, waiting for one of its actions, no longer found it, and the instance's
/// own drains up the stack are stopped under those waits, so the wait spun until another thread drained it — for ever
/// when nobody else used it (G4). It now stays on the list. Found by the second adversarial round on the core (session
/// 15). Deterministic on one thread (with a large stack): a chain of actions on epoch e, each making a blocking start on
/// scheme f (whose gated machine is active), nests e's drains through those waits; at depth 256 the action registers the
/// one that opens the gate (refused, left to the list) and then makes a wait that pops e and skips it, and is cancelled.
/// </summary>
public class SkippedLeftDrainTests
{
    private const int WaitingLimit = 256; // LightEpoch.MaxWaitingDrainDepth

    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void AWaitShallowerThanASkippedOne_StillRunsTheDrainLeftToTheOutermost(bool control)
    {
        var e = new LightEpoch(); // the chain's epoch: nobody else drains it
        var f = new EpochProtectedVersionScheme(); // the blocking starts wait for f's gated machine
        var g = new EpochProtectedVersionScheme(); // the deepest wait: an Enter(token) on g, cancelled
        var gated = new GateMachine();
        using var cancel = new CancellationTokenSource();
        var holder = new ParkedThread(() => g.Enter(), g.Leave);
        Assert.Equal(StateMachineExecutionStatus.Ok, g.TryAdvanceVersionWithCriticalSection((_, _) => { }));
        Assert.Equal(StateMachineExecutionStatus.Ok, f.TryExecuteStateMachine(gated));

        int deepestAction = WaitingLimit - 1; // action k runs at e's drain depth k + 1
        int starts = 0, failures = 0, cancelled = 0, deepestDrain = 0;
        bool stackLow = false;
        Action<int>? link = null;
        link = k =>
        {
            if (!RuntimeHelpers.TryEnsureSufficientExecutionStack())
            {
                stackLow = true;
                return;
            }
            if (k == deepestAction)
            {
                // Refused (e is 256 deep here): left to the list.
                e.BumpCurrentEpoch(() =>
                {
                    gated.Gate = true;
                    f.SignalStepAvailable();
                });
                deepestDrain = LightEpoch.t_maxDrainDepthForTesting;
                // A wait whose first turn pops e from the list (256 deep: skipped), then is cancelled.
                g.SteppedAsideWaitHookForTesting = cancel.Cancel;
                try
                {
                    g.Enter(cancel.Token);
                    g.Leave();
                }
                catch (OperationCanceledException)
                {
                    cancelled++;
                }
                g.SteppedAsideWaitHookForTesting = null;
                return;
            }
            e.BumpCurrentEpoch(() => link!(k + 1)); // inline up to 16 deep, then refused and left to the list
            try
            {
                f.AdvanceVersionWithCriticalSection((_, _) => { }); // blocks while the gated machine is active
                starts++;
            }
            catch (Exception)
            {
                failures++;
            }
        };

        LightEpoch.RecordDrainDepthForTesting = true;
        LightEpoch.SkippedLeftDrainDroppedForTesting = control;
        bool stuck;
        try
        {
            var worker = new GuardedThread(() =>
            {
                LightEpoch.t_maxDrainDepthForTesting = 0;
                e.BumpCurrentEpoch(() => link(0));
            }, "waits nested in e's drains", 256 << 20);
            worker.Start();
            stuck = !worker.TryJoin(control ? TimeSpan.FromSeconds(2) : GuardedThread.DefaultTimeout);
            if (stuck)
            {
                // A drain of e from this thread runs the stranded action.
                Assert.True(Bounded.TryWaitUntil(() => { e.BumpCurrentEpoch(); return worker.TryJoin(TimeSpan.FromMilliseconds(10)); }, GuardedThread.DefaultTimeout));
            }
        }
        finally
        {
            LightEpoch.RecordDrainDepthForTesting = false;
            LightEpoch.SkippedLeftDrainDroppedForTesting = false;
            holder.Dispose();
        }

        Assert.False(stackLow, "the stack ran low");
        Assert.Equal(1, cancelled);
        Assert.Equal(WaitingLimit, deepestDrain); // the skip happened where it was meant to
        Assert.Equal(control, stuck);
        Assert.Equal(0, failures);
        Assert.Equal(deepestAction, starts);
        e.Dispose();
        f.Dispose();
        g.Dispose();
    }
}
