using System;
using System.Collections.Generic;
using System.Threading;
using System.Threading.Tasks;
using Xunit;

namespace Epvs.Tests;

/// <summary>
/// The documented limits of the async-flow check (Epvs.LightEpoch.CheckAsyncFlow), found by a probe that ran it as a
/// user would: pinned, so that the README and LightEpoch's remarks stay true.
/// </summary>
[Collection(nameof(AsyncFlowCheckTests))]
public sealed class AsyncFlowCheckLimitTests
{
    private static LightEpoch NewEpoch(bool check)
    {
        bool? saved = LightEpoch.CheckAsyncFlowForTesting;
        LightEpoch.CheckAsyncFlowForTesting = check;
        try
        {
            var epoch = new LightEpoch();
            Assert.Equal(check, epoch.ChecksAsyncFlowForTesting);
            return epoch;
        }
        finally
        {
            LightEpoch.CheckAsyncFlowForTesting = saved;
        }
    }

    /// <summary>
    /// A limit: a task started inside the region inherits the entering flow's marker, so its Leave on the entering thread
    /// (here inlined by RunSynchronously; likewise a Wait that inlines it, or a child whose continuation lands there after
    /// the parent awaited away) is taken for the entering flow's, with the check on as with it off: it ends the parent's
    /// region while the parent is still inside it, and an action that region held back runs (G1); only the parent's own
    /// Leave, afterwards, throws. Documented (README, LightEpoch's remarks): the check is a diagnostic, not a guard.
    /// </summary>
    [Theory]
    [InlineData(true)]
    [InlineData(false)]
    public void AChildTaskStartedInsideTheRegion_LeavingItOnTheEnteringThread_IsNotCaught_AKnownLimitOfTheCheck(bool check)
    {
        LightEpoch epoch = NewEpoch(check);
        int parentInside = 0, ranWhileParentInside = 0;
        Exception? child = null, parentLeave = null;
        GuardedThread.Start(() =>
        {
            epoch.Resume();
            Volatile.Write(ref parentInside, 1);
            epoch.BumpCurrentEpoch(() =>
            {
                if (Volatile.Read(ref parentInside) != 0)
                    Interlocked.Increment(ref ranWhileParentInside);
            });
            var t = new Task(epoch.Suspend); // another flow: a child task, with the parent's ExecutionContext
            t.RunSynchronously();
            child = t.Exception?.InnerException;
            epoch.BumpCurrentEpoch(); // a drain: runs what became safe
            Volatile.Write(ref parentInside, 0);
            parentLeave = Record.Exception(epoch.Suspend);
        }, "parent").Join();

        // Not refused, check or no check: the child's Leave ended the parent's region and the held-back action ran
        // inside it; the parent's own Leave then found nothing to leave.
        Assert.Null(child);
        Assert.Equal(1, ranWhileParentInside);
        Assert.IsType<InvalidOperationException>(parentLeave);
        epoch.Dispose();
    }

    /// <summary>
    /// A limit: an async iterator that holds a region across a yield, consumed on one thread with every MoveNextAsync
    /// completing synchronously, is correct under "protection belongs to a thread" and works with the check off. With it
    /// on, each MoveNextAsync runs in (and restores) its caller's execution context, so the marker written by the first
    /// never reaches the later one that leaves: the iterator's own finally is refused, and the region stays open on the
    /// thread (documented with the async-method case).
    /// </summary>
    [Theory]
    [InlineData(true)]
    [InlineData(false)]
    public void ARegionHeldAcrossAYieldOfAnAsyncIterator_IsRefusedWithTheCheckOn_AKnownLimitOfTheCheck(bool check)
    {
        LightEpoch epoch = NewEpoch(check);
        Exception? failure = null;
        bool protectedAfter = true;

        static async IAsyncEnumerable<int> HoldAcrossYield(LightEpoch epoch)
        {
            epoch.Resume();
            try
            {
                yield return 1;
                yield return 2;
            }
            finally
            {
                epoch.Suspend();
            }
            await Task.CompletedTask;
        }

        GuardedThread.Start(() =>
        {
            failure = Record.Exception(() =>
            {
                IAsyncEnumerator<int> e = HoldAcrossYield(epoch).GetAsyncEnumerator();
                try
                {
                    while (e.MoveNextAsync().AsTask().GetAwaiter().GetResult())
                    {
                    }
                }
                finally
                {
                    e.DisposeAsync().AsTask().GetAwaiter().GetResult();
                }
            });
            protectedAfter = epoch.ThisInstanceProtected();
        }, "consumer").Join();

        if (check)
        {
            // Refused, and the region stays open on the (exited) thread: the epoch cannot be disposed (left to the GC).
            Assert.IsType<InvalidOperationException>(failure);
            Assert.True(protectedAfter);
            return;
        }

        Assert.Null(failure);
        Assert.False(protectedAfter);
        epoch.Dispose();
    }

    /// <summary>
    /// A review's finding: the switch is read for the whole process when the first epoch is created (so that, off, the
    /// check is compiled out); turned on later, it was ignored silently. The next epoch's constructor says so. (The
    /// decision alone: this test process turns the check's test switch on before any epoch, so the late case cannot
    /// arise in it.)
    /// </summary>
    [Theory]
    [InlineData(false, true, true)]
    [InlineData(false, false, false)]
    [InlineData(true, true, false)]
    [InlineData(true, false, false)]
    public void TheSwitchTurnedOnAfterTheFirstEpoch_IsReported(bool mayCheck, bool switchOn, bool throws)
    {
        Exception? e = Record.Exception(() => LightEpoch.ThrowIfSwitchSetTooLate(mayCheck, switchOn));
        if (throws)
            Assert.Contains("after the process's first LightEpoch", Assert.IsType<InvalidOperationException>(e).Message);
        else
            Assert.Null(e);
    }
}
