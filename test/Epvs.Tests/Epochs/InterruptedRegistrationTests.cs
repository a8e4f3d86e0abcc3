using System;
using System.Threading;
using Xunit;

namespace Epvs.Tests;

/// <summary>
/// BumpCurrentEpoch documents that an action registered before the call throws (the thread was interrupted, or ran out
/// of memory) still runs when safe. A registration that finds a raise of the min-pending-epoch hint in progress waits
/// for it before lowering the hint; interrupted in that wait, it used to return with its action published and the hint
/// left above it, so no drain looked at the action again until some later registration lowered the hint (a scheme's
/// step deferred that way stranded the scheme intermediate for ever). Deterministic: the raise is held in its hook and
/// the interrupt is requested on the registering thread itself.
/// </summary>
public class InterruptedRegistrationTests
{
    /// <summary>
    /// Returns whether the action whose registration was interrupted ran at the next bump (nobody protected), what the
    /// registration threw, and whether the interrupt was still pending after it.
    /// </summary>
    private static (bool Ran, Exception? Registration, bool InterruptStillPending) InterruptedRegistration()
    {
        using var epoch = new LightEpoch();
        using var raising = new ManualResetEventSlim();
        using var finishRaise = new ManualResetEventSlim();
        using var waiting = new ManualResetEventSlim();
        int ran = 0;
        Exception? registration = null;
        bool interruptPending = false;
        epoch.RaisePendingHintHookForTesting = () =>
        {
            epoch.RaisePendingHintHookForTesting = null;
            raising.Set();
            Assert.True(finishRaise.Wait(GuardedThread.DefaultTimeout), "the raise was never let finish");
        };
        epoch.LowerHintWaitsForRaiseHookForTesting = waiting.Set;
        // Nobody protected: the first action runs at once, and the drain that ran it raises the hint (held in the hook).
        var raiser = GuardedThread.Start(() => epoch.BumpCurrentEpoch(() => { }), "raiser");
        Assert.True(raising.Wait(GuardedThread.DefaultTimeout));
        var registrar = GuardedThread.Start(() =>
        {
            Thread.CurrentThread.Interrupt(); // surfaces at the thread's next interruptible wait
            registration = Record.Exception(() => epoch.BumpCurrentEpoch(() => Interlocked.Exchange(ref ran, 1)));
            interruptPending = PendingInterrupt.TryConsume(); // consumed, so it cannot hit a later wait of this thread
        }, "registrar");
        Assert.True(waiting.Wait(GuardedThread.DefaultTimeout), "the registration never waited for the raise");
        // Let the wait run with the interrupt pending: SpinWait's first sleep comes after about 15 spins, far sooner than
        // this. A grace period only: the outcome does not depend on it (the real wait does not end until the raise does).
        registrar.TryJoinOrTimeout(TimeSpan.FromMilliseconds(500));
        finishRaise.Set();
        raiser.Join();
        registrar.Join();
        epoch.BumpCurrentEpoch(); // a drain with nobody protected: everything registered is safe
        return (Volatile.Read(ref ran) == 1, registration, interruptPending);
    }

    [Fact]
    public void RegistrationInterruptedWhileAHintRaiseIsInProgress_StillRunsItsActionWhenSafe()
    {
        (bool ran, Exception? registration, bool interruptPending) = InterruptedRegistration();
        Assert.True(ran, "the action stayed pending with nobody protected: the hint was left above it");
        Assert.Null(registration);
        Assert.True(interruptPending, "the interrupt was swallowed instead of kept for the thread's next wait");
    }

    [Fact]
    public void RegistrationInterruptedWhileAHintRaiseIsInProgress_LeftPending_Control()
    {
        // The behaviour before: the wait for the raise was interruptible, and the interrupted registration never lowered
        // the hint.
        LightEpoch.InterruptibleRaiseWaitForTesting = true;
        try
        {
            (bool ran, Exception? registration, _) = InterruptedRegistration();
            Assert.IsType<ThreadInterruptedException>(registration);
            Assert.False(ran);
        }
        finally
        {
            LightEpoch.InterruptibleRaiseWaitForTesting = false;
        }
    }
}
