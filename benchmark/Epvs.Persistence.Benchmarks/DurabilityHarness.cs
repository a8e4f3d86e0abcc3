using System;
using System.Collections.Generic;
using System.CommandLine;
using System.Diagnostics;
using System.Globalization;
using System.IO;
using System.Linq;
using System.Runtime.CompilerServices;
using System.Threading;
using Epvs.Benchmarks;
using Epvs.Samples;

namespace Epvs.Persistence.Benchmarks;

/// <summary>
/// The buffered-durability harness (not BenchmarkDotNet: multi-threaded throughput, one table): transient vs
/// buffered vs strict on the persistent hash map (get:insert:remove mixes, 1 M key range, 0.5 M preloaded, 1 KB values)
/// and the queue (1:1), at 1 and 2 threads, per persistence domain; recovery time of ~1 GB of 1 KB payloads at 1 and
/// 2 threads; Sync latency percentiles. Side by side in one run.
/// </summary>
internal static class DurabilityHarness
{
    private const int KeyRange = 1_000_000;
    private const int ValueSize = 1024;
    private const int MapTypeId = 1;
    private const int QueueTypeId = 2;

    /// <summary>What <c>durability [part]</c> runs; <c>all</c> is every part but <c>leak</c>.</summary>
    private static readonly string[] Parts = ["all", "throughput", "recovery", "sync", "advance", "leak"];

    /// <summary>
    /// The <c>durability</c> command: <c>[--seconds d] [--preload n] [--part p]</c>, or the positional form RESULTS.md
    /// quotes, <c>durability [seconds-per-cell] [preload] [part]</c> (e.g. <c>durability 1 500000 throughput</c>).
    /// </summary>
    /// <param name="run">Runs the harness given seconds per cell, preload and part, returning the exit code; tests
    /// replace it to see what would run.</param>
    internal static Command CreateCommand(Func<double, int, string, int>? run = null)
    {
        run ??= Run;
        var seconds = SampleCli.Duration("--seconds", "-s", "Measured time per throughput cell (strict through the page cache at most 0.5 s)", TimeSpan.FromSeconds(1), TimeSpan.FromMilliseconds(10), TimeSpan.FromMinutes(10), "seconds-per-cell");
        var preload = SampleCli.Int("--preload", null, $"Keys preloaded into the map, of {KeyRange:N0}", 500_000, 0, KeyRange, "preload");
        string parts = string.Join('|', Parts);
        var partOption = new Option<string?>("--part") { Description = $"What to run: {parts} ('all' is every part but 'leak') [default: all]", HelpName = "part" };
        partOption.AcceptOnlyFromAmong(Parts);
        var partArgument = new Argument<string?>("part") { Description = "Same as --part (positional form)", HelpName = "part", Arity = ArgumentArity.ZeroOrOne };
        partArgument.AcceptOnlyFromAmong(Parts);
        var command = new Command(
            "durability",
            "The older per-mode harness: transient vs buffered vs strict throughput of the map and the queue per domain, " +
            "1 GB recovery, Sync latency, the cost of one advance. Files go to EPVS_BENCH_DIR or the temp directory.");
        seconds.AddTo(command);
        preload.AddTo(command);
        command.Add(partOption);
        command.Add(partArgument);
        command.Validators.Add(result =>
        {
            if (result.GetResult(partOption) is { Tokens.Count: > 0 } && result.GetResult(partArgument) is { Tokens.Count: > 0 })
            {
                result.AddError("--part and <part> set the same thing: give one of them.");
            }
        });
        command.SetAction(parse => run(seconds.Value(parse).TotalSeconds, preload.Value(parse), parse.GetValue(partArgument) ?? parse.GetValue(partOption) ?? "all"));
        return command;
    }

    private static int Run(double seconds, int preload, string part)
    {
        // Every file of the run lives in a directory of its own, deleted on the way out and also when Ctrl-C, SIGTERM
        // or an unhandled exception ends the process (none of which runs finally blocks).
        using var files = new TemporaryDirectory(Environment.GetEnvironmentVariable("EPVS_BENCH_DIR") ?? Path.GetTempPath(), "epvs-durability-");
        string dir = files.Path;
        Console.WriteLine($"# buffered durability harness: {seconds:0.##} s per cell, {preload:N0} preloaded of {KeyRange:N0} keys, {ValueSize} B values, files in {dir}");
        Console.WriteLine($"# {Environment.ProcessorCount} logical CPUs, .NET {Environment.Version}, PMEM_IS_PMEM_FORCE={Environment.GetEnvironmentVariable("PMEM_IS_PMEM_FORCE") ?? "(unset)"}");
        if (part is "all" or "throughput")
        {
            foreach (PersistenceDomainKind domain in new[] { PersistenceDomainKind.Pmem, PersistenceDomainKind.MappedFile })
            {
                Throughput(dir, domain, seconds, preload);
            }
        }

        if (part == "leak")
        {
            foreach (DurabilityMode mode in new[] { DurabilityMode.Transient, DurabilityMode.Buffered })
            {
                string p = Path.Combine(dir, $"epvs-leak-{Guid.NewGuid():N}.heap");
                // Each mode preloads its own file: a transient heap refuses a file that holds durable data.
                using (BufferedDurableHeap heap = BufferedDurableHeap.Create(p, new HeapFileOptions { Size = 128L << 20, Domain = PersistenceDomainKind.MappedFile }, new BufferedDurableHeapOptions { Mode = mode }))
                {
                    var map = new PersistentByteMap<long>(heap, MapTypeId);
                    byte[] value = new byte[ValueSize];
                    for (int i = 0; i < 20_000; i++)
                    {
                        map.Set(i * 2, value);
                    }

                    Console.WriteLine($"{mode} before: {heap.Heap.GetStatistics()} count={map.Count}");
                    var random = new Random(1);
                    for (int i = 0; i < 400_000; i++)
                    {
                        long key = random.Next(40_000);
                        if ((i & 1) == 0) map.Set(key, value); else map.Remove(key);
                    }

                    for (int a = 0; a < 3; a++) heap.AdvanceVersion(TimeSpan.FromSeconds(10));
                    Console.WriteLine($"{mode} after: {heap.Heap.GetStatistics()} count={map.Count}");
                }

                File.Delete(p);
            }

            return 0;
        }

        if (part is "all" or "recovery")
        {
            Recovery(dir);
        }

        if (part is "all" or "sync")
        {
            SyncLatency(dir);
        }

        if (part is "all" or "advance")
        {
            AdvanceCost(dir);
        }

        return 0;
    }

    private static void Throughput(string dir, PersistenceDomainKind domain, double seconds, int preload)
    {
        string path = Path.Combine(dir, $"epvs-bench-{Guid.NewGuid():N}.heap");
        try
        {
            var results = new Dictionary<(string, int, DurabilityMode), double>();
            string[] workloads = ["map 0:1:1", "map 2:1:1", "map 18:1:1", "queue 1:1"];
            foreach (DurabilityMode mode in new[] { DurabilityMode.Transient, DurabilityMode.Buffered, DurabilityMode.Strict })
            {
                // Each mode preloads a file of its own, created in that mode: a transient heap refuses a file that
                // holds durable data (it would overwrite it in place).
                var watch = Stopwatch.StartNew();
                using BufferedDurableHeap heap = BufferedDurableHeap.Create(path, new HeapFileOptions { Size = 3L << 29, MaxSize = 3L << 30, Domain = domain }, new BufferedDurableHeapOptions { Mode = mode });
                var map = new PersistentByteMap<long>(heap, MapTypeId);
                var queue = new PersistentQueue<Kilobyte>(heap, QueueTypeId);
                Parallel(2, t =>
                {
                    byte[] value = new byte[ValueSize];
                    for (int i = t; i < preload; i += 2)
                    {
                        map.Set(Scramble(i) % KeyRange, value);
                    }
                });
                for (int i = 0; i < 1000; i++)
                {
                    queue.Enqueue(default);
                }

                Console.WriteLine($"# {domain}, {mode}: preloaded {map.Count:N0} keys in {watch.Elapsed.TotalSeconds:0.0} s (pmem path: {heap.Heap.File.Domain.IsPersistentMemory}; write-back: {WriteBack(heap.Heap.File)})");
                foreach (string workload in workloads)
                {
                    foreach (int threads in new[] { 1, 2 })
                    {
                        // Strict through the page cache is ~0.1 ms per operation; a shorter cell says as much.
                        double cell = mode == DurabilityMode.Strict && !heap.Heap.File.Domain.IsPersistentMemory ? Math.Min(seconds, 0.5) : seconds;
                        results[(workload, threads, mode)] = Measure(heap, map, queue, workload, threads, cell);
                    }
                }

                heap.Dispose();
                File.Delete(path);
            }

            Console.WriteLine();
            Console.WriteLine($"| domain | workload | threads | transient Mops/s | buffered Mops/s | strict Mops/s | buffered/transient | buffered/strict |");
            Console.WriteLine($"|---|---|---:|---:|---:|---:|---:|---:|");
            foreach (string workload in workloads)
            {
                foreach (int threads in new[] { 1, 2 })
                {
                    double tr = results[(workload, threads, DurabilityMode.Transient)], bu = results[(workload, threads, DurabilityMode.Buffered)], st = results[(workload, threads, DurabilityMode.Strict)];
                    Console.WriteLine(FormattableString.Invariant($"| {domain} | {workload} | {threads} | {tr:0.000} | {bu:0.000} | {st:0.0000} | {bu / tr:0.00} | {bu / st:0.0}× |"));
                }
            }

            Console.WriteLine();
        }
        finally
        {
            File.Delete(path);
        }
    }

    private static double Measure(BufferedDurableHeap heap, PersistentByteMap<long> map, PersistentQueue<Kilobyte> queue, string workload, int threads, double seconds)
    {
        int gets = workload switch { "map 0:1:1" => 0, "map 2:1:1" => 2, "map 18:1:1" => 18, _ => -1 };
        long total = 0;
        int stop = 0;
        var go = new Barrier(threads + 1);
        var failure = new WorkerFailure();
        var workers = Enumerable.Range(0, threads).Select(t => new Thread(failure.Guard(() =>
        {
            var random = new Random(1000 + t);
            byte[] value = new byte[ValueSize];
            long ops = 0;
            go.SignalAndWait();
            // Volatile.Read: acquire; pairs with the main thread's Volatile.Write of the stop flag.
            while (Volatile.Read(ref stop) == 0)
            {
                for (int i = 0; i < 64; i++)
                {
                    if (gets < 0)
                    {
                        if ((ops & 1) == 0)
                        {
                            queue.Enqueue(default);
                        }
                        else
                        {
                            queue.TryDequeue(out _);
                        }
                    }
                    else
                    {
                        int pick = random.Next(gets + 2);
                        long key = random.Next(KeyRange);
                        if (pick < gets)
                        {
                            map.TryCopyValue(key, value);
                        }
                        else if (pick == gets)
                        {
                            try
                            {
                                map.Set(key, value);
                            }
                            catch (InsufficientMemoryException)
                            {
                                Console.WriteLine($"# heap full: {heap.Heap.GetStatistics()} count={map.Count} version={heap.CurrentVersion} frontier={heap.DurableFrontier}");
                                throw;
                            }
                        }
                        else
                        {
                            map.Remove(key);
                        }
                    }

                    ops++;
                }
            }

            Interlocked.Add(ref total, ops);
        }))).ToList();
        workers.ForEach(w => w.Start());
        go.SignalAndWait();
        var watch = Stopwatch.StartNew();
        Thread.Sleep(TimeSpan.FromSeconds(seconds));
        Volatile.Write(ref stop, 1);
        workers.ForEach(w => w.Join());
        failure.ThrowIfFailed();
        return total / watch.Elapsed.TotalSeconds / 1e6;
    }

    private static void Recovery(string dir)
    {
        string path = Path.Combine(dir, $"epvs-bench-recovery-{Guid.NewGuid():N}.heap");
        try
        {
            long target = 1L << 30;
            long payloads;
            using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, new HeapFileOptions { Size = target + (64L << 20), Domain = PersistenceDomainKind.MappedFile }))
            {
                var map = new PersistentByteMap<long>(heap, MapTypeId);
                byte[] value = new byte[ValueSize - sizeof(long)];
                long perPayload = 1280; // the size class of a 1 KB payload + 32-byte header
                payloads = target / perPayload;
                Parallel(2, t =>
                {
                    for (long i = t; i < payloads; i += 2)
                    {
                        map.Set(i, value);
                    }
                });
            }

            Console.WriteLine($"## Recovery of {payloads:N0} payloads of 1 KB ({payloads * 1280 / (1 << 20):N0} MiB of blocks), mapped-file domain, page cache warm");
            Console.WriteLine();
            Console.WriteLine("| threads | after | fast reopen | heap scan + resolve (ms) | + map index rebuild (ms) | total (ms) | live payloads |");
            Console.WriteLine("|---:|---|---|---:|---:|---:|---:|");
            foreach (bool crash in new[] { false, true })
            {
                foreach (int threads in new[] { 1, 2 })
                {
                    if (crash)
                    {
                        MarkCrashed(path);
                    }

                    var watch = Stopwatch.StartNew();
                    using BufferedDurableHeap heap = BufferedDurableHeap.Open(path, new HeapFileOptions { Domain = PersistenceDomainKind.MappedFile }, new BufferedDurableHeapOptions { RecoveryParallelism = threads, AdvancePeriod = Timeout.InfiniteTimeSpan });
                    double scan = watch.Elapsed.TotalMilliseconds;
                    var map = new PersistentByteMap<long>(heap, MapTypeId);
                    double total = watch.Elapsed.TotalMilliseconds;
                    Console.WriteLine(FormattableString.Invariant($"| {threads} | {(crash ? "crash" : "clean shutdown")} | {(heap.Recovery.FastReopen ? "yes" : "no")} | {scan:0} | {total - scan:0} | {total:0} | {map.Count:N0} |"));
                }
            }

            Console.WriteLine();
        }
        finally
        {
            File.Delete(path);
        }
    }

    private static void MarkCrashed(string path)
    {
        // Clear the clean-shutdown word (superblock offset 56) as a crash would leave it.
        using var stream = new FileStream(path, FileMode.Open, FileAccess.ReadWrite);
        stream.Position = 56;
        stream.Write(new byte[8]);
    }

    private static void SyncLatency(string dir)
    {
        foreach (PersistenceDomainKind domain in new[] { PersistenceDomainKind.Pmem, PersistenceDomainKind.MappedFile })
        {
            string path = Path.Combine(dir, $"epvs-bench-sync-{Guid.NewGuid():N}.heap");
            try
            {
                using BufferedDurableHeap heap = BufferedDurableHeap.Create(path, new HeapFileOptions { Size = 512L << 20, Domain = domain }, new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromMilliseconds(20) });
                var map = new PersistentByteMap<long>(heap, MapTypeId);
                int stop = 0;
                var failure = new WorkerFailure();
                var writer = new Thread(failure.Guard(() =>
                {
                    var random = new Random(7);
                    byte[] value = new byte[ValueSize];
                    // Volatile.Read: acquire; pairs with the Volatile.Write below.
                    while (Volatile.Read(ref stop) == 0)
                    {
                        long key = random.Next(100_000);
                        if ((key & 1) == 0)
                        {
                            map.Set(key, value);
                        }
                        else
                        {
                            map.Remove(key);
                        }
                    }
                }));
                writer.Start();
                var latencies = new List<double>();
                var random = new Random(8);
                for (int i = 0; i < 200; i++)
                {
                    Thread.Sleep(random.Next(1, 20));
                    var watch = Stopwatch.StartNew();
                    heap.Sync();
                    latencies.Add(watch.Elapsed.TotalMilliseconds);
                }

                Volatile.Write(ref stop, 1);
                writer.Join();
                failure.ThrowIfFailed();
                latencies.Sort();
                double P(double q) => latencies[(int)Math.Min(latencies.Count - 1, q * latencies.Count)];
                Console.WriteLine(FormattableString.Invariant($"Sync latency, {domain} (pmem path {heap.Heap.File.Domain.IsPersistentMemory}; write-back: {WriteBack(heap.Heap.File)}), 20 ms period, 1 writer thread (1 KB set/remove), 200 Syncs: p50 {P(0.5):0.00} ms ({P(0.5) / 20:0.00} periods), p90 {P(0.9):0.00} ms, p99 {P(0.99):0.00} ms, max {latencies[^1]:0.00} ms"));
            }
            finally
            {
                File.Delete(path);
            }
        }
    }

    /// <summary>
    /// What one advance costs through the mapped file's write-back (the one the header names: on Linux, the private
    /// mapping's pwrite + fdatasync when the heap fits in a quarter of memory): AdvanceVersion after n 1 KB sets in the
    /// version (no background advancer).
    /// </summary>
    private static void AdvanceCost(string dir)
    {
        string path = Path.Combine(dir, $"epvs-bench-advance-{Guid.NewGuid():N}.heap");
        try
        {
            using BufferedDurableHeap heap = BufferedDurableHeap.Create(path, new HeapFileOptions { Size = 512L << 20, Domain = PersistenceDomainKind.MappedFile }, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
            var map = new PersistentByteMap<long>(heap, MapTypeId);
            byte[] value = new byte[ValueSize];
            var random = new Random(7);
            for (int i = 0; i < 200_000; i++)
            {
                long key = random.Next(100_000);
                if ((key & 1) == 0)
                {
                    map.Set(key, value);
                }
                else
                {
                    map.Remove(key);
                }
            }

            heap.Sync();
            Console.WriteLine($"## One advance through {WriteBack(heap.Heap.File)} (512 MB heap, MappedFile): AdvanceVersion after n 1 KB sets of random keys");
            Console.WriteLine();
            Console.WriteLine("| sets in the version | advance (ms), 3 repetitions |");
            Console.WriteLine("|---:|---|");
            foreach (int n in new[] { 0, 500, 2000, 8000 })
            {
                var times = new List<string>();
                for (int r = 0; r < 3; r++)
                {
                    for (int i = 0; i < n; i++)
                    {
                        map.Set(random.Next(100_000) & ~1L, value);
                    }

                    var watch = Stopwatch.StartNew();
                    heap.AdvanceVersion(TimeSpan.FromSeconds(30));
                    times.Add(watch.Elapsed.TotalMilliseconds.ToString("0.0", CultureInfo.InvariantCulture));
                }

                Console.WriteLine($"| {n:N0} | {string.Join(", ", times)} |");
            }

            Console.WriteLine();
        }
        finally
        {
            File.Delete(path);
        }
    }

    /// <summary>How <paramref name="file"/> writes back: for a mapped file, which mapping and system calls.</summary>
    private static string WriteBack(HeapFile file) => file.MappedFileWriteBack switch
    {
        MappedFileWriteBack.SharedMapping => "msync of a shared mapping",
        MappedFileWriteBack.PrivateMapping => "pwrite + fdatasync of a private mapping",
        _ when file.Domain.IsPersistentMemory => "cache-line flushes",
        _ => file.Domain.Kind == PersistenceDomainKind.Pmem ? "pmem_msync (not persistent memory)" : file.Domain.Kind.ToString(),
    };

    private static void Parallel(int threads, Action<int> body)
    {
        var failure = new WorkerFailure();
        var list = Enumerable.Range(0, threads).Select(t => new Thread(failure.Guard(() => body(t)))).ToList();
        list.ForEach(t => t.Start());
        list.ForEach(t => t.Join());
        failure.ThrowIfFailed();
    }

    private static long Scramble(long i) => (long)(((ulong)i * 0x9E37_79B9_7F4A_7C15UL) >> 1);

    /// <summary>A 1 KB queue element.</summary>
    [InlineArray(128)]
    internal struct Kilobyte
    {
        private long _element;
    }
}
