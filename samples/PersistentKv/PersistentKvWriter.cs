using System;
using System.Collections.Generic;
using System.Threading;
using Epvs.Persistence;

namespace Epvs.Samples.PersistentKv;

/// <summary>
/// The workload: writer threads set and delete keys (each thread owns the keys ≡ its index mod the thread count),
/// logging every operation with its version before running it inside its region, and a Sync every 20,000 operations.
/// In the child process it runs until killed.
/// </summary>
internal static class PersistentKvWriter
{
    internal const string Role = "writer";
    internal const int Threads = 2;
    internal const int KeysPerThread = 500;
    internal const int MapTypeId = 1;

    /// <summary>The child process: create the heap and write until killed, or until its parent is gone.</summary>
    internal static int Run(string path, int seed)
    {
        ExitWhenTheParentIsGone();
        var heap = BufferedDurableHeap.Create(path, new HeapFileOptions { Size = 64L << 20 }, new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromMilliseconds(20) });
        var map = new PersistentByteMap<long>(heap, MapTypeId);
        // The parent waits for "ready" and prints the rest of the line.
        Console.WriteLine($"ready {DomainDescription.Describe(heap.Heap.File, path)}");
        object console = new();
        var threads = new Thread[Threads];
        for (int t = 0; t < Threads; t++)
        {
            int thread = t;
            threads[t] = new Thread(() => Write(heap, map, thread, seed, CancellationToken.None, line => Console.WriteLine(line)));
            threads[t].Start();
        }

        foreach (Thread thread in threads)
        {
            thread.Join();
        }

        return 0;
    }

    /// <summary>
    /// The parent holds this process's standard input open and never writes to it: end of input means the parent is
    /// gone, however it ended (a SIGINT or SIGKILL sent to it alone, an IDE's stop, a timeout), and this process exits
    /// too. It used to write for ever, orphaned, at most of a core.
    /// </summary>
    private static void ExitWhenTheParentIsGone()
    {
        var watch = new Thread(() =>
        {
            while (Console.In.ReadLine() is not null)
            {
            }

            Environment.Exit(ParentGone);
        })
        { IsBackground = true, Name = "parent-watch" };
        watch.Start();
    }

    /// <summary>The exit code of a writer whose parent is gone.</summary>
    internal const int ParentGone = 3;

    internal static void Write(BufferedDurableHeap heap, PersistentByteMap<long> map, int thread, int seed, CancellationToken stop, Action<string> log)
    {
        var random = new Random(seed + thread);
        var writes = new Dictionary<long, int>();
        for (long i = 0; !stop.IsCancellationRequested; i++)
        {
            long key = (random.Next(KeysPerThread) * Threads) + thread;
            bool delete = random.Next(5) == 0;
            using (DurableOperation op = heap.BeginOperation())
            {
                int n = -1;
                if (!delete)
                {
                    n = writes.TryGetValue(key, out int count) ? count + 1 : 0;
                    writes[key] = n;
                }

                // Logged inside the operation, before it runs: an operation of a version that completed was logged.
                log(new KvOp(thread, op.Version, key, n).Format());
                if (delete)
                {
                    map.Remove(key);
                }
                else
                {
                    map.Set(key, KvOp.ValueFor(key, n));
                }
            }

            if (i % 20_000 == 19_999)
            {
                long version = heap.CurrentVersion;
                heap.Sync();
                log(FormattableString.Invariant($"sync {version} ."));
            }
        }
    }
}
