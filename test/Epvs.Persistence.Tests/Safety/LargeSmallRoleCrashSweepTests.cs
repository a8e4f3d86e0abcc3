using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Linq;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// A review of the large-start check in recovery's pass 1 (a large start over a small segment or another large start is
/// refused when its block is complete or damaged; a torn one frees only the start and its continuations): crash sweeps
/// of workloads that move segments between large and small roles on heaps that cannot grow. Every image must open (no
/// Corrupt, which would make a crashed heap unopenable) and be consistent: large blocks allocated over small segments a
/// recovery found empty (their durable descriptors still small: the shape a torn allocation leaves), and a byte map of
/// mixed value sizes.
/// </summary>
public sealed class LargeSmallRoleCrashSweepTests
{
    private readonly ITestOutputHelper _output;

    public LargeSmallRoleCrashSweepTests(ITestOutputHelper output) => _output = output;

    private sealed class Alloc
    {
        public long Offset;
        public long Uid;
        public int Size;
        public long Persisted = long.MaxValue;
        public long FreeStart = long.MaxValue;
        public long FreeDurable = long.MaxValue;
    }

    private static readonly int[] SmallSizes = [4000, 100, 9000, 16_000, 3000, 700];
    private static readonly int[] LargeSizes = [300_000, 70_000, 140_000, 20_000, 200_000];

    /// <summary>Alternates fills of small blocks, frees, and large blocks on a 1 MiB heap that cannot grow.</summary>
    private static void RawWorkload(PersistentHeap heap, SimulatedPersistenceDomain domain, List<Alloc> log, int rounds, int seed, bool largeFirst = false)
    {
        var random = new Random(seed);
        var kept = new List<(Alloc A, PayloadRef B)>();
        (Alloc A, PayloadRef B)? large = null;

        void Free((Alloc A, PayloadRef B) x, bool durably)
        {
            x.A.FreeStart = domain.CrashPointCount;
            heap.Free(x.B);
            if (durably)
            {
                heap.WriteBackHeader(x.B);
                heap.Fence();
                x.A.FreeDurable = domain.CrashPointCount;
            }
        }

        (Alloc A, PayloadRef B)? Allocate(int size)
        {
            if (!heap.TryAllocate(size, 1, out PayloadRef b))
            {
                return null;
            }

            var a = new Alloc { Offset = b.Offset, Uid = heap.GetHeader(b).Uid, Size = size };
            log.Add(a);
            Stamp.Write(heap.GetPayload(b), a.Uid);
            heap.Persist(b);
            a.Persisted = domain.CrashPointCount;
            return (a, b);
        }

        if (largeFirst)
        {
            // Large blocks first, over whatever the heap holds free (segments a recovery found empty keep their durable
            // small descriptors until reused), some freed, then again.
            for (int pass = 0; pass < 2; pass++)
            {
                var larges = new List<(Alloc A, PayloadRef B)>();
                for (int i = 0; i < 12; i++)
                {
                    if (Allocate(LargeSizes[(i + pass + seed) % LargeSizes.Length]) is { } x)
                    {
                        larges.Add(x);
                    }
                }

                foreach (var x in larges)
                {
                    if (random.Next(3) != 0)
                    {
                        Free(x, random.Next(2) == 0);
                    }
                    else
                    {
                        kept.Add(x);
                    }
                }
            }
        }

        for (int round = 0; round < rounds; round++)
        {
            int small = SmallSizes[round % SmallSizes.Length];
            var fresh = new List<(Alloc A, PayloadRef B)>();
            for (int i = 0; i < 400; i++)
            {
                if (Allocate(small) is not { } x)
                {
                    break;
                }

                fresh.Add(x);
            }

            // Most of them freed (some durably), a few kept; older kept ones freed now and then.
            foreach (var x in fresh)
            {
                if (random.Next(10) == 0)
                {
                    kept.Add(x);
                }
                else
                {
                    Free(x, random.Next(2) == 0);
                }
            }

            for (int i = kept.Count - 1; i >= 0; i--)
            {
                if (random.Next(2) == 0)
                {
                    Free(kept[i], random.Next(2) == 0);
                    kept.RemoveAt(i);
                }
            }

            // A large block (its segments: released small ones), the previous large one freed after it or before it.
            if (large is { } previous && random.Next(2) == 0)
            {
                Free(previous, random.Next(2) == 0);
                large = null;
            }

            var next = Allocate(LargeSizes[round % LargeSizes.Length]);
            if (large is { } old)
            {
                Free(old, random.Next(2) == 0);
            }

            large = next;

            // A second one, as large as what is left.
            if (Allocate(LargeSizes[(round + 2) % LargeSizes.Length]) is { } second)
            {
                Free(second, random.Next(3) == 0);
            }
        }
    }

    /// <summary>Whether a large start in the image covers a small segment or another large start (the shape the new check handles).</summary>
    private static bool HasForeignSpan(byte[] image)
    {
        // The geometry read from the image's superblock, as HeapFile.SegmentCount computes it (opening a heap file on a
        // copy of each image, only for this, took a quarter of the test's time).
        long size = (long)(BitConverter.ToUInt64(image, HeapLayout.HeapSizeOffset) & HeapLayout.SealedValueMask);
        long dataStart = (long)BitConverter.ToUInt64(image, HeapLayout.DataStartOffset);
        long segments = (Math.Min(size, image.Length) - dataStart) / HeapLayout.SegmentSize;
        ulong Word(long s) => BitConverter.ToUInt64(image, HeapLayout.SuperblockSize + (int)(s * 8));
        for (long s = 0; s < segments; s++)
        {
            if (HeapLayout.DescriptorRole(Word(s)) == HeapLayout.RoleLargeStart)
            {
                long payload = HeapLayout.DescriptorPayload(Word(s));
                for (long t = s + 1; t < s + payload && t < segments; t++)
                {
                    ulong role = HeapLayout.DescriptorRole(Word(t));
                    if (role is HeapLayout.RoleSmall or HeapLayout.RoleLargeStart)
                    {
                        return true;
                    }
                }
            }
        }

        return false;
    }

    /// <summary>Opens the image as a raw heap and checks it against the log at crash point <paramref name="point"/>.</summary>
    private static void CheckRaw(byte[] image, List<Alloc> log, long point, string where, List<string> violations, bool useAfter, HeapFaults faults)
    {
        var byOffset = new Dictionary<(long, long), Alloc>();
        foreach (Alloc a in log)
        {
            byOffset[(a.Offset, a.Uid)] = a;
        }

        using var domain = SimulatedPersistenceDomain.FromImage(image);
        try
        {
            using HeapFile file = HeapFile.Open(domain);
            using var heap = new PersistentHeap(file, new PersistentHeapOptions { Faults = faults });
            if (!heap.RecoveryStatistics.AddsUp)
            {
                violations.Add($"{where}: statistics do not add up: {heap.RecoveryStatistics}");
            }

            var live = new List<(long Offset, PayloadHeader Header)>();
            heap.ForEachAllocated((b, h) =>
            {
                lock (live)
                {
                    live.Add((b.Offset, h));
                }
            });
            live.Sort((x, y) => x.Offset.CompareTo(y.Offset));
            for (int i = 0; i < live.Count; i++)
            {
                (long offset, PayloadHeader h) = live[i];
                if (!byOffset.TryGetValue((offset, h.Uid), out Alloc? a) || a.Size != h.Size)
                {
                    violations.Add($"{where}: a live block at 0x{offset:X} (uid {h.Uid}, {h.Size} bytes) that was never allocated there");
                    continue;
                }

                if (a.FreeDurable <= point)
                {
                    violations.Add($"{where}: block uid {a.Uid} at 0x{offset:X} is live though its free was durable");
                }

                if (i + 1 < live.Count && offset + HeapLayout.HeaderSize + h.Size > live[i + 1].Offset)
                {
                    violations.Add($"{where}: live blocks at 0x{offset:X} and 0x{live[i + 1].Offset:X} overlap");
                }
            }

            var liveSet = live.Select(l => (l.Offset, l.Header.Uid)).ToHashSet();
            foreach (Alloc a in log)
            {
                if (a.Persisted <= point && point < a.FreeStart)
                {
                    if (!liveSet.Contains((a.Offset, a.Uid)))
                    {
                        violations.Add($"{where}: persisted block uid {a.Uid} ({a.Size} bytes at 0x{a.Offset:X}) is lost");
                    }
                    else if (!Stamp.Matches(heap.GetPayload(new PayloadRef(a.Offset)), a.Uid))
                    {
                        violations.Add($"{where}: persisted block uid {a.Uid} at 0x{a.Offset:X} has the wrong bytes");
                    }
                }
            }

            if (useAfter)
            {
                // The recovered heap is usable for both roles, and what recovery wrote reopens.
                var taken = new List<PayloadRef>();
                foreach (int size in new[] { 140_000, 100, 20_000, 9000 })
                {
                    while (taken.Count < 200 && heap.TryAllocate(size, 2, out PayloadRef b))
                    {
                        Stamp.Write(heap.GetPayload(b), heap.GetHeader(b).Uid);
                        heap.Persist(b);
                        taken.Add(b);
                    }
                }
            }
            else
            {
                // Nothing reopens this copy: a clean shutdown would persist the whole heap into it for nothing (it took
                // a third of the check's time).
                file.ForgoCleanShutdown();
            }
        }
        catch (Exception e)
        {
            violations.Add($"{where}: open failed: {e.GetType().Name}: {e.Message}");
            return;
        }

        if (useAfter)
        {
            using var again = SimulatedPersistenceDomain.FromImage(domain.GetDurableImage());
            try
            {
                using HeapFile file = HeapFile.Open(again);
                using var heap = new PersistentHeap(file);
                if (!heap.RecoveryStatistics.AddsUp)
                {
                    violations.Add($"{where}, reopened after use: statistics do not add up");
                }
            }
            catch (Exception e)
            {
                violations.Add($"{where}, reopened after use: {e.GetType().Name}: {e.Message}");
            }
        }
    }

    /// <summary>
    /// Two crashes: a first one leaves small segments recovery finds empty (free in memory, their durable descriptors
    /// still small); large blocks are then allocated over them and freed, with a crash at every point of that.
    /// </summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void RawHeap_LargeBlocksOverSegmentsARecoveryFoundEmpty_EveryCrashPointOpensConsistent(bool control)
    {
        // The control: recovery that accepts torn headers (HeapFaults.AcceptTornHeaders) must be caught by the same checks.
        HeapFaults faults = control ? HeapFaults.AcceptTornHeaders : HeapFaults.None;
        // A heap filled with small blocks persisted, then all freed without writing the frees back, then a crash that
        // keeps the frees (seed whose eviction keeps everything): recovery finds the small segments empty.
        var sw = Stopwatch.StartNew();
        byte[] crashed;
        using (var domain = new SimulatedPersistenceDomain((1 << 20) + HeapLayout.MinSweepLogBytes))
        {
            using HeapFile file = HeapFile.Create(domain);
            using var heap = new PersistentHeap(file);
            var blocks = new List<PayloadRef>();
            int k = 0;
            while (heap.TryAllocate(SmallSizes[k++ % 3], 1, out PayloadRef b))
            {
                heap.Persist(b);
                blocks.Add(b);
            }

            foreach (PayloadRef b in blocks)
            {
                heap.Free(b);
                heap.WriteBackHeader(b);
            }

            heap.Fence();
            crashed = domain.Crash(seed: 1);
        }

        int images = 0, foreign = 0, workloadSeeds = 0;
        var violations = new List<string>();
        for (int workloadSeed = 0; workloadSeed < 2; workloadSeed++)
        {
            workloadSeeds++;
            var log = new List<Alloc>();
            long first, last;
            using (var counting = SimulatedPersistenceDomain.FromImage(crashed))
            {
                using HeapFile file = HeapFile.Open(counting);
                using var heap = new PersistentHeap(file);
                Assert.True(heap.RecoveryStatistics.LiveBlocks == 0, heap.RecoveryStatistics.ToString());
                first = counting.CrashPointCount;
                RawWorkload(heap, counting, log, rounds: 1, seed: workloadSeed, largeFirst: true);
                last = counting.CrashPointCount;
            }

            log.Clear();
            var domain = SimulatedPersistenceDomain.FromImage(crashed);
            using (HeapFile file = HeapFile.Open(domain))
            using (var heap = new PersistentHeap(file))
            {
                for (long p = first; p < last; p++)
                {
                    for (int k = 0; k < 6; k++)
                    {
                        domain.ArmCrash(p, seed: (int)p + (k * 5_000_000));
                    }
                }

                RawWorkload(heap, domain, log, rounds: 1, seed: workloadSeed, largeFirst: true);
            }

            foreach (SimulatedCrash crash in domain.CapturedCrashes)
            {
                images++;
                bool hasForeign = HasForeignSpan(crash.Image);
                foreign += hasForeign ? 1 : 0;
                CheckRaw(crash.Image, log, crash.Point, $"workload {workloadSeed} point {crash.Point} seed {crash.Seed}", violations, useAfter: hasForeign, faults);
            }

            domain.Dispose();
        }

        _output.WriteLine($"{workloadSeeds} workloads, {images} images ({foreign} with a large start over a small or large start), {sw.Elapsed.TotalSeconds:F1} s");
        foreach (string v in violations.Take(20))
        {
            _output.WriteLine(v);
        }

        Assert.True(foreign > 0, "no image had a large start over a small segment: the sweep misses the shape");
        if (control)
        {
            Assert.NotEmpty(violations);
            return;
        }

        Assert.Empty(violations);
    }

    private static byte[] ValueOf(long key, long seq, int size)
    {
        byte[] v = new byte[size];
        for (int i = 0; i < size; i++)
        {
            v[i] = (byte)((key * 31) + (seq * 7) + i);
        }

        return v;
    }

    private static readonly int[] ValueSizes = [10, 300, 3000, 9000, 16_000, 20_000, 70_000, 140_000];

    /// <summary>A byte map of mixed value sizes on a 2 MiB buffered heap that cannot grow; returns the model per version.</summary>
    private static void BufferedWorkload(BufferedDurableHeap heap, SimulatedPersistenceDomain domain, int steps, int seed, SortedDictionary<long, Dictionary<long, byte[]>> byVersion, List<(long Point, long Version)> syncs)
    {
        var map = new PersistentByteMap<long>(heap, 1);
        var random = new Random(seed);
        var model = new Dictionary<long, byte[]>();
        for (int step = 0; step < steps; step++)
        {
            long key = random.Next(24);
            int size = key < 3 ? ValueSizes[random.Next(ValueSizes.Length)] : ValueSizes[random.Next(5)];
            if (random.Next(10) < 7)
            {
                byte[] value = ValueOf(key, step, size);
                map.Set(key, value);
                model[key] = value;
            }
            else if (map.Remove(key))
            {
                model.Remove(key);
            }

            long version = heap.CurrentVersion;
            byVersion[version] = new Dictionary<long, byte[]>(model);
            int r = random.Next(8);
            if (r == 0)
            {
                heap.Sync(TimeSpan.FromSeconds(30));
                syncs.Add((domain.CrashPointCount, version));
            }
            else if (r < 3)
            {
                heap.AdvanceVersion(TimeSpan.FromSeconds(30));
            }
        }
    }

    [Fact]
    public void BufferedByteMap_MixedValueSizes_EveryCrashPointOpensToAConsistentPrefix()
    {
        const int steps = 140, seed = 5;
        var manual = new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan };
        var sw = Stopwatch.StartNew();
        long first, last;
        var byVersion = new SortedDictionary<long, Dictionary<long, byte[]>>();
        var syncs = new List<(long Point, long Version)>();
        using (var counting = new SimulatedPersistenceDomain(2 << 20))
        {
            using HeapFile file = HeapFile.Create(counting);
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, manual);
            first = counting.CrashPointCount;
            BufferedWorkload(heap, counting, steps, seed, byVersion, syncs);
            heap.Dispose();
            last = counting.CrashPointCount;
        }

        byVersion.Clear();
        syncs.Clear();
        var domain = new SimulatedPersistenceDomain(2 << 20);
        using (HeapFile file = HeapFile.Create(domain))
        {
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, manual);
            Assert.Equal(first, domain.CrashPointCount);
            for (long p = first; p < last; p++)
            {
                domain.ArmCrash(p, seed: (int)p);
                domain.ArmCrash(p, seed: (int)p + 1_000_000);
            }

            BufferedWorkload(heap, domain, steps, seed, byVersion, syncs);
        }

        var violations = new List<string>();
        int images = 0, foreign = 0, fastReopens = 0;
        var images2 = domain.CapturedCrashes.ToList();

        // The clean shutdown's image too (a fast reopen from the saved state).
        images2.Add(new SimulatedCrash(last, -1, domain.GetDurableImage()));
        foreach (SimulatedCrash crash in images2)
        {
            images++;
            foreign += HasForeignSpan(crash.Image) ? 1 : 0;
            string where = $"point {crash.Point} seed {crash.Seed}";
            using var d = SimulatedPersistenceDomain.FromImage(crash.Image);
            try
            {
                using HeapFile file = HeapFile.Open(d);
                using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, manual);
                fastReopens += heap.Recovery.FastReopen ? 1 : 0;
                var map = new PersistentByteMap<long>(heap, 1);
                Dictionary<long, byte[]> recovered = map.ToList().ToDictionary(p => p.Key, p => p.Value);
                long version = heap.Recovery.RecoveredVersion;
                long promised = syncs.Where(s => s.Point <= crash.Point).Select(s => s.Version).DefaultIfEmpty(0).Max();
                Dictionary<long, byte[]> expected = byVersion.Where(v => v.Key <= version).Select(v => v.Value).LastOrDefault() ?? new Dictionary<long, byte[]>();
                if (version < promised && byVersion.Keys.Any(v => v > version && v <= promised))
                {
                    violations.Add($"{where}: recovered version {version} below the synced {promised}");
                }

                if (recovered.Count != expected.Count || recovered.Any(p => !expected.TryGetValue(p.Key, out byte[]? e) || !e.AsSpan().SequenceEqual(p.Value)))
                {
                    violations.Add($"{where}: the map ({recovered.Count} keys) is not its state at version {version} ({expected.Count} keys)");
                }

                if (!heap.Heap.GetStatistics().AddsUp)
                {
                    violations.Add($"{where}: statistics do not add up");
                }

                // Usable: a large value and small ones after recovery.
                map.Set(1000, new byte[140_000]);
                map.Set(1001, new byte[100]);
                heap.Sync(TimeSpan.FromSeconds(30));
            }
            catch (Exception e)
            {
                violations.Add($"{where}: open failed: {e.GetType().Name}: {e.Message}");
            }
        }

        domain.Dispose();
        _output.WriteLine($"{last - first} crash points, {images} images ({foreign} with a large start over a small or large start, {fastReopens} fast reopens), {byVersion.Count} versions, {syncs.Count} syncs, {sw.Elapsed.TotalSeconds:F1} s");
        foreach (string v in violations.Take(20))
        {
            _output.WriteLine(v);
        }

        Assert.Empty(violations);
        Assert.True(images >= 2 * (last - first));
    }
}
