using System;
using System.Collections.Concurrent;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using System.Threading;
using Epvs.Samples;
using Epvs.Samples.CprCheckpoint;
using Epvs.Scaling.Arrays;
using Epvs.Scaling.Harness;
using FASTER.core;

namespace Epvs.Scaling.Kv;

/// <summary>
/// The paper's Fig. 16: a key-value store under YCSB-style 50:50 read/upsert over uniformly random keys takes a
/// checkpoint every few milliseconds. Fine-grained: one operation per protected region; coarse-grained: 16,384
/// operations per region, refreshing protection between regions. Mechanisms: no checkpoints (upper bound), the
/// samples/CprCheckpoint store (EPVS REST → WAIT_FLUSH → REST), the same store's layout under a reader–writer latch
/// (capture under the exclusive latch), and FASTER.core's own CPR (FasterKV hybrid-log snapshot checkpoints).
/// </summary>
public static class CheckpointFigure
{
    private const int Keys = 1 << 16;
    private const int FineBatch = 16;
    private const int CoarseBatch = 16_384;

    private enum Mechanism
    {
        None,
        Epvs,
        Latch,
        Faster,
    }

    /// <summary>Checkpoints completed per run, by (series, threads), in run order (the warm-up run first).</summary>
    private static readonly ConcurrentDictionary<(string Series, int Threads), ConcurrentQueue<long>> Checkpoints = new();

    /// <summary>Runs the figure.</summary>
    public static FigureResult Fig16(RunSettings settings)
    {
        // Several checkpoints per measured run: one every tenth of it (50 ms in the published 500 ms runs).
        var interval = TimeSpan.FromMilliseconds(Math.Max(5, settings.Duration.TotalMilliseconds / 10));
        // The checkpoint files live in a directory of their own, deleted on the way out and also when Ctrl-C, SIGTERM
        // or an unhandled exception ends the process (none of which runs finally blocks).
        using var checkpointFiles = new TemporaryDirectory(Path.GetTempPath(), "epvs-fig16-");
        string root = checkpointFiles.Path;
        var fig = new FigureResult("fig16", "Checkpointing a KV store, YCSB 50:50 uniform, fine and coarse regions (paper Fig. 16)", "threads",
            settings.Threads.Select(ArrayFigures.Str), xIsThreads: true);
        var mechanisms = new (string Name, Mechanism M)[]
        {
            ("no checkpoints", Mechanism.None),
            ("EPVS CPR (sample)", Mechanism.Epvs),
            ("RW-latch checkpoint", Mechanism.Latch),
            ("FASTER CPR", Mechanism.Faster),
        };
        foreach (bool coarse in new[] { false, true })
        {
            foreach ((string name, Mechanism m) in mechanisms)
            {
                string series = $"{name}, {(coarse ? "coarse" : "fine")}";
                foreach (int threads in settings.Threads)
                {
                    int t = threads;
                    fig.Schedule(series, ArrayFigures.Str(t), t, () => Setup(m, coarse, series, t, interval, root));
                }
            }
        }
        fig.RunScheduled(settings);

        fig.Note($"{Keys:N0} keys loaded first; each operation reads or upserts (50:50) a uniformly random key; one client/session per thread. Fine: one operation per protected region (stop flag read every {FineBatch}). Coarse: {CoarseBatch:N0} operations per region, refreshing protection (EPVS Refresh, FASTER UnsafeContext.Refresh, or releasing and retaking the shared latch) between regions.");
        fig.Note($"A driver thread (not counted) takes a checkpoint, waits for it to complete, then pauses {interval.TotalMilliseconds:0} ms, until the run ends. Checkpoint files go to a temporary directory on the local disk, without fsync; the paper wrote to /dev/null.");
        fig.Note("EPVS CPR (sample): samples/CprCheckpoint's CprStore (de-duplicated requests; the critical section into WAIT_FLUSH takes the cut, requests read-copy-update frozen records during the flush, back to REST when the file is complete); coarse regions use CprSession.BeginBatch (one protected region, CprBatch.Refresh between regions).");
        fig.Note("RW-latch checkpoint: the same store layout under a ReaderWriterLockSlim: operations hold the shared latch; a checkpoint copies every record and the de-duplication vector under the exclusive latch, then writes the same file format outside it.");
        fig.Note("FASTER CPR: FASTER.core 2.6.5 FasterKV<long, long> (2^16 buckets, 64 MiB in-memory log on a local-file log device, checkpoint directory in the temporary directory), TryInitiateHybridLogCheckpoint(Snapshot) + CompleteCheckpointAsync; coarse regions use the session's UnsafeContext (BeginUnsafe, Refresh between regions, EndUnsafe). FASTER's store is a different (hash index + log) structure from the sample's, so compare each mechanism with its own 'no checkpoints' bound only where one exists: the 'no checkpoints' series is the sample's store.");
        bool warm = settings.Warmup > TimeSpan.Zero;
        foreach (string series in fig.Series)
        {
            var perThreads = settings.Threads.Select(t =>
            {
                if (!Checkpoints.TryGetValue((series, t), out var q))
                    return "—";
                long[] runs = q.Skip(warm ? 1 : 0).ToArray();
                return runs.Length == 0 ? "—" : string.Join("/", runs);
            });
            if (series.StartsWith("no checkpoints", StringComparison.Ordinal))
                continue;
            fig.Note($"Checkpoints completed per measured run, {series}, threads {string.Join(", ", settings.Threads)}: {string.Join("; ", perThreads)}.");
        }
        double two(string s) => fig.Get(s, "2");
        foreach (string g in new[] { "fine", "coarse" })
        {
            fig.Check($"{g}, 2 threads: EPVS CPR / no checkpoints {ArrayFigures.Pct(two($"EPVS CPR (sample), {g}") / two($"no checkpoints, {g}"))}; EPVS CPR / RW-latch checkpoint {ArrayFigures.Ratio(two($"EPVS CPR (sample), {g}") / two($"RW-latch checkpoint, {g}"))}; EPVS CPR / FASTER CPR {ArrayFigures.Ratio(two($"EPVS CPR (sample), {g}") / two($"FASTER CPR, {g}"))}");
        }
        return fig;
    }

    private static RunContext Setup(Mechanism mechanism, bool coarse, string series, int threads, TimeSpan interval, string root)
    {
        string directory = Path.Combine(root, Guid.NewGuid().ToString("N"));
        Directory.CreateDirectory(directory);
        var counts = Checkpoints.GetOrAdd((series, threads), _ => new ConcurrentQueue<long>());
        return mechanism switch
        {
            Mechanism.None or Mechanism.Epvs => SetupSample(mechanism == Mechanism.Epvs, coarse, threads, interval, directory, counts),
            Mechanism.Latch => SetupLatch(coarse, threads, interval, directory, counts),
            _ => SetupFaster(coarse, interval, directory, counts),
        };
    }

    /// <summary>
    /// Starts the checkpoint driver once, from the first worker to arrive (so it runs only while the workers do):
    /// checkpoint, wait for completion, pause, until the stop flag is set. Returns the thread and the count.
    /// </summary>
    private sealed class Driver
    {
        private readonly Action checkpoint;
        private readonly TimeSpan interval;
        private Thread? thread;
        private Exception? failure;
        private long completed;

        public Driver(Action checkpoint, TimeSpan interval)
        {
            this.checkpoint = checkpoint;
            this.interval = interval;
        }

        public void StartOnce(StopFlag stop)
        {
            var t = new Thread(() =>
            {
                try
                {
                    while (!stop.IsSet)
                    {
                        Thread.Sleep(interval);
                        if (stop.IsSet)
                            break;
                        checkpoint();
                        Interlocked.Increment(ref completed);
                    }
                }
                catch (Exception ex)
                {
                    failure = ex;
                }
            })
            { IsBackground = true, Name = "checkpoint driver" };
            if (Interlocked.CompareExchange(ref thread, t, null) is null)
                t.Start();
        }

        /// <summary>Waits for the driver (after the workers stopped) and returns the checkpoints it completed.</summary>
        public long Join()
        {
            if (Volatile.Read(ref thread) is { } t && !t.Join(TimeSpan.FromSeconds(60)))
                throw new TimeoutException("The checkpoint driver did not finish within 60 s.");
            if (failure is not null)
                throw new InvalidOperationException("A checkpoint failed.", failure);
            return Interlocked.Read(ref completed);
        }
    }

    private static RunContext SetupSample(bool checkpoints, bool coarse, int threads, TimeSpan interval, string directory, ConcurrentQueue<long> counts)
    {
        var store = new CprStore(directory, new CprStoreOptions { FlushToDisk = false, RetainedCheckpoints = 2 });
        // Load with a separate client, so that the workers' clients 0..threads-1 start at sequence 0.
        using (CprSession loader = store.OpenSession(threads))
        {
            for (long k = 0; k < Keys; k++)
                loader.Upsert(k + 1, k, k);
        }
        var driver = checkpoints ? new Driver(() => store.TakeCheckpointAsync().GetAwaiter().GetResult(), interval) : null;

        long Worker(int thread, StopFlag stop)
        {
            driver?.StartOnce(stop);
            using CprSession session = store.OpenSession(thread);
            var rng = new FastRandom((ulong)thread + 1);
            long ops = 0, sequence = 0;
            if (!coarse)
            {
                while (!stop.IsSet)
                {
                    for (int i = 0; i < FineBatch; i++)
                    {
                        long key = rng.Next(Keys);
                        if ((rng.NextUInt64() & 1) == 0)
                            session.TryRead(key, out _);
                        else
                            session.Upsert(++sequence, key, key);
                    }
                    ops += FineBatch;
                }
                return ops;
            }
            using CprBatch batch = session.BeginBatch();
            while (!stop.IsSet)
            {
                for (int i = 0; i < CoarseBatch; i++)
                {
                    long key = rng.Next(Keys);
                    if ((rng.NextUInt64() & 1) == 0)
                        batch.TryRead(key, out _);
                    else
                        batch.Upsert(++sequence, key, key);
                }
                ops += CoarseBatch;
                batch.Refresh();
            }
            return ops;
        }

        return new RunContext(Worker, () =>
        {
            if (driver is not null)
                counts.Enqueue(driver.Join());
            store.Dispose();
        });
    }

    private static RunContext SetupLatch(bool coarse, int threads, TimeSpan interval, string directory, ConcurrentQueue<long> counts)
    {
        var store = new LatchedCheckpointStore(directory, threads + 1);
        store.EnterShared();
        for (long k = 0; k < Keys; k++)
            store.UpsertShared(threads, k + 1, k, k);
        store.ExitShared();
        var driver = new Driver(store.TakeCheckpoint, interval);

        long Worker(int thread, StopFlag stop)
        {
            driver.StartOnce(stop);
            var rng = new FastRandom((ulong)thread + 1);
            long ops = 0, sequence = 0;
            int perRegion = coarse ? CoarseBatch : 1;
            int perCheck = coarse ? CoarseBatch : FineBatch;
            while (!stop.IsSet)
            {
                for (int i = 0; i < perCheck; i += perRegion)
                {
                    store.EnterShared();
                    try
                    {
                        for (int j = 0; j < perRegion; j++)
                        {
                            long key = rng.Next(Keys);
                            if ((rng.NextUInt64() & 1) == 0)
                                store.TryReadShared(key, out _);
                            else
                                store.UpsertShared(thread, ++sequence, key, key);
                        }
                    }
                    finally
                    {
                        store.ExitShared();
                    }
                }
                ops += perCheck;
            }
            return ops;
        }

        return new RunContext(Worker, () =>
        {
            counts.Enqueue(driver.Join());
            store.Dispose();
        });
    }

    private static RunContext SetupFaster(bool coarse, TimeSpan interval, string directory, ConcurrentQueue<long> counts)
    {
        IDevice log = Devices.CreateLogDevice(Path.Combine(directory, "hlog.log"), deleteOnClose: true);
        var kv = new FasterKV<long, long>(1L << 16,
            new LogSettings { LogDevice = log, MemorySizeBits = 26, PageSizeBits = 20 },
            new CheckpointSettings { CheckpointDir = Path.Combine(directory, "checkpoints"), RemoveOutdated = true });
        var functions = new SimpleFunctions<long, long>();
        using (var loader = kv.For(functions).NewSession<SimpleFunctions<long, long>>())
        {
            for (long k = 0; k < Keys; k++)
            {
                long key = k, value = k;
                loader.Upsert(ref key, ref value);
            }
            loader.CompletePending(wait: true);
        }
        var driver = new Driver(() =>
        {
            if (!kv.TryInitiateHybridLogCheckpoint(out _, CheckpointType.Snapshot))
                throw new InvalidOperationException("FASTER refused to start a checkpoint (another one running?)");
            kv.CompleteCheckpointAsync().AsTask().GetAwaiter().GetResult();
        }, interval);

        long Worker(int thread, StopFlag stop)
        {
            driver.StartOnce(stop);
            using var session = kv.For(functions).NewSession<SimpleFunctions<long, long>>();
            var rng = new FastRandom((ulong)thread + 1);
            long ops = 0;
            if (!coarse)
            {
                while (!stop.IsSet)
                {
                    for (int i = 0; i < FineBatch; i++)
                    {
                        long key = rng.Next(Keys);
                        if ((rng.NextUInt64() & 1) == 0)
                        {
                            long output = 0;
                            if (session.Read(ref key, ref output).IsPending)
                                session.CompletePending(wait: true);
                        }
                        else
                        {
                            long value = key;
                            if (session.Upsert(ref key, ref value).IsPending)
                                session.CompletePending(wait: true);
                        }
                    }
                    ops += FineBatch;
                }
                return ops;
            }
            var context = session.UnsafeContext;
            context.BeginUnsafe();
            try
            {
                while (!stop.IsSet)
                {
                    for (int i = 0; i < CoarseBatch; i++)
                    {
                        long key = rng.Next(Keys);
                        if ((rng.NextUInt64() & 1) == 0)
                        {
                            long output = 0;
                            if (context.Read(ref key, ref output).IsPending)
                                context.CompletePending(wait: true);
                        }
                        else
                        {
                            long value = key;
                            if (context.Upsert(ref key, ref value).IsPending)
                                context.CompletePending(wait: true);
                        }
                    }
                    ops += CoarseBatch;
                    context.Refresh();
                }
            }
            finally
            {
                context.EndUnsafe();
            }
            return ops;
        }

        return new RunContext(Worker, () =>
        {
            counts.Enqueue(driver.Join());
            kv.Dispose();
            log.Dispose();
        });
    }
}
