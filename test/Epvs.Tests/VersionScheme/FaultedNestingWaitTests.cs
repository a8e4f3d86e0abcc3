using System;
using System.Threading;
using Xunit;

namespace Epvs.Tests;

/// <summary>
/// A <see cref="EpochProtectedVersionScheme.StateMachineFaulted"/> handler may start and wait for another transition
/// (documented). A handler that retries a failing transition with AdvanceVersionWithCriticalSection(spin: true) nests one
/// raise per retry; past 16 raises the notice waits for the thread's outermost raise. Once a faulted machine's
/// Completion came only after its handlers, the 17th nested spin waited for a completion that came only after it
/// returned: a hang (a review's finding, before it was committed). Such a machine now completes when its notice is left
/// to the outermost raise. The control (<see cref="EpochProtectedVersionScheme.KeepQueuedMachinesOpenForTesting"/>)
/// hangs, and the test catches it (ending the wait with Thread.Interrupt).
/// </summary>
public class FaultedNestingWaitTests
{
    [Theory]
    [InlineData(false)]
    [InlineData(true)] // the control: a queued notice's machine stays open until it is raised
    public void AHandlerThatRetriesWithSpin_PastTheNestingLimit_DoesNotHang(bool keepQueuedOpen)
    {
        const int Retries = 20;
        using var scheme = new EpochProtectedVersionScheme();
        scheme.KeepQueuedMachinesOpenForTesting = keepQueuedOpen;
        int raised = 0, thrown = 0, interrupted = 0;
        scheme.StateMachineFaulted += (_, e) =>
        {
            if (++raised >= Retries)
                return;
            try
            {
                scheme.AdvanceVersionWithCriticalSection((_, _) => throw new ArithmeticException("retry fails"), spin: true);
            }
            catch (ArithmeticException)
            {
                thrown++;
            }
            catch (ThreadInterruptedException)
            {
                interrupted++;
            }
        };

        var starter = new GuardedThread(() =>
        {
            try
            {
                scheme.AdvanceVersionWithCriticalSection((_, _) => throw new ArithmeticException("first fails"), spin: true);
            }
            catch (ArithmeticException)
            {
            }
            catch (ThreadInterruptedException)
            {
                Interlocked.Increment(ref interrupted);
            }
        }, "starter");
        starter.Start();
        bool returned = starter.TryJoin(TimeSpan.FromSeconds(5));
        while (!returned)
        {
            starter.Interrupt(); // the spin's SpinOnce sleeps now and then: the interrupt ends the wait
            returned = starter.TryJoin(TimeSpan.FromSeconds(1));
        }

        if (keepQueuedOpen)
        {
            Assert.True(interrupted > 0, $"the control was not caught: raised {raised}, thrown {thrown}");
            return;
        }

        Assert.True(interrupted == 0, $"a nested AdvanceVersionWithCriticalSection(spin: true) hung (ended only by Thread.Interrupt, {interrupted} times); raised {raised}, thrown {thrown}");
        Assert.Equal(Retries, raised);
        Assert.Equal(Retries - 1, thrown);
    }
}
