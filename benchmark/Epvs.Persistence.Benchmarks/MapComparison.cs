using System;
using System.Collections.Concurrent;
using System.Collections.Generic;
using System.Diagnostics;
using System.Globalization;
using System.IO;
using System.Linq;
using System.Runtime.InteropServices;
using System.Threading;
using Epvs.Benchmarks;
using Epvs.Samples;
using Microsoft.Win32.SafeHandles;

namespace Epvs.Persistence.Benchmarks;

/// <summary>What one comparison run measures (see <see cref="ComparisonCli"/> for the defaults).</summary>
internal sealed record ComparisonSettings(
    int[] Threads,
    int KeyRange,
    TimeSpan Duration,
    int Repetitions,
    int Syncs,
    long RecoveryBytes,
    PersistenceDomainKind Domain,
    MappedFileWriteBack WriteBack,
    string Directory,
    bool Quick,
    int LagWriters = 1,
    TimeSpan? MaxVersionAge = null,
    TimeSpan? AdvancePeriod = null,
    bool UnsafeSweepsNotDurable = false,
    bool UnsafeSweepsFenceOnly = false,
    bool RefillSweepsOnce = false,
    bool NoPrefault = false)
{
    /// <summary>The map's advance period (20 ms unless set): the unit of the Sync and lag targets.</summary>
    public TimeSpan Period => AdvancePeriod ?? TimeSpan.FromMilliseconds(20);

    /// <summary>The options of the map's heap (not of the transient one or the recovery heap).</summary>
    public BufferedDurableHeapOptions MapHeapOptions() => new()
    {
        AdvancePeriod = Period,
        MaxVersionAge = MaxVersionAge,
        HeapFaults = (UnsafeSweepsNotDurable ? HeapFaults.SweepFreesStayInMemory : HeapFaults.None) | (UnsafeSweepsFenceOnly ? HeapFaults.SweepFencesWithoutFrees : HeapFaults.None) | (RefillSweepsOnce ? HeapFaults.RefillSweepsOnce : HeapFaults.None),
    };

    /// <summary>Applies <see cref="NoPrefault"/> to a heap just opened (before anything is formatted in it); returns the heap.</summary>
    public BufferedDurableHeap Configure(BufferedDurableHeap heap)
    {
        if (NoPrefault && heap.Heap.File.Domain is MappedFilePersistenceDomain mapped)
        {
            mapped.PrefaultDisabledForTesting = true;
        }

        return heap;
    }
}

/// <summary>
/// Issue #10's performance table, side by side in one run: <see cref="PersistentHashMap{TKey, TValue}"/> against
/// <see cref="ConcurrentDictionary{TKey, TValue}"/> (upsert, read; 1 and 2 threads, interleaved per repetition so a
/// shared machine's noise hits both alike; medians and ratios), Sync latency and durability lag under one writer, or
/// <see cref="ComparisonSettings.LagWriters"/> (in advance periods), and crash recovery of a heap of <see cref="ComparisonSettings.RecoveryBytes"/>. A breakdown row
/// runs the same upserts on a <see cref="DurabilityMode.Transient"/> heap: the operation's own cost, without the
/// durability work.
/// </summary>
internal static class MapComparison
{
    private const int MapTypeId = 1;

    internal static int Run(ComparisonSettings s, TextWriter output)
    {
        output.WriteLine($"# EPVS persistent map vs ConcurrentDictionary: {Environment.ProcessorCount} logical CPUs, {RuntimeInformation.OSDescription}, {RuntimeInformation.ProcessArchitecture}, .NET {Environment.Version}");
        output.WriteLine($"# key range {s.KeyRange:N0} (all preloaded), long keys and values, {s.Duration.TotalMilliseconds:0} ms per cell, {s.Repetitions} interleaved repetitions (median), threads {string.Join(",", s.Threads)}, domain {s.Domain}, files in {s.Directory}{(s.Quick ? ", QUICK mode" : string.Empty)}");
        if (s.UnsafeSweepsNotDurable)
        {
            output.WriteLine($"# EXPERIMENT {(s.UnsafeSweepsFenceOnly ? "--unsafe-sweeps-fence-only" : "--unsafe-sweeps-not-durable")}: the map's heap hands swept blocks out without making their frees durable first{(s.UnsafeSweepsFenceOnly ? " (each sweep still fences)" : string.Empty)}; NOT crash-safe, not the library's behaviour");
        }

        if (s.NoPrefault)
        {
            output.WriteLine("# EXPERIMENT --no-prefault: the mapped-file domain formats segments without populating their pages first (one page fault per page at the first store, the behaviour before 2026-12-02; crash-safe, slower on a fresh heap)");
        }

        if (s.RefillSweepsOnce)
        {
            output.WriteLine("# EXPERIMENT --refill-sweeps-once: the map's heap refills an empty pool with one sweep of its own, and takes the heap-full path when others took its blocks first or the parked frees were in a sweep in flight (the behaviour before 2026-12-02; crash-safe, slower)");
        }

        // Every file of the run lives in a directory of its own, deleted on the way out and also when Ctrl-C, SIGTERM
        // or an unhandled exception ends the process (none of which runs finally blocks).
        using var files = new TemporaryDirectory(s.Directory, "epvs-compare-");
        output.WriteLine($"# heap files in {files.Path}");
        DeviceWrites? device = DeviceWrites.For(files.Path);
        output.WriteLine(device is null
            ? "# device writes: not counted (no block device counter for the directory: not Linux, or a file system such as tmpfs)"
            : $"# device writes: counted on block device {device.Device} (/sys/dev/block/{device.Device}/stat), every writer of the device included");
        output.Flush();
        string path = files.File("map.heap");
        string transientPath = files.File("map.heap.transient");
        long heapSize = Math.Max(64L << 20, (long)s.KeyRange * 256);
        using (BufferedDurableHeap heap = s.Configure(BufferedDurableHeap.Create(path, new HeapFileOptions { Size = heapSize, Domain = s.Domain, MappedFileWriteBack = s.WriteBack }, s.MapHeapOptions())))
        using (BufferedDurableHeap transient = s.Configure(BufferedDurableHeap.Create(transientPath, new HeapFileOptions { Size = heapSize, Domain = s.Domain, MappedFileWriteBack = s.WriteBack }, new BufferedDurableHeapOptions { AdvancePeriod = s.Period, Mode = DurabilityMode.Transient })))
        {
            var map = new PersistentHashMap<long, long>(heap, MapTypeId);
            var transientMap = new PersistentHashMap<long, long>(transient, MapTypeId);
            var dictionary = new ConcurrentDictionary<long, long>();
            HeapFile file = heap.Heap.File;
            output.WriteLine($"# map heap: domain {file.Domain.Kind}{(file.MappedFileWriteBack is { } writeBack ? $" ({writeBack})" : string.Empty)}, persistent memory {file.Domain.IsPersistentMemory}");
            Progress(output, "preloading the three maps");
            for (long k = 0; k < s.KeyRange; k++)
            {
                map.Set(k, k);
                transientMap.Set(k, k);
                dictionary[k] = k;
            }

            Throughput(s, heap, map, transientMap, dictionary, device, output);
        }

        File.Delete(transientPath);
        using (BufferedDurableHeap heap = s.Configure(BufferedDurableHeap.Open(path, new HeapFileOptions { Domain = s.Domain, MappedFileWriteBack = s.WriteBack }, s.MapHeapOptions())))
        {
            SyncAndLag(s, heap, new PersistentHashMap<long, long>(heap, MapTypeId), output);
        }

        if (s.Domain == PersistenceDomainKind.MappedFile)
        {
            DiskFloor(s, files.File("floor.bin"), output);
        }

        File.Delete(path);
        Recovery(s, path, output);
        return 0;
    }

    private static void Progress(TextWriter output, string what)
    {
        output.WriteLine($"# [{DateTime.UtcNow:HH:mm:ss}] {what}");
        output.Flush();
    }

    private static void Throughput(ComparisonSettings s, BufferedDurableHeap heap, PersistentHashMap<long, long> map, PersistentHashMap<long, long> transientMap, ConcurrentDictionary<long, long> dictionary, DeviceWrites? device, TextWriter output)
    {
        // The transient cell is the breakdown: the same map on a DurabilityMode.Transient heap updates each payload in
        // place (no copy, no write-back, no seal, no reclamation), so it is the cost of the operation itself (version
        // region, lock, index, payload write) without the durability work.
        // The batch cells write the same random keys, gathered 64 at a time: the map through SetMany (one operation per
        // batch, the next keys' index slots loaded ahead), ConcurrentDictionary through its indexer in a loop over the
        // batch (it has no batch write). Another API than the target's per-call upsert, measured alongside it.
        string[] cells = ["ConcurrentDictionary upsert", "PersistentHashMap upsert", "PersistentHashMap upsert, transient heap", "ConcurrentDictionary read", "PersistentHashMap read", BatchBaselineCell, BatchCell];
        var results = new Dictionary<(string, int), List<double>>();
        var cores = new Dictionary<(string, int), List<double>>();
        var workerCores = new Dictionary<(string, int), List<double>>();
        var perWorkerCore = new Dictionary<(string, int), List<double>>();
        var durability = new Dictionary<(string, int), List<AdvancerStatistics>>();
        var deviceRates = new Dictionary<(string, int), List<double>>();
        var deviceBytesPerOperation = new Dictionary<(string, int), List<double>>();
        foreach (int threads in s.Threads)
        {
            for (int rep = 0; rep < s.Repetitions; rep++)
            {
                Progress(output, $"throughput, {threads} thread(s), repetition {rep + 1}/{s.Repetitions}");
                for (int c = 0; c < cells.Length; c++)
                {
                    string cell = cells[c];
                    AdvancerStatistics before = heap.GetAdvancerStatistics();
                    long deviceBefore = device?.BytesWritten() ?? -1;
                    long started = Stopwatch.GetTimestamp();
                    (double mops, double used, double byWorkers) = Measure(threads, s.Duration, s.KeyRange, $"cell{c}", () => Body(cell, map, transientMap, dictionary));
                    double seconds = Stopwatch.GetElapsedTime(started).TotalSeconds;
                    long deviceAfter = device?.BytesWritten() ?? -1;
                    double deviceBytes = deviceBefore >= 0 && deviceAfter >= 0 ? deviceAfter - deviceBefore : double.NaN;
                    (CollectionsMarshal.GetValueRefOrAddDefault(deviceRates, (cell, threads), out _) ??= new List<double>()).Add(deviceBytes / seconds / 1e6);
                    (CollectionsMarshal.GetValueRefOrAddDefault(deviceBytesPerOperation, (cell, threads), out _) ??= new List<double>()).Add(deviceBytes / (mops * 1e6 * s.Duration.TotalSeconds));
                    (CollectionsMarshal.GetValueRefOrAddDefault(durability, (cell, threads), out _) ??= new List<AdvancerStatistics>()).Add(heap.GetAdvancerStatistics().Since(before));
                    (CollectionsMarshal.GetValueRefOrAddDefault(results, (cell, threads), out _) ??= new List<double>()).Add(mops);
                    (CollectionsMarshal.GetValueRefOrAddDefault(cores, (cell, threads), out _) ??= new List<double>()).Add(used);
                    (CollectionsMarshal.GetValueRefOrAddDefault(workerCores, (cell, threads), out _) ??= new List<double>()).Add(byWorkers);
                    (CollectionsMarshal.GetValueRefOrAddDefault(perWorkerCore, (cell, threads), out _) ??= new List<double>()).Add(byWorkers > 0 ? mops / byWorkers : double.NaN);
                }
            }
        }

        output.WriteLine();
        output.WriteLine("| operation | threads | ConcurrentDictionary (Mops/s, median) | PersistentHashMap (Mops/s, median) | ratio (median of per-repetition ratios) | target |");
        output.WriteLine("|---|---:|---:|---:|---:|---|");
        foreach (string op in new[] { "upsert", "read" })
        {
            foreach (int threads in s.Threads)
            {
                List<double> baseline = results[($"ConcurrentDictionary {op}", threads)];
                List<double> persistent = results[($"PersistentHashMap {op}", threads)];
                double ratio = Median(persistent.Zip(baseline, (p, b) => p / b).ToList());
                output.WriteLine(FormattableString.Invariant($"| {op} | {threads} | {Median(baseline):0.00} | {Median(persistent):0.00} | {ratio:0.00} | ≥ 0.50 {(ratio >= 0.5 ? "met" : "NOT met")} |"));
            }
        }

        foreach (int threads in s.Threads)
        {
            List<double> baseline = results[("ConcurrentDictionary upsert", threads)];
            List<double> transient = results[("PersistentHashMap upsert, transient heap", threads)];
            double ratio = Median(transient.Zip(baseline, (p, b) => p / b).ToList());
            output.WriteLine(FormattableString.Invariant($"| upsert, transient heap (breakdown: no durability work) | {threads} | {Median(baseline):0.00} | {Median(transient):0.00} | {ratio:0.00} | (not a target) |"));
        }

        foreach (int threads in s.Threads)
        {
            List<double> baseline = results[(BatchBaselineCell, threads)];
            List<double> batched = results[(BatchCell, threads)];
            double ratio = Median(batched.Zip(baseline, (p, b) => p / b).ToList());
            output.WriteLine(FormattableString.Invariant($"| upsert in batches of {BatchSize} (map: SetMany; ConcurrentDictionary: its indexer over the batch) | {threads} | {Median(baseline):0.00} | {Median(batched):0.00} | {ratio:0.00} | (another API: not the target) |"));
        }

        // The process's CPU time per second of a cell: the workers plus the heaps' own threads (the map's advancer writes
        // its blocks back, seals and reclaims them; its stocker formats and sweeps for the pools). Where the workers cannot
        // use every core, this shows who does. The workers' own CPU time is read per thread (Linux: schedstat), so the
        // last column but one is each cell's throughput per core its workers ran on. The last is the process's CPU time per
        // operation: with every core busy, a map's ratio to ConcurrentDictionary cannot exceed the inverse ratio of theirs,
        // so a ratio of 0.5 needs at most twice ConcurrentDictionary's CPU per upsert.
        output.WriteLine();
        output.WriteLine("| upsert cell | threads | process CPU during the cell (cores, median of repetitions) | worker threads (cores) | other threads (cores) | Mops/s per worker core | process CPU per operation (ns, median of repetitions) |");
        output.WriteLine("|---|---:|---:|---:|---:|---:|---:|");
        foreach (string cell in new[] { "ConcurrentDictionary upsert", "PersistentHashMap upsert", "PersistentHashMap upsert, transient heap", BatchBaselineCell, BatchCell })
        {
            foreach (int threads in s.Threads)
            {
                double process = Median(cores[(cell, threads)]);
                double workers = Median(workerCores[(cell, threads)]);
                double perOperation = Median(cores[(cell, threads)].Zip(results[(cell, threads)], (used, mops) => mops > 0 ? used * 1000 / mops : double.NaN).ToList());
                output.WriteLine(FormattableString.Invariant($"| {cell} | {threads} | {process:0.00} | {Cell(workers)} | {Cell(process - workers)} | {Cell(Median(perWorkerCore[(cell, threads)]))} | {perOperation:0} |"));
            }
        }

        // What the durability work cost the map's writers in its two cells: the share of their time the back-pressure held
        // them at the start of an operation (a version older than MaxVersionAge: ended by them or waited for), and the
        // cycles that paced them (per cycle: the write-back with its fences — the medium's time — the seals, the
        // reclamation), and the times a writer found its pool empty and formatted or swept for itself (a write-back and a
        // fence inside its operation). The heap's statistics over each cell (the cycles also run between cells: the ones
        // that ended in it).
        output.WriteLine();
        output.WriteLine("| durable upsert cell | threads | writers held back by the back-pressure (share of their time, median) | held-back waits per second | cycles per second | write-back per cycle (ms) | of which fences (ms) | seal per cycle (ms) | reclaim per cycle (ms) | writers' own refills per second (median) | device writes (MB/s, median) | device bytes per operation (median) |");
        output.WriteLine("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        foreach (string cell in new[] { "PersistentHashMap upsert", BatchCell })
        {
            foreach (int threads in s.Threads)
            {
                List<AdvancerStatistics> measured = durability[(cell, threads)];
                double seconds = s.Duration.TotalSeconds;
                double held = Median(measured.Select(d => d.BackPressureTime.TotalSeconds / (threads * seconds)).ToList());
                double waits = Median(measured.Select(d => d.BackPressureWaits / seconds).ToList());
                double cycles = Median(measured.Select(d => d.Cycles / seconds).ToList());
                double PerCycle(Func<AdvancerStatistics, TimeSpan> part) => Median(measured.Select(d => d.Cycles == 0 ? double.NaN : part(d).TotalMilliseconds / d.Cycles).ToList());
                output.WriteLine(FormattableString.Invariant($"| {cell} | {threads} | {held:P0} | {waits:0} | {cycles:0} | {PerCycle(d => d.WriteBackTime):0.0} | {PerCycle(d => d.FenceTime):0.0} | {PerCycle(d => d.SealTime):0.0} | {PerCycle(d => d.ReclaimTime):0.0} | {Median(measured.Select(d => d.AllocatorRefills / seconds).ToList()):0} | {Cell(Median(deviceRates[(cell, threads)]), "0")} | {Cell(Median(deviceBytesPerOperation[(cell, threads)]), "0")} |"));
            }
        }

        // Each repetition of the two durable cells, in order: a stall of the cycles (a refill on the heap-full path inside
        // an operation held every transition up) shows as a repetition with far fewer cycles, which the medians hide.
        output.WriteLine();
        output.WriteLine("| durable upsert cell | threads | Mops/s, each repetition | cycles per second, each repetition |");
        output.WriteLine("|---|---:|---|---|");
        foreach (string cell in new[] { "PersistentHashMap upsert", BatchCell })
        {
            foreach (int threads in s.Threads)
            {
                string mops = string.Join(" ", results[(cell, threads)].Select(m => m.ToString("0.00", CultureInfo.InvariantCulture)));
                string cycles = string.Join(" ", durability[(cell, threads)].Select(d => (d.Cycles / s.Duration.TotalSeconds).ToString("0", CultureInfo.InvariantCulture)));
                output.WriteLine($"| {cell} | {threads} | {mops} | {cycles} |");
            }
        }

        output.WriteLine();
        Floor(s, results, output);
        output.Flush();
    }

    private const string BatchBaselineCell = "ConcurrentDictionary upsert, batches of 64";
    private const string BatchCell = "PersistentHashMap upsert, batches of 64 (SetMany)";
    private const int BatchSize = 64;

    /// <summary>One worker thread's operation for <paramref name="cell"/>, called with each random key (and value).</summary>
    private static Action<long, long> Body(string cell, PersistentHashMap<long, long> map, PersistentHashMap<long, long> transientMap, ConcurrentDictionary<long, long> dictionary)
    {
        if (cell is BatchBaselineCell or BatchCell)
        {
            var batch = new KeyValuePair<long, long>[BatchSize];
            int count = 0;
            bool persistent = cell == BatchCell;
            return (key, value) =>
            {
                batch[count++] = new KeyValuePair<long, long>(key, value);
                if (count < BatchSize)
                {
                    return;
                }

                count = 0;
                if (persistent)
                {
                    map.SetMany(batch);
                    return;
                }

                foreach (KeyValuePair<long, long> item in batch)
                {
                    dictionary[item.Key] = item.Value;
                }
            };
        }

        return cell switch
        {
            "ConcurrentDictionary upsert" => (key, value) => dictionary[key] = value,
            "ConcurrentDictionary read" => (key, _) => dictionary.TryGetValue(key, out _),
            "PersistentHashMap upsert" => (key, value) => map.Set(key, value),
            "PersistentHashMap upsert, transient heap" => (key, value) => transientMap.Set(key, value),
            "PersistentHashMap read" => (key, _) => map.TryGetValue(key, out _),
            _ => throw new ArgumentOutOfRangeException(nameof(cell), cell, "Unknown cell."),
        };
    }

    /// <summary>
    /// The one-thread upserts in nanoseconds per operation, next to what one dependent cache-line load costs on this
    /// machine at a few footprints (<see cref="MemoryLatency"/>): an upsert of a random key pays at least one.
    /// </summary>
    private static void Floor(ComparisonSettings s, Dictionary<(string, int), List<double>> results, TextWriter output)
    {
        if (!s.Threads.Contains(1))
        {
            return;
        }

        Progress(output, "dependent-load latency");
        output.WriteLine("| one thread | ns per operation or load |");
        output.WriteLine("|---|---:|");
        foreach (string cell in new[] { "ConcurrentDictionary upsert", "PersistentHashMap upsert", "PersistentHashMap upsert, transient heap" })
        {
            output.WriteLine(FormattableString.Invariant($"| {cell} (median) | {1000 / Median(results[(cell, 1)]):0} |"));
        }

        long loads = s.Quick ? 2_000_000 : 10_000_000;
        foreach (int mib in new[] { 16, 64, 128 })
        {
            output.WriteLine(FormattableString.Invariant($"| one dependent load, random line of {mib} MiB | {MemoryLatency.DependentLoadNanoseconds((long)mib << 20, loads):0} |"));
        }

        output.WriteLine("(The map's index holds 2 to 4 slots of 64 bytes per key: 128 MiB for 1 M keys of long. ConcurrentDictionary's nodes and buckets take about 56 bytes per key.)");
        output.WriteLine();
    }

    /// <summary>A CPU figure, or "n/a" where the workers' own CPU time cannot be read (not Linux).</summary>
    private static string Cell(double value, string format = "0.00") => double.IsNaN(value) ? "n/a" : value.ToString(format, System.Globalization.CultureInfo.InvariantCulture);

    /// <summary>
    /// Runs <paramref name="threads"/> workers for <paramref name="duration"/>: millions of calls per second, the
    /// process's CPU cores used meanwhile, and the workers' own (NaN where it cannot be read). The workers are named
    /// <paramref name="name"/>-0, -1, … (what a profiler such as perf shows as their command, so that each cell's samples
    /// can be told apart).
    /// </summary>
    private static (double Mops, double Cores, double WorkerCores) Measure(int threads, TimeSpan duration, int keyRange, string name, Func<Action<long, long>> newBody)
    {
        int stop = 0;
        long total = 0;
        long workerNanoseconds = 0;
        using var start = new Barrier(threads + 1);
        var workers = new Thread[threads];
        var failure = new WorkerFailure();
        for (int t = 0; t < threads; t++)
        {
            int seed = t;
            Action<long, long> body = newBody();
            workers[t] = new Thread(failure.Guard(() =>
            {
                ulong x = (ulong)(seed + 1) * 0x9E37_79B9_7F4A_7C15UL;
                long ops = 0;
                start.SignalAndWait();
                long cpuAtStart = ThreadCpuNanoseconds();
                // Volatile.Read: acquire; pairs with the Volatile.Write of the timing thread.
                while (Volatile.Read(ref stop) == 0)
                {
                    for (int i = 0; i < 64; i++)
                    {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        body((long)(x % (ulong)keyRange), (long)x);
                    }

                    ops += 64;
                }

                // Interlocked.Add: the workers' totals meet here; atomicity only.
                Interlocked.Add(ref total, ops);
                long cpuAtEnd = ThreadCpuNanoseconds();
                Interlocked.Add(ref workerNanoseconds, cpuAtStart < 0 || cpuAtEnd < 0 ? long.MinValue / 64 : cpuAtEnd - cpuAtStart);
            }))
            { IsBackground = true, Name = $"{name}-{t}" };
            workers[t].Start();
        }

        start.SignalAndWait();
        var watch = Stopwatch.StartNew();
        TimeSpan cpu = Process.GetCurrentProcess().TotalProcessorTime;
        Thread.Sleep(duration);
        // Volatile.Write: release; pairs with the workers' Volatile.Read.
        Volatile.Write(ref stop, 1);
        foreach (Thread worker in workers)
        {
            worker.Join();
        }

        failure.ThrowIfFailed();
        double seconds = watch.Elapsed.TotalSeconds;
        cpu = Process.GetCurrentProcess().TotalProcessorTime - cpu;
        long onCpu = Interlocked.Read(ref workerNanoseconds);
        return (Interlocked.Read(ref total) / seconds / 1e6, cpu.TotalSeconds / seconds, onCpu < 0 ? double.NaN : onCpu / 1e9 / seconds);
    }

    /// <summary>
    /// The calling thread's time on a CPU so far, in nanoseconds (Linux: the first field of /proc/thread-self/schedstat),
    /// or -1 where it cannot be read.
    /// </summary>
    private static long ThreadCpuNanoseconds()
    {
        try
        {
            string text = File.ReadAllText("/proc/thread-self/schedstat");
            int space = text.IndexOf(' ', StringComparison.Ordinal);
            return long.Parse(space < 0 ? text : text[..space], System.Globalization.CultureInfo.InvariantCulture);
        }
        catch (Exception e) when (e is IOException or UnauthorizedAccessException or FormatException)
        {
            return -1;
        }
    }

    private static void SyncAndLag(ComparisonSettings s, BufferedDurableHeap heap, PersistentHashMap<long, long> map, TextWriter output)
    {
        Progress(output, $"Sync latency and durability lag under {Writers(s.LagWriters)}, {s.Syncs} samples each");
        int stop = 0;
        var writers = new List<Thread>();
        var failure = new WorkerFailure();
        for (int w = 0; w < s.LagWriters; w++)
        {
            int seed = 7 + w;
            var writer = new Thread(failure.Guard(() =>
            {
                var random = new Random(seed);
                // Volatile.Read: acquire; pairs with the Volatile.Write below.
                while (Volatile.Read(ref stop) == 0)
                {
                    long key = random.Next(s.KeyRange);
                    map.Set(key, key);
                }
            }))
            { IsBackground = true };
            writer.Start();
            writers.Add(writer);
        }

        long firstVersion = heap.CurrentVersion;
        AdvancerStatistics before = heap.GetAdvancerStatistics();
        long sweptBefore = heap.Heap.StockSweptBlocks;
        long formattedBefore = heap.Heap.StockFormattedSegments;
        SweepLog? log = heap.Heap.SweepLogForTesting;
        (long Entries, long Turns, long Headers) logBefore = log is null ? default : (log.EntriesAppended, log.Turns, log.HeadersWrittenBack);
        long ioBefore = BytesWrittenBySystemCalls();
        var phase = Stopwatch.StartNew();
        var random = new Random(8);
        var syncs = new List<double>();
        for (int i = 0; i < s.Syncs; i++)
        {
            Thread.Sleep(random.Next(1, 20));
            var watch = Stopwatch.StartNew();
            heap.Sync();
            syncs.Add(watch.Elapsed.TotalMilliseconds);
        }

        // Lag: an operation completes, then the time until the durable frontier covers its version (read after the
        // operation ended, so at or above the operation's own version: the lag is an upper bound), polled every 1 ms.
        // (The writers above keep the heap busy: an idle heap's advancer would not end a version read without writing.)
        var lags = new List<double>();
        for (int i = 0; i < s.Syncs; i++)
        {
            Thread.Sleep(random.Next(1, 20));
            long key = random.Next(s.KeyRange);
            map.Set(key, key);
            var watch = Stopwatch.StartNew();
            long version = heap.CurrentVersion;
            while (heap.DurableFrontier < version)
            {
                Thread.Sleep(1);
            }

            lags.Add(watch.Elapsed.TotalMilliseconds);
        }

        // Volatile.Write: release; pairs with the writer's Volatile.Read.
        Volatile.Write(ref stop, 1);
        foreach (Thread writer in writers)
        {
            writer.Join();
        }

        failure.ThrowIfFailed();
        long ioAfter = BytesWrittenBySystemCalls();
        double p = s.Period.TotalMilliseconds;

        // Versions advanced while the writer ran: the mean time of one advance cycle (transition, write-back of the
        // version, frontier, reclamation). When it exceeds the period, cycles run back to back and the write-back of a
        // version, not the schedule, bounds Sync and the lag.
        long versions = heap.CurrentVersion - firstVersion;
        output.WriteLine(FormattableString.Invariant($"# advance cycles under the writer: {versions} versions in {phase.Elapsed.TotalSeconds:0.0} s, {phase.Elapsed.TotalMilliseconds / Math.Max(1, versions):0.0} ms per cycle ({phase.Elapsed.TotalMilliseconds / Math.Max(1, versions) / p:0.00} periods)"));

        // Where those cycles went (the heap's own counters): write-back of the version and the frontier, sealing its
        // blocks, reclamation (deferring and sweeping frees).
        AdvancerStatistics cycles = heap.GetAdvancerStatistics().Since(before);
        double n = Math.Max(1, cycles.Cycles);
        output.WriteLine(FormattableString.Invariant($"# per cycle ({cycles.Cycles} cycles): {cycles.BlocksWrittenBack / n:0} blocks written back; write-back {cycles.WriteBackTime.TotalMilliseconds / n:0.0} ms, seal {cycles.SealTime.TotalMilliseconds / n:0.0} ms, reclaim {cycles.ReclaimTime.TotalMilliseconds / n:0.0} ms; {cycles.AllocatorRefills} refills by the writer itself"));

        // What the cycles wrote into the page cache (the process's write system calls: the private mapping's pwrites of
        // whole pages, which the fences then send to the disk).
        // And what the stocker made ready meanwhile: each swept block's free is made durable by 16 bytes in the sweep log
        // (format 10; its page is written once, with the version that reuses it), and the log's turns write back the
        // headers of blocks still free when their entries are retired; a formatted segment is written whole.
        long swept = heap.Heap.StockSweptBlocks - sweptBefore;
        long formatted = heap.Heap.StockFormattedSegments - formattedBefore;
        output.WriteLine(FormattableString.Invariant($"# per cycle, the stocker: {swept / n:0} parked blocks swept, {formatted / n:0.0} segments formatted"));
        if (log is not null)
        {
            output.WriteLine(FormattableString.Invariant($"# sweep log: {(log.EntriesAppended - logBefore.Entries) / n:0} entries per cycle, {log.Turns - logBefore.Turns} turns, {(log.HeadersWrittenBack - logBefore.Headers) / n:0} headers written back by turns per cycle"));
        }
        if (ioBefore >= 0 && ioAfter >= 0)
        {
            long pagesWorth = cycles.BlocksWrittenBack + swept;
            output.WriteLine(FormattableString.Invariant($"# per cycle, from /proc/self/io (wchar): {(ioAfter - ioBefore) / n / 1024:0} KiB written by system calls ({(ioAfter - ioBefore) / Math.Max(1, cycles.BlocksWrittenBack):0} bytes per block written back; {(ioAfter - ioBefore - (formatted * HeapLayout.SegmentSize)) / (double)Math.Max(1, pagesWorth):0} per block written back or swept, formatted segments' bytes left out)"));
        }

        string age = s.MaxVersionAge is { } a ? (a == Timeout.InfiniteTimeSpan ? ", no MaxVersionAge" : FormattableString.Invariant($", MaxVersionAge {a.TotalMilliseconds:0} ms")) : string.Empty;
        age += s.UnsafeSweepsFenceOnly ? ", EXPERIMENT: sweeps fence, not durable" : s.UnsafeSweepsNotDurable ? ", EXPERIMENT: sweeps not durable" : string.Empty;
        output.WriteLine(FormattableString.Invariant($"| under {Writers(s.LagWriters)}, {p:0} ms advance period{age} | p50 (ms) | p90 (ms) | p99 (ms) | max (ms) | p50 (periods) | p99 (periods) | target |"));
        output.WriteLine("|---|---:|---:|---:|---:|---:|---:|---|");
        output.WriteLine(Row("Sync latency", syncs, p, "p50 ≤ 2 periods", Percentile(syncs, 0.5) <= 2 * p));
        output.WriteLine(Row("durability lag", lags, p, "p99 ≤ 2 periods", Percentile(lags, 0.99) <= 2 * p));
        output.WriteLine();
        output.Flush();
    }

    /// <summary>
    /// The floor under the page cache's lag, on the disk of the heap files and with nothing else running: a cycle
    /// ends with two fences (its version's payloads and seals, then the frontier, which must not be durable before
    /// them), and each waits for the disk to flush. Timed here with the smallest write each can have (one page), the
    /// cycle's fences take at least this; a sample's lag adds the rest of its version (up to a period), sealing and
    /// its version's bytes.
    /// </summary>
    private static void DiskFloor(ComparisonSettings s, string path, TextWriter output)
    {
        Progress(output, $"disk floor: one-page writes flushed to disk, {s.Syncs} samples each, and a streaming write, after the map's heap closed");
        byte[] page = new byte[4096];
        var one = new List<double>();
        var two = new List<double>();
        using (SafeFileHandle file = File.OpenHandle(path, FileMode.Create, FileAccess.ReadWrite, FileShare.None, FileOptions.None, preallocationSize: 1L << 20))
        {
            RandomAccess.Write(file, new byte[1 << 20], 0);
            RandomAccess.FlushToDisk(file);
            for (int i = 0; i < s.Syncs; i++)
            {
                page[0] = (byte)i;
                var watch = Stopwatch.StartNew();
                RandomAccess.Write(file, page, 4096);
                RandomAccess.FlushToDisk(file);
                one.Add(watch.Elapsed.TotalMilliseconds);
                watch.Restart();
                RandomAccess.Write(file, page, 8192);
                RandomAccess.FlushToDisk(file);
                RandomAccess.Write(file, page, 0);
                RandomAccess.FlushToDisk(file);
                two.Add(watch.Elapsed.TotalMilliseconds);
            }
        }

        File.Delete(path);

        // The disk's streaming bandwidth, which the durable cells' device writes compare with: a run of megabyte writes
        // through the page cache, timed to the end of its flush (random bytes, so nothing below can skip them).
        long streamed = (s.Quick ? 64L : 256L) << 20;
        byte[] chunk = new byte[1 << 20];
        new Random(17).NextBytes(chunk);
        var stream = Stopwatch.StartNew();
        using (SafeFileHandle file = File.OpenHandle(path, FileMode.Create, FileAccess.ReadWrite, FileShare.None, FileOptions.None, preallocationSize: streamed))
        {
            for (long offset = 0; offset < streamed; offset += chunk.Length)
            {
                RandomAccess.Write(file, chunk, offset);
            }

            RandomAccess.FlushToDisk(file);
        }

        double bandwidth = streamed / stream.Elapsed.TotalSeconds / 1e6;
        File.Delete(path);

        double p = s.Period.TotalMilliseconds;
        output.WriteLine(FormattableString.Invariant($"| disk floor, in periods of {p:0} ms | p50 (ms) | p90 (ms) | p99 (ms) | max (ms) | p50 (periods) | p99 (periods) | note |"));
        output.WriteLine("|---|---:|---:|---:|---:|---:|---:|---|");
        output.WriteLine(FloorRow("one page written and flushed", one, p, "one fence at its smallest"));
        output.WriteLine(FloorRow("two, one after the other", two, p, "a cycle's two fences at their smallest"));
        output.WriteLine();
        output.WriteLine("| disk bandwidth | MB/s | note |");
        output.WriteLine("|---|---:|---|");
        output.WriteLine(FormattableString.Invariant($"| {streamed >> 20} MiB in 1 MiB writes through the page cache, then one flush (1 sample) | {bandwidth:0} | what the durable upsert cells' device writes compare with |"));
        output.WriteLine();
        output.Flush();
    }

    private static string FloorRow(string name, List<double> samples, double period, string note) =>
        FormattableString.Invariant($"| {name} ({samples.Count} samples) | {Percentile(samples, 0.5):0.0} | {Percentile(samples, 0.9):0.0} | {Percentile(samples, 0.99):0.0} | {samples.Max():0.0} | {Percentile(samples, 0.5) / period:0.00} | {Percentile(samples, 0.99) / period:0.00} | {note} |");

    /// <summary>
    /// The process's bytes written by system calls so far (/proc/self/io, wchar), or -1 where it cannot be read. (Not
    /// write_bytes: with large page-cache folios, as ext4 has since Linux 6.16, it counts a whole folio for each page
    /// written, several times what the disk receives.)
    /// </summary>
    private static long BytesWrittenBySystemCalls()
    {
        try
        {
            foreach (string line in File.ReadLines("/proc/self/io"))
            {
                if (line.StartsWith("wchar:", StringComparison.Ordinal))
                {
                    return long.Parse(line.AsSpan(6), System.Globalization.CultureInfo.InvariantCulture);
                }
            }

            return -1;
        }
        catch (Exception e) when (e is IOException or UnauthorizedAccessException or FormatException)
        {
            return -1;
        }
    }

    private static string Writers(int count) => count == 1 ? "one writer" : FormattableString.Invariant($"{count} writers");

    private static string Row(string name, List<double> samples, double period, string target, bool met) =>
        FormattableString.Invariant($"| {name} ({samples.Count} samples) | {Percentile(samples, 0.5):0.0} | {Percentile(samples, 0.9):0.0} | {Percentile(samples, 0.99):0.0} | {samples.Max():0.0} | {Percentile(samples, 0.5) / period:0.00} | {Percentile(samples, 0.99) / period:0.00} | {target} {(met ? "met" : "NOT met")} |");

    /// <summary>The superblock offset of the clean-shutdown word (documented on the heap's file layout).</summary>
    private const int CleanShutdownOffset = 56;

    private static void Recovery(ComparisonSettings s, string path, TextWriter output)
    {
        Progress(output, $"filling a {s.RecoveryBytes >> 20} MiB heap with 1 KB payloads for crash recovery");
        long payloads;
        const long PerPayload = 1280; // the block of a 1 KB payload + 32-byte header
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, new HeapFileOptions { Size = s.RecoveryBytes + (64L << 20), Domain = PersistenceDomainKind.MappedFile, MappedFileWriteBack = s.WriteBack }))
        {
            var map = new PersistentByteMap<long>(heap, MapTypeId);
            byte[] value = new byte[1024 - sizeof(long)];
            payloads = s.RecoveryBytes / PerPayload;
            for (long i = 0; i < payloads; i++)
            {
                map.Set(i, value);
            }
        }

        // The clean-shutdown word as an open leaves it (cleared, in the file format's sealed encoding): written back
        // before each repetition, it makes the file look like a heap whose process died.
        byte[] crashed;
        using (HeapFile open = HeapFile.Open(path, new HeapFileOptions { Domain = PersistenceDomainKind.MappedFile, MappedFileWriteBack = s.WriteBack }))
        {
            crashed = open.Domain.GetSpan(CleanShutdownOffset, sizeof(long)).ToArray();
        }

        var times = new List<double>();
        var heapTimes = new List<double>();
        long live = 0;
        for (int rep = 0; rep < Math.Max(1, s.Repetitions); rep++)
        {
            Progress(output, $"crash recovery, repetition {rep + 1}");
            using (var stream = new FileStream(path, FileMode.Open, FileAccess.ReadWrite))
            {
                stream.Position = CleanShutdownOffset;
                stream.Write(crashed);
            }

            var watch = Stopwatch.StartNew();
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(path, new HeapFileOptions { Domain = PersistenceDomainKind.MappedFile, MappedFileWriteBack = s.WriteBack }, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
            var map = new PersistentByteMap<long>(heap, MapTypeId);
            times.Add(watch.Elapsed.TotalMilliseconds);
            heapTimes.Add(heap.Recovery.Duration.TotalMilliseconds);
            live = map.Count;
        }

        output.WriteLine("| crash recovery (mapped file, page cache warm) | heap | live payloads | median (ms) | of which the heap's recovery: scan, resolve, frees (ms, median) | target |");
        output.WriteLine("|---|---:|---:|---:|---:|---|");
        output.WriteLine(FormattableString.Invariant($"| open + scan + map index rebuild, {times.Count} runs | {s.RecoveryBytes >> 20} MiB | {live:N0} | {Median(times):0} | {Median(heapTimes):0} | < 1 s for 1 GiB {(s.RecoveryBytes >= 1L << 30 ? (Median(times) < 1000 ? "met" : "NOT met") : "(heap smaller than 1 GiB: not judged)")} |"));
        output.Flush();
    }

    private static double Median(List<double> values) => Percentile(values, 0.5);

    private static double Percentile(List<double> values, double q)
    {
        var sorted = values.OrderBy(v => v).ToList();
        return sorted[(int)Math.Min(sorted.Count - 1, q * sorted.Count)];
    }
}
