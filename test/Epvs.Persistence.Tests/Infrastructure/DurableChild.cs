using System;
using System.Collections.Generic;
using System.Globalization;
using System.Threading;

namespace Epvs.Persistence.Tests;

/// <summary>
/// The child process of the SIGKILL test: two threads write and delete map entries on a libpmem heap (forced pmem) or
/// a privately mapped file (only what was written back is in the file when the process dies; with the broken control,
/// the frontier is persisted before the version's write-back) until the parent kills the process. Each operation prints its line — thread, version, key, write number or D —
/// inside its EPVS region, before it runs, so every operation of a version that completed was printed; a line ends
/// with " ." so that a line torn by the kill is recognizable. After each Sync it prints the version it covered.
/// </summary>
internal static class DurableChild
{
    internal const string Role = "durable-child";
    internal const int Threads = 2;
    internal const int KeysPerThread = 64;

    /// <summary>What the broken control prints when it stops between persisting the frontier and the version's write-back.</summary>
    internal const string WindowLine = "window frontier-persisted-before-write-back .";

    private const int ControlOperations = 2_000;
    private static long s_operations;

    internal static int Run(string path, int seed, string domain)
    {
        // "private-frontier-first" is the broken control: the frontier is persisted before the version's write-back.
        HeapFileOptions options = domain.StartsWith("private", StringComparison.Ordinal)
            ? new HeapFileOptions { Size = 32L << 20, Domain = PersistenceDomainKind.MappedFile, MappedFileWriteBack = MappedFileWriteBack.PrivateMapping }
            : new HeapFileOptions { Size = 32L << 20, Domain = PersistenceDomainKind.Pmem };
        DurabilityFaults faults = domain == "private-frontier-first" ? DurabilityFaults.PersistFrontierBeforeWriteBack : DurabilityFaults.None;
        var heap = BufferedDurableHeap.Create(path, options, new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromMilliseconds(5), Faults = faults });
        if (faults != DurabilityFaults.None)
        {
            // The control stops in its window — frontier persisted, version not written back — once the load has run a
            // while, and says so: the parent kills it there, so the broken order is always exposed.
            heap.AfterFrontierPersistedFirstForTesting = version =>
            {
                if (Volatile.Read(ref s_operations) >= ControlOperations)
                {
                    Console.WriteLine(WindowLine);

                    // Parked in the window until the parent, which waits for that line, kills the process.
                    using var never = new ManualResetEventSlim();
                    never.Wait();
                }
            };
        }

        var map = new PersistentByteMap<long>(heap, DurableWorkload.MapTypeId);
        Console.WriteLine($"ready pmem={heap.Heap.File.Domain.IsPersistentMemory} .");
        var threads = new Thread[Threads];
        for (int t = 0; t < Threads; t++)
        {
            int thread = t;
            threads[t] = new Thread(() => Work(heap, map, thread, seed)) { IsBackground = false };
            threads[t].Start();
        }

        // Runs until killed.
        foreach (Thread thread in threads)
        {
            thread.Join();
        }

        return 0;
    }

    private static void Work(BufferedDurableHeap heap, PersistentByteMap<long> map, int thread, int seed)
    {
        var random = new Random(seed + thread);
        var writes = new Dictionary<long, int>();
        for (long i = 0; ; i++)
        {
            long key = (random.Next(KeysPerThread) * Threads) + thread;
            bool delete = random.Next(4) == 0;
            using (DurableOperation op = heap.BeginOperation())
            {
                if (delete)
                {
                    Console.WriteLine(string.Create(CultureInfo.InvariantCulture, $"op {thread} {op.Version} {key} D ."));
                    map.Remove(key);
                }
                else
                {
                    int n = writes.TryGetValue(key, out int count) ? count + 1 : 0;
                    writes[key] = n;
                    Console.WriteLine(string.Create(CultureInfo.InvariantCulture, $"op {thread} {op.Version} {key} {n} ."));
                    map.Set(key, OpLog.ValueFor(key, n));
                }
            }

            Interlocked.Increment(ref s_operations);
            if (i % 500 == 499)
            {
                long version = heap.CurrentVersion;
                heap.Sync();
                Console.WriteLine(string.Create(CultureInfo.InvariantCulture, $"sync {version} ."));
            }
        }
    }
}
