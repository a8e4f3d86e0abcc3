using System;
using System.Threading;
using System.Threading.Tasks;
using Xunit;

namespace Epvs.Tests;

/// <summary>
/// Dispose runs every pending action exactly once, even when handling one action's fault fails (giving its task the
/// exception allocates, so it may throw OutOfMemoryException). That failure used to escape from the run: the actions
/// after it were left pending on a closed epoch (where nothing drains: only a drain that happened to be further up the
/// stack could still run them), the instance id was never given back, and Dispose threw after it had closed the epoch.
/// Deterministic: the pending actions sit behind an action that disposes the epoch, in one drain, and a test hook fails
/// the first fault handling on that thread.
/// </summary>
public class FinalRunFaultTests
{
    [Fact]
    public void Dispose_WhenHandlingAnActionsFaultFails_StillRunsEveryPendingActionOnce()
    {
        var epoch = new LightEpoch();
        int id = epoch.DebugId;
        int ranC = 0, ranD = 0, ranCAtDispose = -1, ranDAtDispose = -1;
        Exception? dispose = null;
        var reported = new System.Collections.Concurrent.ConcurrentQueue<Exception>();
        Task? faulting = null;
        epoch.DeferredActionFailed += (_, e) => reported.Enqueue(e.Exception);
        GuardedThread.Start(() =>
        {
            int me = Environment.CurrentManagedThreadId;
            int failures = 0;
            epoch.Resume();
            // Held back by this thread, so they are all pending when it leaves; its drain runs them in this order.
            epoch.BumpCurrentEpoch(() =>
            {
                TaskFaulting.HookForTesting = () =>
                {
                    if (Environment.CurrentManagedThreadId == me && ++failures == 1)
                        throw new OutOfMemoryException("simulated: completing the faulted action's task");
                };
                try
                {
                    dispose = Record.Exception(epoch.Dispose); // nobody protected: closes, runs the rest
                }
                finally
                {
                    TaskFaulting.HookForTesting = null;
                }
                ranCAtDispose = Volatile.Read(ref ranC);
                ranDAtDispose = Volatile.Read(ref ranD);
            });
            faulting = epoch.BumpCurrentEpochAsync(() => throw new InvalidOperationException("the action's own fault"));
            epoch.BumpCurrentEpoch(() => Interlocked.Increment(ref ranC));
            epoch.BumpCurrentEpoch(() => Interlocked.Increment(ref ranD));
            epoch.Suspend();
        }, "leaver").Join();

        Assert.Equal(1, ranCAtDispose);
        Assert.Equal(1, ranDAtDispose);
        Assert.Equal(1, ranC);
        Assert.Equal(1, ranD);
        Assert.Null(dispose);
        Assert.True(LightEpoch.IsIdFreeForTesting(id), "the closed epoch's instance id was never given back");
        // Both reported: the action's own fault, and the failure to give it to its task (which is canceled instead).
        Assert.Contains(reported, e => e is InvalidOperationException);
        Assert.Contains(reported, e => e is OutOfMemoryException);
        Assert.True(faulting!.IsCanceled, $"the faulted action's task is {faulting.Status}");
    }
}
