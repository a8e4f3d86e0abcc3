using System;
using System.Threading;
using Xunit;

namespace Epvs.Tests;

/// <summary>
/// A faulted machine's <see cref="VersionSchemeStateMachine.Completion"/> completes only after the
/// <see cref="EpochProtectedVersionScheme.StateMachineFaulted"/> handlers have returned, so a caller that awaits it and
/// then disposes the scheme (as its docs say) never has a handler (user code) still running after Dispose returned.
/// The machine used to be completed when it was retired, and the event raised after the step was released: a probe's
/// handler was still running after Dispose returned, every time, on an owned and on a shared epoch. Deterministic: the
/// whole machine runs on the starting thread (nobody is protected), and the handler records whether Completion had
/// completed when it ran; the control (<see cref="EpochProtectedVersionScheme.CompleteBeforeFaultedForTesting"/>, the old
/// order) is caught.
/// </summary>
public class FaultedEventOrderTests
{
    [Theory]
    [InlineData(true, false)]
    [InlineData(false, false)]
    [InlineData(true, true)] // the control: the old order
    public void FaultedMachinesCompletion_CompletesAfterItsHandlersReturned(bool ownsEpoch, bool completeFirst)
    {
        using var shared = ownsEpoch ? null : new LightEpoch();
        var scheme = ownsEpoch ? new EpochProtectedVersionScheme() : new EpochProtectedVersionScheme(shared!);
        scheme.CompleteBeforeFaultedForTesting = completeFirst;
        var machine = new CriticalSectionStateMachine((_, _) => throw new InvalidOperationException("the critical section's fault"), -1);
        bool? completedInHandler = null;
        bool handlerReturned = false;
        scheme.StateMachineFaulted += (_, e) =>
        {
            completedInHandler = e.StateMachine.Completion.IsCompleted;
            Volatile.Write(ref handlerReturned, true);
        };

        GuardedThread starter = GuardedThread.Start(() => scheme.TryExecuteStateMachine(machine), "starter");

        // As documented: wait for the machine's Completion, then dispose.
        Assert.True(((IAsyncResult)machine.Completion).AsyncWaitHandle.WaitOne(TimeSpan.FromSeconds(30)));
        bool returnedBeforeCompletion = Volatile.Read(ref handlerReturned);
        scheme.Dispose();
        starter.Join();

        Assert.True(machine.Completion.IsFaulted, $"Completion is {machine.Completion.Status}");
        Assert.IsType<InvalidOperationException>(machine.Fault);
        Assert.NotNull(completedInHandler);
        if (completeFirst)
        {
            Assert.True(completedInHandler, "the control was not caught: Completion completed after the handler ran");
            return;
        }

        Assert.False(completedInHandler, "Completion had completed while the StateMachineFaulted handler still ran: a caller that awaited it and disposed the scheme could have the handler running after Dispose returned");
        Assert.True(returnedBeforeCompletion, "the handler had not returned when Completion completed");
    }

    [Fact]
    public void FaultedMachine_WithoutAHandler_CompletesAsBefore()
    {
        using var scheme = new EpochProtectedVersionScheme();
        var machine = new CriticalSectionStateMachine((_, _) => throw new InvalidOperationException("the critical section's fault"), -1);
        Assert.Equal(StateMachineExecutionStatus.Ok, scheme.TryExecuteStateMachine(machine));
        Assert.True(machine.Completion.IsFaulted, $"Completion is {machine.Completion.Status}");
    }
}
