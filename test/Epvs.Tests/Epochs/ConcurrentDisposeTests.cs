using System;
using System.Threading;
using Xunit;

namespace Epvs.Tests;

/// <summary>
/// A Dispose racing another Dispose returns only once the disposal is complete (the pending actions run, the instance
/// retired): it used to return as soon as the first had closed the epoch, while that one still ran the actions. The
/// order is fixed by the hook that runs on the first Dispose once the epoch is Closed, before its final run; the control
/// (<see cref="LightEpoch.LegacyConcurrentDisposeForTesting"/>, the behaviour before) must be caught.
/// </summary>
public class ConcurrentDisposeTests
{
    private readonly ITestOutputHelper output;

    public ConcurrentDisposeTests(ITestOutputHelper output) => this.output = output;

    /// <summary>Returns whether a second Dispose, started while the first was between closing the epoch and completing,
    /// returned before the first completed.</summary>
    private static bool SecondDisposeReturnsBeforeTheFirstCompletes(bool legacy)
    {
        var epoch = new LightEpoch { LegacyConcurrentDisposeForTesting = legacy };
        using var waiting = new ManualResetEventSlim();
        using var returned = new ManualResetEventSlim();
        bool returnedEarly = false;
        GuardedThread? second = null;
        epoch.DisposeWaitsHookForTesting = waiting.Set;
        epoch.ClosedHookForTesting = () =>
        {
            second = GuardedThread.Start(() =>
            {
                epoch.Dispose();
                returned.Set();
            });
            int which = WaitHandle.WaitAny([waiting.WaitHandle, returned.WaitHandle], GuardedThread.DefaultTimeout);
            Assert.NotEqual(WaitHandle.WaitTimeout, which);
            returnedEarly = which == 1;
        };
        epoch.Dispose();
        second!.Join();
        Assert.True(returned.IsSet);
        return returnedEarly;
    }

    [Fact]
    public void SecondDispose_WhileTheFirstRunsTheFinalActions_ReturnsOnlyOnceItCompleted()
    {
        bool control = SecondDisposeReturnsBeforeTheFirstCompletes(legacy: true);
        Assert.False(SecondDisposeReturnsBeforeTheFirstCompletes(legacy: false), "a second Dispose returned before the disposal was complete");
        Assert.SkipWhen(!control, "inconclusive: the control (a Dispose that returns once the epoch is closed) was not caught");
    }

    /// <summary>An action of the final run (here: the hook, on the same thread, at the same point) disposing its own epoch
    /// cannot wait for the Dispose it is inside: it is refused loudly; TryDispose answers false. It used to return as if
    /// the epoch were disposed.</summary>
    [Fact]
    public void DisposeFromInsideTheFinalRun_Throws_TryDisposeReturnsFalse_AndTheOuterDisposeCompletes()
    {
        var epoch = new LightEpoch();
        Exception? nested = null;
        bool? nestedTry = null;
        int ran = 0;
        epoch.ClosedHookForTesting = () =>
        {
            nested = Record.Exception(epoch.Dispose);
            nestedTry = epoch.TryDispose();
        };
        using (var parked = new ParkedThread(epoch.Resume, epoch.Suspend))
        {
            epoch.BumpCurrentEpoch(() => ran++);
        }
        epoch.Dispose();
        output.WriteLine($"nested Dispose: {nested?.Message}");
        Assert.IsType<InvalidOperationException>(nested);
        Assert.Contains("own Dispose", nested!.Message, StringComparison.Ordinal);
        Assert.False(nestedTry);
        Assert.Equal(1, ran);
        Assert.Throws<ObjectDisposedException>(epoch.Resume);
        epoch.Dispose(); // complete: does nothing
        Assert.True(epoch.TryDispose());
    }

    /// <summary>A Dispose that waits for another one is interruptible: it throws, having changed nothing, and the first
    /// one completes.</summary>
    [Fact]
    public void SecondDispose_InterruptedWhileItWaits_ThrowsAndTheFirstCompletes()
    {
        var epoch = new LightEpoch();
        using var waiting = new ManualResetEventSlim();
        Exception? secondFailure = null;
        GuardedThread? second = null;
        epoch.DisposeWaitsHookForTesting = waiting.Set;
        epoch.ClosedHookForTesting = () =>
        {
            second = GuardedThread.Start(() => secondFailure = Record.Exception(epoch.Dispose));
            Assert.True(waiting.Wait(GuardedThread.DefaultTimeout));
            second.Interrupt();
            second.Join();
        };
        epoch.Dispose();
        Assert.IsType<ThreadInterruptedException>(secondFailure);
        Assert.Throws<ObjectDisposedException>(epoch.Resume);
        epoch.Dispose();
    }
    /// <summary>
    /// TryDispose never throws, also when the thread has an interrupt pending and waits for another Dispose that is
    /// deciding (Closing): the wait used to sleep interruptibly and let ThreadInterruptedException out. The first Dispose
    /// holds Closing (its hook) until the TryDispose has spun past the first sleeps, or has thrown.
    /// </summary>
    private static (Exception? Failure, bool? Result, bool InterruptKept) TryDisposeWithAnInterruptPendingWhileClosing(bool legacy)
    {
        var epoch = new LightEpoch { InterruptibleTryDisposeForTesting = legacy };
        using var spunLong = new ManualResetEventSlim();
        using var done = new ManualResetEventSlim();
        int turns = 0;
        Exception? failure = null;
        bool? result = null;
        bool kept = false;
        GuardedThread? other = null;
        epoch.DisposeWaitsHookForTesting = () =>
        {
            if (++turns == 60) // SpinWait sleeps from its 20th turn on
                spunLong.Set();
        };
        epoch.ClosingHookForTesting = () =>
        {
            epoch.ClosingHookForTesting = null;
            other = GuardedThread.Start(() =>
            {
                Thread.CurrentThread.Interrupt();
                try
                {
                    result = epoch.TryDispose();
                }
                catch (Exception e)
                {
                    failure = e;
                }
                kept = PendingInterrupt.TryConsume();
                done.Set();
            });
            Assert.NotEqual(WaitHandle.WaitTimeout, WaitHandle.WaitAny([spunLong.WaitHandle, done.WaitHandle], GuardedThread.DefaultTimeout));
        };
        epoch.Dispose();
        other!.Join();
        return (failure, result, kept);
    }

    [Fact]
    public void TryDispose_WithAnInterruptPending_WhileAnotherDisposeDecides_NeverThrows_AndKeepsTheInterrupt()
    {
        var control = TryDisposeWithAnInterruptPendingWhileClosing(legacy: true);
        var real = TryDisposeWithAnInterruptPendingWhileClosing(legacy: false);
        output.WriteLine($"control: {control.Failure?.GetType().Name ?? "returned " + control.Result}; real: {real.Failure?.GetType().Name ?? "returned " + real.Result}, interrupt kept {real.InterruptKept}");
        Assert.Null(real.Failure);
        Assert.True(real.Result);
        Assert.True(real.InterruptKept, "the absorbed interrupt was lost");
        Assert.SkipWhen(control.Failure is not ThreadInterruptedException, "inconclusive: the control (an interruptible wait) did not throw");
    }

    /// <summary>
    /// A drain that began before the epoch closed (a leaving thread's, inside an action) went on claiming actions after
    /// the close, in parallel with Dispose's final run, and Dispose returned while one of them, pending at the close, still
    /// ran (found by an adversarial round, session 17): once the epoch is closed, drains claim nothing more, and what was
    /// pending is the final run's. The hook holds the Dispose between the close and its final run until the second action
    /// starts (or 2 s pass, as they must once the drains are gated); the control lets drains claim regardless.
    /// </summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void Dispose_ReturnsOnlyOnceEveryActionPendingAtTheCloseHasRun(bool control)
    {
        var epoch = new LightEpoch();
        using var firstRunning = new ManualResetEventSlim();
        using var secondStarted = new ManualResetEventSlim();
        int secondFinished = 0, finishedAtReturn = -1;
        var holder = new ParkedThread(epoch.Resume, epoch.Suspend);
        epoch.BumpCurrentEpoch(() =>
        {
            firstRunning.Set();
            SpinWait.SpinUntil(() => epoch.IsClosed, GuardedThread.DefaultTimeout);
        });
        epoch.BumpCurrentEpoch(() =>
        {
            secondStarted.Set();
            Thread.Sleep(300);
            Volatile.Write(ref secondFinished, 1);
        });
        epoch.ClosedHookForTesting = () => secondStarted.Wait(TimeSpan.FromSeconds(control ? 30 : 2));
        ClaimGate.IgnoredForTesting = control;
        try
        {
            var leaver = new GuardedThread(holder.Release, "leaver"); // the parked thread leaves: its drain runs the first action
            leaver.Start();
            Assert.True(firstRunning.Wait(GuardedThread.DefaultTimeout));
            epoch.Dispose();
            finishedAtReturn = Volatile.Read(ref secondFinished);
            leaver.Join();
        }
        finally
        {
            ClaimGate.IgnoredForTesting = false;
        }
        Assert.True(secondStarted.IsSet, "the second action never ran");
        if (control)
        {
            Assert.True(finishedAtReturn == 0, "the control's Dispose returned after the action claimed after the close (the check would not catch it)");
            return;
        }
        Assert.True(finishedAtReturn == 1, "Dispose returned while an action pending at the close still ran");
    }
}
