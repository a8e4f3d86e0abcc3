using System;
using System.Collections.Generic;
using System.Linq;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>Simulated power failures during a concurrent queue load: recovery yields a contiguous FIFO prefix — exactly the enqueues and dequeues of versions ≤ the cut, in order.</summary>
public sealed class PersistentQueueCrashTests
{
    private const int QueueTypeId = 21;
    private readonly ITestOutputHelper _output;

    public PersistentQueueCrashTests(ITestOutputHelper output) => _output = output;

    [Fact]
    public void Crash_AtRandomPointsOfAConcurrentQueueLoad_RecoversAContiguousFifoPrefix()
    {
        List<string> violations = Run(9401, DurabilityFaults.None, out int images);
        _output.WriteLine($"seed=9401: {images} images checked");
        Assert.True(images >= 15, $"only {images} images");
        Assert.Empty(violations);
    }

    [Fact]
    public void Crash_QueueRecoveryKeepingTagsBeyondTheFrontier_IsCaught()
    {
        List<string> violations = Run(9401, DurabilityFaults.KeepTagsBeyondFrontier, out _);
        _output.WriteLine($"control: {violations.Count} violations, e.g. {violations.FirstOrDefault()}");
        Assert.True(violations.Count > 0, "INCONCLUSIVE: the broken control was not caught; the queue check proves nothing on this run.");
    }

    private static List<string> Run(int seed, DurabilityFaults recoveryFaults, out int images)
    {
        const int threads = 2, operations = 1500, crashes = 25;
        const long capacity = 2 << 20;
        var logs = new List<(long Version, long Value, bool Enqueue)>[threads];
        long estimate = 0;
        List<SimulatedCrash> captured = new();
        for (int pass = 0; pass < 2; pass++)
        {
            var random = new Random(seed);
            using var domain = new SimulatedPersistenceDomain(capacity);
            using (HeapFile file = HeapFile.Create(domain))
            using (BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromMilliseconds(2) }))
            {
                var queue = new PersistentQueue<long>(heap, QueueTypeId);
                if (pass == 1)
                {
                    for (int i = 0; i < crashes; i++)
                    {
                        domain.ArmCrash(random.NextInt64(domain.CrashPointCount, estimate), random.Next());
                    }
                }

                Workers.Run(threads, t =>
                {
                    var log = logs[t] = new List<(long, long, bool)>();
                    var r = new Random(seed + t);
                    long next = 0;
                    for (int i = 0; i < operations; i++)
                    {
                        using DurableOperation op = heap.BeginOperation();
                        if (r.Next(5) < 3)
                        {
                            long value = ((long)t << 32) | next++;
                            queue.Enqueue(value);
                            log.Add((op.Version, value, true));
                        }
                        else if (queue.TryDequeue(out long value))
                        {
                            log.Add((op.Version, value, false));
                        }
                    }
                });
            }

            estimate = domain.CrashPointCount;
            captured = domain.CapturedCrashes.ToList();
        }

        var violations = new List<string>();
        foreach (SimulatedCrash crash in captured)
        {
            using var domain = SimulatedPersistenceDomain.FromImage(crash.Image, capacity);
            using HeapFile file = HeapFile.Open(domain);
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, Faults = recoveryFaults });
            long cut = heap.Recovery.RecoveredVersion;
            PersistentQueue<long> queue;
            try
            {
                queue = new PersistentQueue<long>(heap, QueueTypeId);
            }
            catch (System.IO.InvalidDataException e)
            {
                violations.Add($"point {crash.Point}: {e.Message}");
                continue;
            }

            long[] items = queue.ToArray();
            var expected = new HashSet<long>(logs.SelectMany(l => l).Where(o => o.Version <= cut && o.Enqueue).Select(o => o.Value));
            expected.ExceptWith(logs.SelectMany(l => l).Where(o => o.Version <= cut && !o.Enqueue).Select(o => o.Value));
            if (!expected.SetEquals(items))
            {
                violations.Add($"point {crash.Point} cut {cut}: recovered {items.Length} elements, expected {expected.Count} (missing {expected.Except(items).Count()}, extra {items.Except(expected).Count()})");
            }

            for (int t = 0; t < threads; t++)
            {
                long[] mine = items.Where(v => v >> 32 == t).ToArray();
                if (!mine.SequenceEqual(mine.OrderBy(v => v)))
                {
                    violations.Add($"point {crash.Point}: producer {t}'s elements are out of FIFO order");
                }
            }

            long[] sequences = queue.Sequences();
            for (int i = 1; i < sequences.Length; i++)
            {
                if (sequences[i] != sequences[i - 1] + 1)
                {
                    violations.Add($"point {crash.Point}: sequence numbers are not contiguous");
                    break;
                }
            }
        }

        images = captured.Count;
        return violations;
    }
}
