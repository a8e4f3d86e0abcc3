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
    /// <summary>
    /// What stays open (see <see cref="TaskFaulting"/>): an allocation failure inside the runtime after it reserved the
    /// task. The rehearsal makes what the runtime allocates there beforehand, so this guards that it still covers it: the
    /// bytes TrySetException allocates once the task's optional state exists (all of them after its reservation) must not
    /// exceed the rehearsal's, for a shallow and for a deep stack trace. It failed before the rehearsal took the runtime's
    /// shapes (an eight-slot array and the stack-trace copy were 24 bytes short: 312 against 336, 4,280 against 4,304); it
    /// also guards against a runtime update that allocates more there.
    /// </summary>
    [Theory]
    [InlineData(1)]
    [InlineData(64)]
    public void Rehearsal_AllocatesAtLeastWhatTheRuntimeAllocatesAfterReservingTheTask(int stackDepth)
    {
        Exception fault = ThrownAtDepth(stackDepth);
        for (int round = 0; round < 3; round++) // the first round may include one-time allocations of the runtime
        {
            var completion = new TaskCompletionSource<bool>(TaskCreationOptions.RunContinuationsAsynchronously);
            _ = ((IAsyncResult)completion.Task).AsyncWaitHandle;
            long before = GC.GetAllocatedBytesForCurrentThread();
            Assert.True(completion.TrySetException(fault));
            long runtime = GC.GetAllocatedBytesForCurrentThread() - before;
            before = GC.GetAllocatedBytesForCurrentThread();
            TaskFaulting.Rehearse(fault);
            long rehearsal = GC.GetAllocatedBytesForCurrentThread() - before;
            if (round == 2)
                Assert.True(rehearsal >= runtime, $"the rehearsal allocates {rehearsal} B, the runtime {runtime} B after reserving the task");
        }
    }

    private static Exception ThrownAtDepth(int depth)
    {
        try
        {
            Recurse(depth);
        }
        catch (InvalidOperationException e)
        {
            return e;
        }
        throw new InvalidOperationException("unreachable");
    }

    [System.Runtime.CompilerServices.MethodImpl(System.Runtime.CompilerServices.MethodImplOptions.NoInlining)]
    private static void Recurse(int depth)
    {
        if (depth == 0)
            throw new InvalidOperationException("deep");
        Recurse(depth - 1);
    }
}
