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
    private const int Threads = 2, Operations = 1500, Crashes = 25, MinimumImages = 15;
    private const long Capacity = 2 << 20;
    private readonly ITestOutputHelper _output;

    public PersistentQueueCrashTests(ITestOutputHelper output) => _output = output;

    [Fact]
    public void Crash_AtRandomPointsOfAConcurrentQueueLoad_RecoversAContiguousFifoPrefix()
    {
        List<string> violations = Run(9401, DurabilityFaults.None, out int images);
        _output.WriteLine($"seed=9401: {images} images checked");
        Assert.True(images >= MinimumImages, $"only {images} images");
        Assert.Empty(violations);
    }

    [Fact]
    public void Crash_QueueRecoveryKeepingTagsBeyondTheFrontier_IsCaught()
    {
        // Whether the control is caught depends on where the armed points fell in the timed advancer's cycles: up to four
        // seeds, stopping at the first catch; a run that catches it in none is inconclusive, not a pass.
        List<string> violations = new();
        int runs = 0;
        for (int seed = 9401; seed < 9405 && violations.Count == 0; seed++)
        {
            runs++;
            violations = Run(seed, DurabilityFaults.KeepTagsBeyondFrontier, out _);
        }

        _output.WriteLine($"control: {violations.Count} violations in {runs} runs, e.g. {violations.FirstOrDefault()}");
        Assert.SkipWhen(violations.Count == 0, $"INCONCLUSIVE: the broken control was not caught in {runs} runs; the queue check proves nothing on this run.");
    }

    private static List<string> Run(int seed, DurabilityFaults recoveryFaults, out int images)
    {
        // Crash points are drawn below the count a first, unarmed run reached. Background advances are timed, so an armed run can end short of
        // some of its points; a run that captured too few images is followed by another with points of its own (at most three more).
        long estimate = Load(seed, null, out _, out _);
        var violations = new List<string>();
        images = 0;
        for (int attempt = 0; attempt < 4 && images < MinimumImages; attempt++)
        {
            var arming = new Random(seed + attempt);
            Load(seed, domain => domain.ArmBelowEstimate(arming, Crashes, estimate), out List<(long Version, long Value, bool Enqueue)>[] logs, out List<SimulatedCrash> captured);
            violations.AddRange(Check(captured, logs, recoveryFaults));
            images += captured.Count;
        }

        return violations;
    }

    /// <summary>Runs the concurrent load on a fresh simulated domain (arming it first when <paramref name="arm"/> is given) and returns its crash-point count.</summary>
    private static long Load(int seed, Action<SimulatedPersistenceDomain>? arm, out List<(long Version, long Value, bool Enqueue)>[] logs, out List<SimulatedCrash> captured)
    {
        var perThread = new List<(long Version, long Value, bool Enqueue)>[Threads];
        using var domain = new SimulatedPersistenceDomain(Capacity);
        using (HeapFile file = HeapFile.Create(domain))
        using (BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromMilliseconds(2) }))
        {
            var queue = new PersistentQueue<long>(heap, QueueTypeId);
            arm?.Invoke(domain);
            Workers.Run(Threads, t =>
            {
                var log = perThread[t] = new List<(long, long, bool)>();
                var r = new Random(seed + t);
                long next = 0;
                for (int i = 0; i < Operations; i++)
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

        logs = perThread;
        captured = domain.CapturedCrashes.ToList();
        return domain.CrashPointCount;
    }

    /// <summary>Recovers every captured image and lists how each differs from the contiguous FIFO prefix of the operations of versions ≤ its cut.</summary>
    private static List<string> Check(List<SimulatedCrash> captured, List<(long Version, long Value, bool Enqueue)>[] logs, DurabilityFaults recoveryFaults)
    {
        var violations = new List<string>();
        foreach (SimulatedCrash crash in captured)
        {
            using var domain = SimulatedPersistenceDomain.FromImage(crash.Image, Capacity);
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

            for (int t = 0; t < Threads; t++)
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

        return violations;
    }
}
