using System;
using System.Threading;
using System.Threading.Tasks;
using Xunit;

namespace Epvs.Tests;

/// <summary>
/// A faulted deferred action's task completes only after the <see cref="LightEpoch.DeferredActionFailed"/> handlers have
/// returned, so a caller that awaits the task and then disposes the epoch never has a handler (user code) still running
/// after Dispose returned. The task used to fault first and the handler to run after it, on the thread that ran the
/// action: a probe's handler was still running after Dispose returned, every time. Deterministic: the handler records
/// whether the task had completed when it ran; the control (<see cref="DrainList.FaultTaskBeforeReportForTesting"/>, the
/// old order, set on the thread that runs the action) is caught.
/// </summary>
public class FaultReportOrderTests
{
    [Theory]
    [InlineData(false)]
    [InlineData(true)] // the control: the old order
    public void FaultedActionsTask_CompletesAfterItsHandlersReturned(bool faultTaskFirst)
    {
        var epoch = new LightEpoch();
        Task? task = null;
        bool? taskCompletedInHandler = null;
        bool handlerReturned = false;
        epoch.DeferredActionFailed += (_, _) =>
        {
            taskCompletedInHandler = Volatile.Read(ref task)!.IsCompleted;
            Volatile.Write(ref handlerReturned, true);
        };
        using var entered = new ManualResetEventSlim();
        using var leave = new ManualResetEventSlim();
        GuardedThread holder = GuardedThread.Start(() =>
        {
            DrainList.FaultTaskBeforeReportForTesting = faultTaskFirst;
            try
            {
                epoch.Resume();
                entered.Set();
                leave.Wait();
                epoch.Suspend(); // its drain runs the action, which throws
            }
            finally
            {
                DrainList.FaultTaskBeforeReportForTesting = false;
            }
        }, "holder");
        Assert.True(entered.Wait(TimeSpan.FromSeconds(30)));
        Volatile.Write(ref task, epoch.BumpCurrentEpochAsync(() => throw new InvalidOperationException("the action's fault")));
        Assert.False(task!.IsCompleted); // held back by the holder
        leave.Set();

        // As documented: wait for the task, then dispose.
        Assert.True(((IAsyncResult)task).AsyncWaitHandle.WaitOne(TimeSpan.FromSeconds(30)));
        bool returnedBeforeTheTaskCompleted = Volatile.Read(ref handlerReturned);
        epoch.Dispose();
        holder.Join();

        Assert.True(task.IsFaulted, $"the task is {task.Status}");
        Assert.NotNull(taskCompletedInHandler);
        if (faultTaskFirst)
        {
            Assert.True(taskCompletedInHandler, "the control was not caught: its task completed after the handler ran");
            return;
        }

        Assert.False(taskCompletedInHandler, "the task had completed while the DeferredActionFailed handler still ran: a caller that awaited it and disposed the epoch could have the handler running after Dispose returned");
        Assert.True(returnedBeforeTheTaskCompleted, "the handler had not returned when the task completed");
    }
}
