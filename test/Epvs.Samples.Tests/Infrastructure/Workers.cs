using System;
using System.Collections.Concurrent;
using System.Linq;
using System.Threading;

namespace Epvs.Samples.Tests.Infrastructure;

/// <summary>
/// Runs worker threads that start together (a <see cref="Barrier"/>), collects their exceptions, and rethrows them on
/// the test thread; every join is bounded.
/// </summary>
internal static class Workers
{
    public static readonly TimeSpan Timeout = TimeSpan.FromSeconds(30);

    /// <summary>Runs <paramref name="count"/> workers (body gets the worker index) and waits for all of them.</summary>
    public static void Run(int count, Action<int> body, TimeSpan? timeout = null)
    {
        var failures = new ConcurrentQueue<Exception>();
        using var start = new Barrier(count);
        var threads = new Thread[count];
        for (int i = 0; i < count; i++)
        {
            int index = i;
            threads[i] = new Thread(() =>
            {
                try
                {
                    if (!start.SignalAndWait(Timeout))
                        throw new TimeoutException("Workers did not all start within 30 s.");
                    body(index);
                }
                catch (Exception ex)
                {
                    failures.Enqueue(ex);
                }
            })
            { IsBackground = true, Name = $"test worker {i}" };
            threads[i].Start();
        }

        DateTime deadline = DateTime.UtcNow + (timeout ?? Timeout);
        foreach (Thread thread in threads)
        {
            TimeSpan left = deadline - DateTime.UtcNow;
            if (!thread.Join(left > TimeSpan.Zero ? left : TimeSpan.Zero))
                throw new TimeoutException($"Worker '{thread.Name}' did not finish within {(timeout ?? Timeout).TotalSeconds} s (hung or deadlocked).");
        }
        if (!failures.IsEmpty)
            throw new AggregateException("Worker threads failed.", failures.ToArray());
    }

    /// <summary>Starts a background thread whose exception is kept for <see cref="GuardedThread.Join"/>.</summary>
    public static GuardedThread Start(string name, Action body) => new(name, body);
}

/// <summary>A thread that rethrows its exception on <see cref="Join"/>, with a bounded wait.</summary>
internal sealed class GuardedThread
{
    private readonly Thread thread;
    private Exception? failure;

    public GuardedThread(string name, Action body)
    {
        thread = new Thread(() =>
        {
            try
            {
                body();
            }
            catch (Exception ex)
            {
                failure = ex;
            }
        })
        { IsBackground = true, Name = name };
        thread.Start();
    }

    public void Join()
    {
        if (!thread.Join(Workers.Timeout))
            throw new TimeoutException($"Thread '{thread.Name}' did not finish within 30 s (hung or deadlocked).");
        if (failure is not null)
            throw new AggregateException($"Thread '{thread.Name}' failed.", failure);
    }
}
