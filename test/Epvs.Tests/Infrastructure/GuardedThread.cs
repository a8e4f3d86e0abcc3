using System;
using System.Runtime.ExceptionServices;
using System.Threading;
using Xunit;

namespace Epvs.Tests;

/// <summary>
/// A worker thread whose exception reaches the test: <see cref="Join"/> waits a bounded time, fails the test if the
/// thread is still running, and rethrows what the thread threw.
/// </summary>
internal sealed class GuardedThread
{
    public static readonly TimeSpan DefaultTimeout = TimeSpan.FromSeconds(30);

    private readonly Thread thread;
    private ExceptionDispatchInfo? failure;

    public GuardedThread(Action body, string name = "worker", int maxStackSize = 0)
    {
        thread = new Thread(() =>
        {
            try
            {
                body();
            }
            catch (Exception ex)
            {
                failure = ExceptionDispatchInfo.Capture(ex);
            }
        }, maxStackSize)
        {
            IsBackground = true,
            Name = name,
        };
    }

    public static GuardedThread Start(Action body, string name = "worker")
    {
        var t = new GuardedThread(body, name);
        t.Start();
        return t;
    }

    public int ManagedThreadId => thread.ManagedThreadId;

    /// <summary>Whether the thread is still running (a snapshot).</summary>
    public bool IsAlive => thread.IsAlive;

    public void Start() => thread.Start();

    /// <summary>Interrupts the thread (<see cref="Thread.Interrupt"/>).</summary>
    public void Interrupt() => thread.Interrupt();

    /// <summary>Whether the thread finished within <paramref name="timeout"/>; rethrows its exception if it did.</summary>
    public bool TryJoin(TimeSpan timeout)
    {
        if (!thread.Join(timeout))
            return false;
        failure?.Throw();
        return true;
    }

    /// <summary>Like <see cref="TryJoin"/>, for call sites that treat a timeout as a result, not a failure.</summary>
    public bool TryJoinOrTimeout(TimeSpan timeout) => TryJoin(timeout);

    public void Join(TimeSpan? timeout = null)
    {
        TimeSpan limit = timeout ?? DefaultTimeout;
        Assert.True(TryJoin(limit), $"Thread '{thread.Name}' did not finish within {limit.TotalSeconds:0} s.");
    }

    /// <summary>Runs <paramref name="body"/> on <paramref name="count"/> threads and joins them all.</summary>
    public static void RunAll(int count, Action<int> body, TimeSpan? timeout = null)
    {
        var threads = new GuardedThread[count];
        for (int i = 0; i < count; i++)
        {
            int index = i;
            threads[i] = Start(() => body(index), $"worker {index}");
        }
        foreach (GuardedThread t in threads)
            t.Join(timeout);
    }
}
