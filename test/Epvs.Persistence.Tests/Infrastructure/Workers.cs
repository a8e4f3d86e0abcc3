using System;
using System.Collections.Concurrent;
using System.Threading;

namespace Epvs.Persistence.Tests;

/// <summary>Runs worker threads whose failures reach the test: exceptions are collected and rethrown on a bounded join.</summary>
internal static class Workers
{
    internal static readonly TimeSpan JoinTimeout = TimeSpan.FromSeconds(60);

    /// <summary>Starts <paramref name="threads"/> (each running its own body), then joins each within <paramref name="timeout"/>; throws for one that does not finish.</summary>
    internal static void StartAndJoin(System.Collections.Generic.IReadOnlyList<Thread> threads, TimeSpan timeout)
    {
        foreach (Thread thread in threads)
        {
            thread.Start();
        }

        foreach (Thread thread in threads)
        {
            if (!thread.Join(timeout))
            {
                throw new TimeoutException($"Thread {thread.Name} did not finish within {timeout}: deadlock?");
            }
        }
    }

    internal static void Run(int count, Action<int> body)
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
                    start.SignalAndWait(JoinTimeout);
                    body(index);
                }
                catch (Exception e)
                {
                    failures.Enqueue(e);
                }
            })
            { IsBackground = true, Name = $"worker-{i}" };
            threads[i].Start();
        }

        foreach (Thread thread in threads)
        {
            if (!thread.Join(JoinTimeout))
            {
                throw new TimeoutException($"Worker {thread.Name} did not finish within {JoinTimeout}.");
            }
        }

        if (!failures.IsEmpty)
        {
            throw new AggregateException("A worker thread failed.", failures);
        }
    }
}
