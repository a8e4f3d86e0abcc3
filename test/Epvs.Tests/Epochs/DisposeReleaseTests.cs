using System;
using System.Threading;
using Xunit;

namespace Epvs.Tests;

/// <summary>
/// One Dispose call always completes: once the epoch is closed, giving its instance id back must not fail. That used to
/// take a plain <c>lock</c>, which <see cref="Thread.Interrupt"/> breaks when contended: Dispose threw after the epoch
/// had closed, the id never went back to the pool (the finalizer, seeing the epoch closed, does not release it either),
/// and a scheme that owned the epoch stayed undisposed until Dispose was called again. Deterministic: the test holds the
/// pool's lock until the disposing thread is blocked on it (or done), and the interrupt is requested on that thread
/// itself before the call.
/// </summary>
public class DisposeReleaseTests
{
    private static (Exception? Dispose, bool IdFree, bool InterruptPending, bool SchemeDisposed) InterruptedRelease(bool throughScheme)
    {
        var scheme = new EpochProtectedVersionScheme();
        LightEpoch epoch = scheme.Epoch;
        int id = epoch.DebugId;
        Exception? dispose = null;
        bool interruptPending = false;
        Thread? disposing = null;
        int done = 0;
        GuardedThread disposer;
        lock (LightEpoch.IdLockForTesting)
        {
            disposer = GuardedThread.Start(() =>
            {
                Volatile.Write(ref disposing, Thread.CurrentThread);
                Thread.CurrentThread.Interrupt(); // surfaces at the thread's next interruptible wait: the contended lock
                dispose = Record.Exception(() =>
                {
                    if (throughScheme)
                        scheme.Dispose();
                    else
                        epoch.Dispose();
                });
                Volatile.Write(ref done, 1);
                interruptPending = PendingInterrupt.TryConsume(); // consumed, so it cannot hit a later wait of this thread
            }, "dispose");
            // Hold the lock until the disposer blocks on it (or finished without it). A bound, not a timing.
            var until = DateTime.UtcNow + GuardedThread.DefaultTimeout;
            while (Volatile.Read(ref done) == 0 &&
                   (Volatile.Read(ref disposing) is not { } t || (t.ThreadState & ThreadState.WaitSleepJoin) == 0))
            {
                Assert.True(DateTime.UtcNow < until, "the disposer neither blocked nor finished");
                Thread.Yield();
            }
        }
        disposer.Join();
        bool schemeDisposed = Record.Exception(() => scheme.Enter()) is ObjectDisposedException;
        return (dispose, LightEpoch.IsIdFreeForTesting(id), interruptPending, schemeDisposed);
    }

    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void Dispose_InterruptedWhileReleasingItsId_CompletesAndReleasesIt(bool throughScheme)
    {
        (Exception? dispose, bool idFree, bool interruptPending, bool schemeDisposed) = InterruptedRelease(throughScheme);
        Assert.Null(dispose);
        Assert.True(idFree, "the closed epoch's instance id was never given back");
        Assert.True(interruptPending, "the interrupt was swallowed instead of kept for the thread's next wait");
        if (throughScheme)
            Assert.True(schemeDisposed, "the scheme stayed usable after its epoch closed");
    }
}
