using System;
using System.Collections.Concurrent;
using System.Threading;
using System.Threading.Tasks;
using Xunit;

namespace Epvs.Tests;

/// <summary>
/// G6: a faulted machine's <see cref="VersionSchemeStateMachine.Completion"/> is never left incomplete. Giving it the
/// critical section's exception allocates; when that failed (OutOfMemoryException) on the thread retiring the machine,
/// the failure escaped and the task stayed incomplete for ever, so <see cref="EpochProtectedVersionScheme.AdvanceVersionAsync"/>
/// never completed. Now the task is canceled, <see cref="VersionSchemeStateMachine.Fault"/> keeps the exception, and
/// <see cref="EpochProtectedVersionScheme.StateMachineFaulted"/> reports the failure before the fault.
/// Deterministic: a parked thread holds the step, so the caller awaits the machine's task before it ends; the parked
/// thread's leave runs the step, and a test hook fails the preparation of the fault on that thread.
/// </summary>
public class MachineCompletionFaultTests
{
    [Fact]
    public void AdvanceVersionAsync_WhoseMachinesFaultCannotBeGiven_IsCanceledNotLeftIncomplete()
    {
        using var scheme = new EpochProtectedVersionScheme();
        var reported = new ConcurrentQueue<Exception>();
        scheme.StateMachineFaulted += (_, e) => reported.Enqueue(e.Exception);
        Task<bool> advance;
        try
        {
            using var parked = new ParkedThread(() => scheme.Enter(), scheme.Leave);
            int parkedId = parked.ManagedThreadId;
            TaskFaulting.HookForTesting = () =>
            {
                if (Environment.CurrentManagedThreadId == parkedId)
                    throw new OutOfMemoryException("simulated: giving the machine's task its fault");
            };
            advance = scheme.AdvanceVersionAsync((_, _) => throw new InvalidOperationException("the critical section's own fault"));
            Assert.False(advance.IsCompleted); // started, held back by the parked thread, awaiting the machine's task
            parked.Release(); // its leave drains: the step runs, the critical section throws, the machine is retired there
        }
        finally
        {
            TaskFaulting.HookForTesting = null;
        }

        Assert.True(((IAsyncResult)advance).AsyncWaitHandle.WaitOne(GuardedThread.DefaultTimeout),
            "AdvanceVersionAsync never completed: the faulted machine's task was left incomplete");
        Assert.True(advance.IsCanceled, $"the task is {advance.Status}");
        // Both are reported, as a drain reports a faulted action's task it could not fault: first the fault (before the
        // machine completes), then the failure to give the task the fault (it used to be dropped); the version is unchanged.
        Assert.Collection(reported,
            e => Assert.IsType<InvalidOperationException>(e),
            e => Assert.IsType<OutOfMemoryException>(e));
        Assert.Equal(VersionSchemeState.Make(VersionSchemeState.Rest, 1), scheme.CurrentState);
        Assert.True(scheme.AdvanceVersionWithCriticalSection((_, _) => { }, spin: true)); // and the scheme moves on
    }
}
