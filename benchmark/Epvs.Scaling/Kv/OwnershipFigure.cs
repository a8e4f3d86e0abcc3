using System;
using System.Collections.Generic;
using System.Linq;
using System.Threading;
using Epvs.Samples.OwnershipMap;
using Epvs.Scaling.Arrays;
using Epvs.Scaling.Harness;
using FASTER.core;

namespace Epvs.Scaling.Kv;

/// <summary>
/// The paper's Fig. 15: a FASTER key-value store whose operations validate key-bucket ownership, YCSB-style 50:50
/// read/upsert over uniformly random keys, no ownership transfers. Configurations: no validation, validation under a
/// reader–writer latch, validation under EPVS (the same loop, written here), and the samples/OwnershipMap shard
/// session itself (EPVS validation plus the sample's ownership audit).
/// </summary>
public static class OwnershipFigure
{
    private const int Keys = 1 << 16;
    private const int Batch = 16;

    private enum Validation
    {
        None,
        Latch,
        Epvs,
    }

    /// <summary>Runs the figure.</summary>
    public static FigureResult Fig15(RunSettings settings)
    {
        var fig = new FigureResult("fig15", "Ownership validation on FASTER KV, YCSB 50:50 uniform (paper Fig. 15)", "threads",
            settings.Threads.Select(ArrayFigures.Str), xIsThreads: true);
        foreach ((string name, Validation v) in new[] { ("no validation", Validation.None), ("RW latch validation", Validation.Latch), ("EPVS validation", Validation.Epvs) })
        {
            foreach (int threads in settings.Threads)
            {
                int t = threads;
                fig.Schedule(name, ArrayFigures.Str(t), t, () => SetupStore(v));
            }
        }
        foreach (int threads in settings.Threads)
        {
            fig.Schedule("samples/OwnershipMap shard", ArrayFigures.Str(threads), threads, SetupSample);
        }
        fig.RunScheduled(settings);
        fig.Note($"One FasterKV<long, long> (2^16 buckets, 16 MiB in-memory log, null device), {Keys:N0} keys loaded first; each operation is a read or an upsert (50:50) of a uniformly random key, one FASTER session per thread. Validation checks the key's bucket against the shard's ownership set inside the protected region (or under the read latch), as the sample does.");
        fig.Note("'samples/OwnershipMap shard' is the sample's ShardSession on shard 0 of a 2-shard cluster, driven with 65,536 keys that shard 0 owns: EPVS validation plus an audit that reads the bucket directory before and after the operation.");
        double two(string s) => fig.Get(s, "2");
        fig.Check($"EPVS validation / no validation at 2 threads: {ArrayFigures.Pct(two("EPVS validation") / two("no validation"))}; EPVS / RW latch validation: {ArrayFigures.Ratio(two("EPVS validation") / two("RW latch validation"))}");
        return fig;
    }

    private static RunContext SetupStore(Validation validation)
    {
        var device = new NullDevice();
        var kv = new FasterKV<long, long>(1L << 16, new LogSettings { LogDevice = device, MemorySizeBits = 24, PageSizeBits = 16 });
        var functions = new SimpleFunctions<long, long>((current, delta) => current + delta);
        Load(kv, functions);
        var owned = new HashSet<ushort>(Enumerable.Range(0, KeyBuckets.Count).Select(b => (ushort)b));
        var latch = new ReaderWriterLockSlim(LockRecursionPolicy.NoRecursion);
        var epvs = new EpochProtectedVersionScheme();

        long Worker(int thread, StopFlag stop)
        {
            using var session = kv.For(functions).NewSession<SimpleFunctions<long, long>>();
            var rng = new FastRandom((ulong)thread + 1);
            long ops = 0, notOwned = 0;
            while (!stop.IsSet)
            {
                for (int i = 0; i < Batch; i++)
                {
                    long key = rng.Next(Keys);
                    bool read = (rng.NextUInt64() & 1) == 0;
                    ushort bucket = KeyBuckets.Of(key);
                    switch (validation)
                    {
                        case Validation.None:
                            Execute(session, key, read);
                            break;
                        case Validation.Latch:
                            latch.EnterReadLock();
                            try
                            {
                                if (owned.Contains(bucket)) Execute(session, key, read); else notOwned++;
                            }
                            finally
                            {
                                latch.ExitReadLock();
                            }
                            break;
                        default:
                            epvs.Enter();
                            try
                            {
                                if (owned.Contains(bucket)) Execute(session, key, read); else notOwned++;
                            }
                            finally
                            {
                                epvs.Leave();
                            }
                            break;
                    }
                }
                ops += Batch;
            }
            if (notOwned != 0)
                throw new InvalidOperationException("every bucket is owned in this experiment");
            return ops;
        }

        return new RunContext(Worker, () =>
        {
            epvs.Dispose();
            latch.Dispose();
            kv.Dispose();
            device.Dispose();
        });
    }

    private static void Execute(ClientSession<long, long, long, long, Empty, SimpleFunctions<long, long>> session, long key, bool read)
    {
        if (read)
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

    private static void Load(FasterKV<long, long> kv, SimpleFunctions<long, long> functions)
    {
        using var session = kv.For(functions).NewSession<SimpleFunctions<long, long>>();
        for (long k = 0; k < Keys; k++)
        {
            long v = k;
            session.Upsert(ref k, ref v);
        }
        session.CompletePending(wait: true);
    }

    private static RunContext SetupSample()
    {
        // The sample needs at least two shards; drive shard 0 with keys it owns (as many as the other configurations use).
        var cluster = new OwnershipCluster(2);
        var keys = new long[Keys];
        for (long k = 0, n = 0; n < Keys; k++)
        {
            if (cluster.Directory.OwnerOf(KeyBuckets.Of(k)) == 0)
                keys[n++] = k;
        }
        using (ShardSession loader = cluster.GetShard(0).OpenSession())
        {
            foreach (long k in keys)
                loader.Upsert(k, k);
        }

        long Worker(int thread, StopFlag stop)
        {
            using ShardSession session = cluster.GetShard(0).OpenSession();
            var rng = new FastRandom((ulong)thread + 1);
            long ops = 0;
            while (!stop.IsSet)
            {
                for (int i = 0; i < Batch; i++)
                {
                    long key = keys[rng.Next(Keys)];
                    OperationStatus status = (rng.NextUInt64() & 1) == 0 ? session.Read(key, out _) : session.Upsert(key, key);
                    if (status == OperationStatus.NotOwner)
                        throw new InvalidOperationException("shard 0 owns these keys");
                }
                ops += Batch;
            }
            return ops;
        }

        return new RunContext(Worker, cluster.Dispose);
    }
}
