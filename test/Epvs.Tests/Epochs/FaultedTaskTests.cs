using System;
using System.Collections.Concurrent;
using System.Threading;
using System.Threading.Tasks;
using Xunit;

namespace Epvs.Tests;

/// <summary>
/// A deferred action's task is never left incomplete: giving it the action's exception allocates, and when that fails
/// (OutOfMemoryException) the task used to stay incomplete for ever, so whoever awaited it hung. Now it is canceled, and
/// the failure is reported along with the action's own fault. Deterministic: a test hook fails the preparation of the
/// fault on the thread that runs the action (nobody is protected, so the action runs inside the registering call).
/// </summary>
public class FaultedTaskTests
{
    [Fact]
    public void DeferredAction_WhoseTaskCannotBeGivenItsFault_IsCanceledNotLeftIncomplete()
    {
        using var epoch = new LightEpoch();
        var reported = new ConcurrentQueue<Exception>();
        epoch.DeferredActionFailed += (_, e) => reported.Enqueue(e.Exception);
        Task? task = null;
        GuardedThread.Start(() =>
        {
            int me = Environment.CurrentManagedThreadId;
            TaskFaulting.HookForTesting = () =>
            {
                if (Environment.CurrentManagedThreadId == me)
                    throw new OutOfMemoryException("simulated: giving the faulted action's task its exception");
            };
            try
            {
                task = epoch.BumpCurrentEpochAsync(() => throw new InvalidOperationException("the action's own fault"));
            }
            finally
            {
                TaskFaulting.HookForTesting = null;
            }
        }, "registrar").Join();

        Assert.True(task!.IsCompleted, "the faulted action's task was left incomplete: an awaiter would wait for ever");
        Assert.True(task.IsCanceled, $"the task is {task.Status}");
        Assert.Throws<TaskCanceledException>(() => task.GetAwaiter().GetResult());
        Assert.Contains(reported, e => e is InvalidOperationException);
        Assert.Contains(reported, e => e is OutOfMemoryException);
    }

    [Fact]
    public void DeferredAction_Throws_ItsTaskStillFaultsWithTheActionsException()
    {
        // The fallback changes nothing when memory is there: the task carries the action's exception.
        using var epoch = new LightEpoch();
        var fault = new InvalidOperationException("the action's own fault");
        Task task = epoch.BumpCurrentEpochAsync(() => throw fault);
        Assert.True(task.IsFaulted, $"the task is {task.Status}");
        Assert.Same(fault, task.Exception!.InnerException);
    }
}
