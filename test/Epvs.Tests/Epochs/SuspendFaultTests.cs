using System;
using System.Threading;
using Xunit;

namespace Epvs.Tests;

/// <summary>
/// A Suspend in a finally block, while an exception unwinds from the region, releases protection once, runs what it made
/// safe, and does not replace the exception in flight. Its drain allocated when it was the thread's first (the thread's
/// drain-nesting array): an OutOfMemoryException there replaced the region's exception and left the action that only this
/// leave made safe pending until some other thread drained. Now the array is sized when the thread's record is created,
/// before anything is entered. Deterministic: the action is registered by another thread while this one holds it back,
/// and a test hook fails the array's growth from then on, on this thread.
/// </summary>
public class SuspendFaultTests
{
    private sealed class Unwinding : Exception
    {
        public Unwinding() : base("the region's own fault") { }
    }

    /// <summary>Returns what reached the region's catch, whether the thread was protected after it, and whether the action
    /// it held back had run by then.</summary>
    private static (Exception? Caught, bool ProtectedAfter, bool Ran) SuspendInAFinallyAsTheThreadsFirstDrain()
    {
        using var epoch = new LightEpoch();
        using var inside = new ManualResetEventSlim();
        using var registered = new ManualResetEventSlim();
        int ran = 0;
        Exception? caught = null;
        bool protectedAfter = true, ranAfter = false;
        var region = GuardedThread.Start(() =>
        {
            int me = Environment.CurrentManagedThreadId;
            epoch.Resume(); // this thread's first call: its record is created, it never drains
            inside.Set();
            Assert.True(registered.Wait(GuardedThread.DefaultTimeout));
            LightEpoch.DrainNestingGrowHookForTesting = () =>
            {
                if (Environment.CurrentManagedThreadId == me)
                    throw new OutOfMemoryException("simulated: growing the drain-nesting array");
            };
            try
            {
                try
                {
                    throw new Unwinding();
                }
                finally
                {
                    epoch.Suspend();
                }
            }
            catch (Exception ex)
            {
                caught = ex;
            }
            finally
            {
                LightEpoch.DrainNestingGrowHookForTesting = null;
            }
            protectedAfter = epoch.ThisInstanceProtected();
            ranAfter = Volatile.Read(ref ran) == 1;
        }, "region");
        Assert.True(inside.Wait(GuardedThread.DefaultTimeout));
        epoch.BumpCurrentEpoch(() => Interlocked.Increment(ref ran)); // held back by the region
        Assert.Equal(0, Volatile.Read(ref ran));
        registered.Set();
        region.Join();
        return (caught, protectedAfter, ranAfter);
    }

    [Fact]
    public void Suspend_InAFinallyAsTheThreadsFirstDrain_KeepsTheExceptionAndRunsWhatItMadeSafe()
    {
        (Exception? caught, bool protectedAfter, bool ran) = SuspendInAFinallyAsTheThreadsFirstDrain();
        Assert.IsType<Unwinding>(caught);
        Assert.False(protectedAfter);
        Assert.True(ran, "the action only this leave made safe was left pending");
    }

    [Fact]
    public void Suspend_InAFinallyAsTheThreadsFirstDrain_WithTheArrayUnsized_FailsToDrain_Control()
    {
        // The behaviour before: the first drain grew the array, and its failure replaced the region's exception.
        LightEpoch.LazyDrainNestingForTesting = true;
        try
        {
            (Exception? caught, bool protectedAfter, bool ran) = SuspendInAFinallyAsTheThreadsFirstDrain();
            Assert.IsType<OutOfMemoryException>(caught);
            Assert.False(protectedAfter); // released all the same: the slot is cleared before the drain
            Assert.False(ran);
        }
        finally
        {
            LightEpoch.LazyDrainNestingForTesting = false;
        }
    }
}
