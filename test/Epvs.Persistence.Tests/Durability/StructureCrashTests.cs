using System;
using System.Collections.Generic;
using System.Linq;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// Simulated power failures during one writer's mix of every structure's edge cases on one heap: hash-map
/// <c>SetMany</c> batches with repeated keys (several operations each, so a version may end inside a batch), removes
/// followed by reinserts of the same key (in the same version or a later one), byte-map values whose size moves across
/// size classes and into large blocks, byte-map removes and reinserts, queue enqueues and dequeues. The property: the
/// three recovered structures together are exactly the writer's operations up to one point N of its sequence — a
/// single consistent prefix, cut inside a batch only where a prefix of its items is durable without the rest — and N
/// covers everything a Sync returned for before the crash.
/// </summary>
public sealed class StructureCrashTests
{
    private const int MapType = 31;
    private const int BytesType = 32;
    private const int QueueType = 33;
    private const long Capacity = 8 << 20;
    private const int MinimumImages = 20;
    private readonly ITestOutputHelper _output;

    public StructureCrashTests(ITestOutputHelper output) => _output = output;

    [Theory]
    [InlineData(9701)]
    [InlineData(9702)]
    public void Crash_AtRandomPointsOfEveryStructuresEdgeCases_RecoversOneConsistentPrefixOfTheOperations(int seed)
    {
        List<string> violations = Run(seed, DurabilityFaults.None, out int images, out string cuts);
        _output.WriteLine($"seed={seed}: {images} images; recovered prefixes {cuts}");
        Assert.True(images >= MinimumImages, $"only {images} images");
        Assert.Empty(violations);
    }

    [Fact]
    public void Crash_RecoveryKeepingTagsBeyondTheFrontier_IsCaughtAsNoConsistentPrefix()
    {
        // Whether the control is caught depends on where the armed points fell in the timed advancer's cycles: up to four
        // seeds, stopping at the first catch; a run that catches it in none is inconclusive, not a pass.
        List<string> violations = new();
        int runs = 0;
        for (int seed = 9701; seed < 9705 && violations.Count == 0; seed++)
        {
            runs++;
            violations = Run(seed, DurabilityFaults.KeepTagsBeyondFrontier, out _, out _);
        }

        _output.WriteLine($"control: {violations.Count} violations in {runs} runs, e.g. {violations.FirstOrDefault()}");
        Assert.SkipWhen(violations.Count == 0, $"INCONCLUSIVE: the broken control was not caught in {runs} runs; the check proves nothing on this run.");
    }

    /// <summary>One writer operation, in the order the writer completed them.</summary>
    private readonly record struct Op(int Structure, long Key, long Value, byte[]? Bytes, bool Remove);

    private static List<string> Run(int seed, DurabilityFaults recoveryFaults, out int images, out string cuts)
    {
        const int steps = 700, crashes = 40;
        long estimate = 0;
        var ops = new List<Op>();
        var promises = new List<(long Point, int Ops)>();
        var violations = new List<string>();
        var prefixes = new SortedSet<int>();
        int captured = 0;

        // Pass 0 counts the crash points; each later one arms points below that count and checks its images. The
        // advancer is timed, so an armed pass can end short of some of its points: one that left fewer than
        // MinimumImages in all is followed by another with points of its own (at most three more).
        for (int pass = 0; pass < 5 && (pass < 2 || captured < MinimumImages); pass++)
        {
            ops.Clear();
            promises.Clear();
            var random = new Random(seed);
            using var domain = new SimulatedPersistenceDomain(Capacity);
            using (HeapFile file = HeapFile.Create(domain))
            using (BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromMilliseconds(2) }))
            {
                var map = new PersistentHashMap<long, long>(heap, MapType);
                var bytes = new PersistentByteMap<long>(heap, BytesType);
                var queue = new PersistentQueue<long>(heap, QueueType);
                if (pass > 0)
                {
                    domain.ArmBelowEstimate(new Random(seed + pass), crashes, estimate);
                }

                long nextElement = 0;
                for (int step = 0; step < steps; step++)
                {
                    int what = random.Next(100);
                    if (what < 35)
                    {
                        var items = new KeyValuePair<long, long>[40 + random.Next(160)];
                        for (int i = 0; i < items.Length; i++)
                        {
                            items[i] = new KeyValuePair<long, long>(random.Next(120), random.NextInt64());
                        }

                        map.SetMany(items);
                        ops.AddRange(items.Select(item => new Op(MapType, item.Key, item.Value, null, false)));
                    }
                    else if (what < 50)
                    {
                        long key = random.Next(120);
                        if (map.Remove(key))
                        {
                            ops.Add(new Op(MapType, key, 0, null, true));
                        }

                        if (random.Next(2) == 0)
                        {
                            if (random.Next(2) == 0)
                            {
                                heap.AdvanceVersion(TimeSpan.FromSeconds(30));
                            }

                            long value = random.NextInt64();
                            map.Set(key, value);
                            ops.Add(new Op(MapType, key, value, null, false));
                        }
                    }
                    else if (what < 70)
                    {
                        long key = random.Next(40);
                        int[] sizes = { 0, 9, 100, 700, 3000, 20_000 };
                        byte[] value = new byte[sizes[random.Next(sizes.Length)] + random.Next(8)];
                        random.NextBytes(value);
                        bytes.Set(key, value);
                        ops.Add(new Op(BytesType, key, 0, value, false));
                    }
                    else if (what < 80)
                    {
                        long key = random.Next(40);
                        if (bytes.Remove(key))
                        {
                            ops.Add(new Op(BytesType, key, 0, null, true));
                        }
                    }
                    else if (what < 92)
                    {
                        queue.Enqueue(nextElement);
                        ops.Add(new Op(QueueType, nextElement++, 0, null, false));
                    }
                    else if (queue.TryDequeue(out long element))
                    {
                        ops.Add(new Op(QueueType, element, 0, null, true));
                    }

                    if (step % 90 == 89)
                    {
                        heap.Sync(TimeSpan.FromSeconds(30));
                        promises.Add((domain.CrashPointCount, ops.Count));
                    }
                }
            }

            if (pass == 0)
            {
                estimate = domain.CrashPointCount;
            }
            else
            {
                captured += domain.CapturedCrashes.Count;
                CheckImages(domain.CapturedCrashes, ops, promises, recoveryFaults, violations, prefixes);
            }
        }

        images = captured;
        cuts = string.Join(",", prefixes);
        return violations;
    }

    /// <summary>Recovers each crash image and adds to <paramref name="violations"/> every one that is no consistent prefix of <paramref name="ops"/> at or after what a Sync promised.</summary>
    private static void CheckImages(IReadOnlyList<SimulatedCrash> captured, List<Op> ops, List<(long Point, int Ops)> promises, DurabilityFaults recoveryFaults, List<string> violations, SortedSet<int> prefixes)
    {
        foreach (SimulatedCrash crash in captured)
        {
            using var domain = SimulatedPersistenceDomain.FromImage(crash.Image, Capacity);
            using HeapFile file = HeapFile.Open(domain);
            BufferedDurableHeap heap;
            try
            {
                heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, Faults = recoveryFaults, RecoveryParallelism = 2 });
            }
            catch (HeapFileException e)
            {
                violations.Add($"point {crash.Point} seed {crash.Seed}: recovery refused a crash image: {e.Message}");
                continue;
            }

            using (heap)
            {
                Dictionary<long, long> map;
                Dictionary<long, byte[]> bytes;
                long[] queue;
                try
                {
                    map = new PersistentHashMap<long, long>(heap, MapType).ToDictionary();
                    bytes = new PersistentByteMap<long>(heap, BytesType).ToList().ToDictionary(e => e.Key, e => e.Value);
                    queue = new PersistentQueue<long>(heap, QueueType).ToArray();
                }
                catch (System.IO.InvalidDataException e)
                {
                    violations.Add($"point {crash.Point} seed {crash.Seed}: inconsistent heap: {e.Message}");
                    continue;
                }

                int promised = promises.Where(p => p.Point <= crash.Point).Select(p => p.Ops).DefaultIfEmpty(0).Max();
                int n = ConsistentPrefix(ops, map, bytes, queue, promised);
                if (n < 0)
                {
                    violations.Add($"point {crash.Point} seed {crash.Seed} cut {heap.Recovery.RecoveredVersion}: the recovered map ({map.Count}), byte map ({bytes.Count}) and queue ({queue.Length}) are no prefix of the {ops.Count} operations at or after the {promised} promised durable");
                }
                else
                {
                    prefixes.Add(n);
                }
            }
        }
    }

    /// <summary>
    /// The length N ≥ <paramref name="promised"/> of the prefix of <paramref name="ops"/> whose result is exactly the
    /// recovered structures, or -1. One pass: the differences between the running result and the recovered one are
    /// counted and updated per operation.
    /// </summary>
    private static int ConsistentPrefix(List<Op> ops, Dictionary<long, long> map, Dictionary<long, byte[]> bytes, long[] queue, int promised)
    {
        // The queue must be a window [first, first + length) of the enqueued elements (numbered 0, 1, ...), in order.
        long first = queue.Length == 0 ? -1 : queue[0];
        for (int i = 1; i < queue.Length; i++)
        {
            if (queue[i] != first + i)
            {
                return -1;
            }
        }

        var runningMap = new Dictionary<long, long>();
        var runningBytes = new Dictionary<long, byte[]>();
        long head = 0, tail = 0;

        // Keys that differ: initially every recovered key (the running result is empty).
        int mapDiff = map.Count, bytesDiff = bytes.Count;
        for (int n = 0; ; n++)
        {
            bool queueSame = queue.Length == 0 ? head == tail : head == first && tail == first + queue.Length;
            if (n >= promised && mapDiff == 0 && bytesDiff == 0 && queueSame)
            {
                return n;
            }

            if (n == ops.Count)
            {
                return -1;
            }

            Op op = ops[n];
            switch (op.Structure)
            {
                case MapType:
                    {
                        bool before = Same(runningMap, map, op.Key);
                        if (op.Remove)
                        {
                            runningMap.Remove(op.Key);
                        }
                        else
                        {
                            runningMap[op.Key] = op.Value;
                        }

                        mapDiff += (before ? 1 : 0) - (Same(runningMap, map, op.Key) ? 1 : 0);
                        break;
                    }

                case BytesType:
                    {
                        bool before = SameBytes(runningBytes, bytes, op.Key);
                        if (op.Remove)
                        {
                            runningBytes.Remove(op.Key);
                        }
                        else
                        {
                            runningBytes[op.Key] = op.Bytes!;
                        }

                        bytesDiff += (before ? 1 : 0) - (SameBytes(runningBytes, bytes, op.Key) ? 1 : 0);
                        break;
                    }

                default:
                    if (op.Remove)
                    {
                        head++;
                    }
                    else
                    {
                        tail++;
                    }

                    break;
            }
        }
    }

    private static bool Same(Dictionary<long, long> running, Dictionary<long, long> recovered, long key) =>
        running.TryGetValue(key, out long a) ? recovered.TryGetValue(key, out long b) && a == b : !recovered.ContainsKey(key);

    private static bool SameBytes(Dictionary<long, byte[]> running, Dictionary<long, byte[]> recovered, long key) =>
        running.TryGetValue(key, out byte[]? a) ? recovered.TryGetValue(key, out byte[]? b) && a.AsSpan().SequenceEqual(b) : !recovered.ContainsKey(key);
}
