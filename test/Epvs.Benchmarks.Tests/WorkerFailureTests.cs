using System;
using System.Threading;
using Epvs.Persistence.Benchmarks;
using Xunit;

namespace Epvs.Benchmarks.Tests;

/// <summary>
/// The persistence benchmarks' worker threads keep their exception for the joining thread: left unhandled on the worker,
/// it would end the process at once, past the finally blocks and the using of the run's heap directory.
/// </summary>
public sealed class WorkerFailureTests
{
    private static readonly TimeSpan JoinBound = TimeSpan.FromSeconds(30);

    [Fact]
    public void Guard_WorkerThrows_FirstExceptionRethrownOnTheJoiningThread()
    {
        var failure = new WorkerFailure();
        var first = new InsufficientMemoryException("heap full");
        var workers = new[]
        {
            new Thread(failure.Guard(() => throw first)),
            new Thread(failure.Guard(() =>
            {
                // Waits until the guard has recorded the first failure (an event set in the first body's finally could
                // let this one record first: a review's finding). No assert on the worker: a timeout here makes this
                // the first failure, which the test then reports.
                throw SpinWait.SpinUntil(() => failure.HasFailed, JoinBound) ? new InvalidCastException("second") : new TimeoutException("the first worker never threw");
            })),
        };

        foreach (Thread worker in workers)
        {
            worker.Start();
        }

        foreach (Thread worker in workers)
        {
            Assert.True(worker.Join(JoinBound));
        }

        Assert.True(failure.HasFailed);
        var rethrown = Assert.Throws<InvalidOperationException>(failure.ThrowIfFailed);
        Assert.Same(first, rethrown.InnerException);
        Assert.Contains("heap full", rethrown.Message);
    }

    [Fact]
    public void Guard_NoWorkerThrows_NothingToRethrow()
    {
        var failure = new WorkerFailure();
        int ran = 0;
        var worker = new Thread(failure.Guard(() => Interlocked.Increment(ref ran)));
        worker.Start();
        Assert.True(worker.Join(JoinBound));

        failure.ThrowIfFailed();
        Assert.False(failure.HasFailed);
        Assert.Equal(1, ran);
    }
}
