using System;
using System.Runtime.CompilerServices;
using System.Threading;
using Xunit;

namespace Epvs.Tests;

/// <summary>
/// A thread 512 drains deep (deferred actions inside deferred actions, each waiting): what it may still do. Found by the
/// fourth adversarial round on the core (session 15), against the first version of the per-thread waiting bound, which
/// threw from inside any wait that deep.
/// </summary>
public class DeepDrainTests
{
    private const int DeepEnough = 512; // LightEpoch.MaxThreadWaitingDepth

    /// <summary>
    /// An outermost Refresh that deep, with a transition pending behind its region: a Refresh steps aside from its region
    /// to wait, its announcement already moved past the step's; the first version threw from that wait and came back into
    /// the region, which the critical section no longer waited for (G1, G2). A wait that deep now runs only its own step.
    /// The control throws there.
    /// </summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void AnOutermostRefreshDeepInsideDrains_NeverComesBackIntoARegionTheCriticalSectionOverlaps(bool control)
    {
        var scheme = new EpochProtectedVersionScheme();
        int regionOpen = 0; // 1 while the deep thread is inside its region and not inside the Refresh
        int overlaps = 0, criticalSections = 0;
        Exception? refreshFailure = null;

        void Body()
        {
            scheme.Enter();
            Volatile.Write(ref regionOpen, 1);
            // The critical section waits for this region (G5); its step's drain is left to the outermost (past 64 drains).
            Assert.Equal(StateMachineExecutionStatus.Ok, scheme.TryAdvanceVersionWithCriticalSection((_, _) =>
            {
                Interlocked.Increment(ref criticalSections);
                if (Volatile.Read(ref regionOpen) != 0)
                    Interlocked.Increment(ref overlaps);
            }));
            Volatile.Write(ref regionOpen, 0); // a Refresh is a Leave and an Enter: the transition may pass during the call
            LightEpoch.DeepWaitThrowsForTesting = control;
            try
            {
                scheme.Refresh();
            }
            catch (InvalidOperationException e)
            {
                refreshFailure = e;
            }
            finally
            {
                LightEpoch.DeepWaitThrowsForTesting = false;
            }
            Volatile.Write(ref regionOpen, 1); // returned (or thrown) with the region entered

            // Another thread drains the scheme's epoch while the region is open.
            var other = new GuardedThread(() => scheme.Epoch.BumpCurrentEpoch(), "drainer");
            other.Start();
            other.Join();
            Volatile.Write(ref regionOpen, 0);
            scheme.Leave();
        }

        Assert.True(RunDeepInsideDrains(DeepEnough, Body), "the chain never got 512 drains deep");
        Assert.Equal(1, criticalSections);
        if (control)
        {
            Assert.NotNull(refreshFailure);
            Assert.True(overlaps == 1, "the control's critical section did not overlap the region (the check would not catch it)");
        }
        else
        {
            Assert.Null(refreshFailure);
            Assert.True(overlaps == 0, "the critical section ran while the Refresh's region was open");
        }
        scheme.Dispose();
    }

    /// <summary>
    /// A chain of actions that each register an action with the next epoch and dispose it: past 64 drains the registration
    /// is left to the outermost drain, so the Dispose's final run ran it, one level deeper each time; about 1,500 levels
    /// exhausted a 1.5 MB stack (a stack overflow kills the process). A Dispose that deep now throws, disposing nothing
    /// (the action reports it); the pending action runs from the outermost drain, and the chain goes on from there. The
    /// control lifts the per-thread bound.
    /// </summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void AChainOfDisposesInsideFinalRuns_NeverExhaustsTheStack(bool control)
    {
        const int Links = 6000;
        var epochs = new LightEpoch[Links + 1];
        int ran = 0, tooDeep = 0, otherFailures = 0;
        for (int i = 0; i <= Links; i++)
        {
            epochs[i] = new LightEpoch();
            epochs[i].DeferredActionFailed += (_, e) =>
            {
                if (e.Exception is InvalidOperationException ex && ex.Message.Contains("drains deep on this thread", StringComparison.Ordinal))
                    tooDeep++;
                else
                    otherFailures++;
            };
        }

        bool stackLow = false;
        Action<int>? link = null;
        link = i =>
        {
            ran++;
            if (!RuntimeHelpers.TryEnsureSufficientExecutionStack())
            {
                stackLow = true; // stop rather than kill the test host
                return;
            }
            if (i == Links)
                return;
            int next = i + 1;
            epochs[next].BumpCurrentEpoch(() => link!(next)); // inline, or (past 64 drains) left to the outermost drain
            epochs[next].Dispose(); // its final run runs the action left pending, one level deeper
        };

        LightEpoch.UnboundedWaitingNestingForTesting = control;
        try
        {
            var worker = new GuardedThread(() => epochs[0].BumpCurrentEpoch(() => link(0)), "dispose chain", 1536 * 1024);
            worker.Start();
            worker.Join();
        }
        finally
        {
            LightEpoch.UnboundedWaitingNestingForTesting = false;
        }
        foreach (LightEpoch epoch in epochs)
            epoch.Dispose();

        Assert.Equal(0, otherFailures);
        if (control)
        {
            Assert.True(stackLow, "the control's chain never ran low on stack (the check would not catch it)");
            return;
        }
        Assert.False(stackLow, $"the stack ran low after {ran} links");
        Assert.Equal(Links + 1, ran);
        Assert.InRange(tooDeep, 1, Links);
    }

    /// <summary>Runs <paramref name="body"/> inside a chain of deferred actions, each making a blocking start on the next of
    /// many schemes (whose wait runs the next action), once the thread is <paramref name="depth"/> drains deep; returns
    /// whether it got that deep.</summary>
    private static bool RunDeepInsideDrains(int depth, Action body)
    {
        int links = depth + 64;
        var schemes = new EpochProtectedVersionScheme[links + 1];
        var machines = new GateMachine[links + 1];
        for (int i = 0; i <= links; i++)
        {
            schemes[i] = new EpochProtectedVersionScheme();
            machines[i] = new GateMachine();
        }
        bool reached = false, stackLow = false;
        Exception? bodyFailure = null;
        Action<int>? link = null;
        link = i =>
        {
            machines[i].Gate = true;
            if (!RuntimeHelpers.TryEnsureSufficientExecutionStack())
            {
                stackLow = true;
                return;
            }
            if (reached || i == links)
                return;
            if (LightEpoch.ThreadDrainDepthForTesting >= depth)
            {
                reached = true;
                bodyFailure = Record.Exception(body);
                return;
            }
            schemes[i + 1].Epoch.BumpCurrentEpoch(() => link!(i + 1));
            schemes[i + 1].ExecuteStateMachine(machines[i + 1], spin: true);
        };
        var worker = new GuardedThread(() => schemes[0].Epoch.BumpCurrentEpoch(() => link(0)), "deep chain", 16 << 20);
        worker.Start();
        worker.Join();
        foreach (EpochProtectedVersionScheme scheme in schemes)
            scheme.SignalStepAvailable();
        foreach (EpochProtectedVersionScheme scheme in schemes)
            scheme.Dispose();
        Assert.False(stackLow, "the chain ran low on stack");
        Assert.Null(bodyFailure);
        return reached;
    }
}
