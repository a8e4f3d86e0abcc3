using System;
using System.Threading;
using Xunit;

namespace Epvs.Tests;

/// <summary>
/// A thread that enters a protected region, reports that it is inside, and stays there until released: the
/// "parked reader" that every transition must wait for.
/// </summary>
internal sealed class ParkedThread : IDisposable
{
    private readonly ManualResetEventSlim inside = new();
    private readonly ManualResetEventSlim release = new();
    private readonly GuardedThread thread;

    /// <param name="enter">Runs on the parked thread to enter protection.</param>
    /// <param name="leave">Runs on the parked thread when released.</param>
    /// <param name="whileInside">Optional work done on the parked thread after the release signal, before leaving.</param>
    public ParkedThread(Action enter, Action leave, Action? whileInside = null)
    {
        thread = GuardedThread.Start(() =>
        {
            enter();
            inside.Set();
            Assert.True(release.Wait(GuardedThread.DefaultTimeout), "parked thread was never released");
            whileInside?.Invoke();
            leave();
        }, "parked");
        Assert.True(inside.Wait(GuardedThread.DefaultTimeout), "parked thread never entered protection");
    }

    public int ManagedThreadId => thread.ManagedThreadId;

    /// <summary>Lets the thread leave and waits for it.</summary>
    public void Release()
    {
        release.Set();
        thread.Join();
    }

    public void Dispose()
    {
        if (!release.IsSet)
            Release();
        inside.Dispose();
        release.Dispose();
    }
}
