using System;
using System.Threading;
using Xunit;

namespace Epvs.Tests;

/// <summary>
/// A Resume that throws has entered nothing, also when the failure comes after it announced. When a bump slips in
/// between reading the epoch and announcing it, Resume raises its announcement and drains (the bumper may have left its
/// action to it); that drain allocates (this thread's drain-nesting array, on its first drain), and an
/// OutOfMemoryException there used to escape with the level counted and the slot announced. The caller, told Resume
/// failed, never suspends: the slot held back every later action for ever, and the epoch could never be disposed.
/// Now the array is sized when the thread's record is created (before anything is entered), and a drain that fails all
/// the same takes the level back. Deterministic: a test hook moves the epoch between the slow path's claim and its check,
/// another fails the growth (reached with the array left unsized, <see cref="LightEpoch.LazyDrainNestingForTesting"/>).
/// </summary>
public class ResumeFaultTests
{
    /// <summary>
    /// A thread's first Resume (the slow path) claims a slot, the epoch moves on (hook), and the drain its raised
    /// announcement runs fails to allocate. A parked thread holds an action back meanwhile, so there is something to
    /// drain. Returns what Resume threw, whether the thread was protected after it, whether an action registered once
    /// everyone else has left runs at once, and whether the epoch can be disposed then.
    /// </summary>
    private static (Exception? Resume, bool ProtectedAfter, bool LaterActionRan, bool Disposed) ResumeWhoseDrainFailsToAllocate(bool lazyNesting)
    {
        LightEpoch.LazyDrainNestingForTesting = lazyNesting;
        try
        {
            return ResumeWhoseDrainFailsToAllocate();
        }
        finally
        {
            LightEpoch.LazyDrainNestingForTesting = false;
        }
    }

    private static (Exception? Resume, bool ProtectedAfter, bool LaterActionRan, bool Disposed) ResumeWhoseDrainFailsToAllocate()
    {
        var epoch = new LightEpoch();
        int held = 0, later = 0;
        Exception? resume = null;
        bool protectedAfter = false;
        using (var parked = new ParkedThread(epoch.Resume, epoch.Suspend))
        {
            epoch.BumpCurrentEpoch(() => Interlocked.Increment(ref held)); // pending while the parked thread stays
            GuardedThread.Start(() =>
            {
                int me = Environment.CurrentManagedThreadId;
                bool armed = false;
                LightEpoch.DrainNestingGrowHookForTesting = () =>
                {
                    if (armed && Environment.CurrentManagedThreadId == me)
                        throw new OutOfMemoryException("simulated: growing the drain-nesting array");
                };
                epoch.ResumeSlowAfterClaimHookForTesting = () =>
                {
                    epoch.IncrementEpoch(); // a bump between the epoch read and the announcement (no drain of its own)
                    armed = true;
                };
                try
                {
                    resume = Record.Exception(epoch.Resume);
                }
                finally
                {
                    LightEpoch.DrainNestingGrowHookForTesting = null;
                    epoch.ResumeSlowAfterClaimHookForTesting = null;
                }
                protectedAfter = epoch.ThisInstanceProtected();
                if (resume is null)
                    epoch.Suspend(); // it entered: leave, as its caller would
            }, "resumer").Join();
        }
        Assert.Equal(1, held); // the parked thread's leave ran it
        epoch.BumpCurrentEpoch(() => Interlocked.Increment(ref later));
        return (resume, protectedAfter, Volatile.Read(ref later) == 1, epoch.TryDispose());
    }

    [Fact]
    public void Resume_WhoseDrainAfterAnnouncingWouldGrowTheNestingArray_AllocatesNothingThereAndEnters()
    {
        (Exception? resume, bool protectedAfter, bool laterRan, bool disposed) = ResumeWhoseDrainFailsToAllocate(lazyNesting: false);
        Assert.Null(resume);
        Assert.True(protectedAfter);
        Assert.True(laterRan, "an action registered after everyone left is held back");
        Assert.True(disposed, "a slot is still held after every thread left");
    }

    [Fact]
    public void Resume_WhoseDrainAfterAnnouncingFailsToAllocate_EntersNothing()
    {
        (Exception? resume, bool protectedAfter, bool laterRan, bool disposed) = ResumeWhoseDrainFailsToAllocate(lazyNesting: true);
        Assert.IsType<OutOfMemoryException>(resume);
        Assert.False(protectedAfter, "Resume threw, yet the thread stayed protected: its caller will never suspend");
        Assert.True(laterRan, "an action registered after everyone left is held back by the failed Resume's slot");
        Assert.True(disposed, "the epoch cannot be disposed: the failed Resume's slot counts as a protected thread");
    }

    [Fact]
    public void Resume_WhoseDrainAfterAnnouncingFailsToAllocate_KeepsTheLevel_Control()
    {
        // The behaviour before: the level stayed counted and the slot announced, holding every later action back.
        LightEpoch.KeepLevelWhenResumeDrainFailsForTesting = true;
        try
        {
            (Exception? resume, bool protectedAfter, bool laterRan, bool disposed) = ResumeWhoseDrainFailsToAllocate(lazyNesting: true);
            Assert.IsType<OutOfMemoryException>(resume);
            Assert.True(protectedAfter);
            Assert.False(laterRan);
            Assert.False(disposed);
        }
        finally
        {
            LightEpoch.KeepLevelWhenResumeDrainFailsForTesting = false;
        }
    }
}
