using System;
using System.Collections.Generic;
using System.Linq;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// A clean Dispose that finds no room for the saved state frees, durably, the segments whose blocks are all unused (the
/// delete reserve's among them) before it writes the state: a power failure at every point of it recovers the synced map,
/// with no damage and statistics that add up, and a delete still works (written by a review of that path, session 17).
/// Also: the segments whose free blocks sit in a live thread's cache are released too (they were not: a full heap whose
/// deletes ran on a worker thread saved no state at any clean shutdown).
/// </summary>
public sealed class DisposeReleaseCrashTests
{
    private const int MapTypeId = 8;
    private static readonly BufferedDurableHeapOptions NoAdvancer = new() { AdvancePeriod = Timeout.InfiniteTimeSpan };
    private readonly ITestOutputHelper _output;

    public DisposeReleaseCrashTests(ITestOutputHelper output) => _output = output;

    private static long Fill(PersistentHashMap<long, long> map, Dictionary<long, long> expected, long key) => FullHeapTests.Fill(map, expected, key);

    /// <summary>Arms six seeded crashes at every crash point from now on (for the Dispose that follows); returns the first.</summary>
    private static long ArmEveryCrashPointFromNow(SimulatedPersistenceDomain domain)
    {
        long first = domain.CrashPointCount;
        for (long p = first; p < first + 20000; p++)
        {
            for (int seed = 0; seed < 6; seed++)
            {
                domain.ArmCrash(p, (int)p * 10 + seed);
            }
        }

        return first;
    }

    [Theory]
    [InlineData(200)]
    [InlineData(1)]
    public void FullHeapWithReserve_CrashAtEveryPointOfDispose(int deletes)
    {
        const long Capacity = 1L << 20;
        var expected = new Dictionary<long, long>();
        using var domain = new SimulatedPersistenceDomain(Capacity, Capacity);
        BufferedDurableHeap closed;
        long first, last;
        using (HeapFile file = HeapFile.Create(domain))
        {
            using (BufferedDurableHeap heap = BufferedDurableHeap.Open(file, NoAdvancer))
            {
                closed = heap;
                var map = new PersistentHashMap<long, long>(heap, MapTypeId);
                Fill(map, expected, 0);
                heap.Sync();
                foreach (long key in expected.Keys.Take(deletes).ToList())
                {
                    Assert.True(map.Remove(key));
                    expected.Remove(key);
                }

                heap.Sync();
                heap.Sync();
                heap.Sync();
                Assert.True(heap.Heap.ReserveSegmentForTesting >= 0, "no reserve");
                first = ArmEveryCrashPointFromNow(domain);
            }

            last = domain.CrashPointCount;
        }

        _output.WriteLine($"saved: {closed.SavedStateFailure ?? "yes"}; crash points {first}..{last}; released segments {closed.Heap.ReleasedSegments}");
        Assert.Null(closed.SavedStateFailure);
        Check(domain.CapturedCrashes.Select(c => (c.Point, c.Image)).Append((last, domain.GetDurableImage())), expected, Capacity);
    }

    [Theory]
    [InlineData(200)]
    [InlineData(1)]
    public void FullHeap_DeletesOnAnotherLiveThread_SavesStateAtCleanShutdown(int deletes)
    {
        const long Capacity = 1L << 20;
        var expected = new Dictionary<long, long>();
        using var domain = new SimulatedPersistenceDomain(Capacity, Capacity);
        BufferedDurableHeap closed;
        using var release = new ManualResetEventSlim();
        Thread? worker = null;
        using (HeapFile file = HeapFile.Create(domain))
        {
            using (BufferedDurableHeap heap = BufferedDurableHeap.Open(file, NoAdvancer))
            {
                closed = heap;
                var map = new PersistentHashMap<long, long>(heap, MapTypeId);
                Fill(map, expected, 0);
                heap.Sync();
                using var done = new ManualResetEventSlim();
                worker = new Thread(() =>
                {
                    foreach (long key in expected.Keys.Take(deletes).ToList())
                    {
                        Assert.True(map.Remove(key));
                        lock (expected) { expected.Remove(key); }
                    }

                    done.Set();
                    release.Wait();
                });
                worker.Start();
                done.Wait();
                heap.Sync();
                heap.Sync();
                heap.Sync();
                Assert.True(heap.Heap.ReserveSegmentForTesting >= 0, "no reserve");
            }
        }

        release.Set();
        worker.Join();
        _output.WriteLine($"saved: {closed.SavedStateFailure ?? "yes"}; released segments {closed.Heap.ReleasedSegments}");
        Assert.Null(closed.SavedStateFailure);
    }

    [Fact]
    public void FoundEmptyAfterCrash_CrashAtEveryPointOfDispose()
    {
        const long Capacity = 1L << 20;
        var expected = new Dictionary<long, long>();
        byte[] image;
        using (var domain0 = new SimulatedPersistenceDomain(Capacity, Capacity))
        using (HeapFile file = HeapFile.Create(domain0))
        using (BufferedDurableHeap heap = BufferedDurableHeap.Open(file, NoAdvancer))
        {
            var map = new PersistentHashMap<long, long>(heap, MapTypeId);
            Fill(map, expected, 0);
            heap.Sync();
            foreach (long key in expected.Keys.OrderByDescending(k => k).Take(3000).ToList())
            {
                try { Assert.True(map.Remove(key)); expected.Remove(key); }
                catch (InsufficientMemoryException) { heap.Sync(); heap.Sync(); heap.Sync(); }
            }

            heap.Sync(); heap.Sync(); heap.Sync();
            image = domain0.GetDurableImage(); // a crash: no clean shutdown
        }

        using var domain = SimulatedPersistenceDomain.FromImage(image, Capacity);
        BufferedDurableHeap closed;
        long first, last, claimedBefore;
        using (HeapFile file = HeapFile.Open(domain))
        {
            using (BufferedDurableHeap heap = BufferedDurableHeap.Open(file, NoAdvancer))
            {
                closed = heap;
                Assert.False(heap.Recovery.FastReopen);
                Assert.Equal(expected.Count, new PersistentHashMap<long, long>(heap, MapTypeId).Count);
                claimedBefore = heap.Heap.GetStatistics().FreeSegments;
                first = ArmEveryCrashPointFromNow(domain);
            }

            last = domain.CrashPointCount;
        }

        _output.WriteLine($"saved: {closed.SavedStateFailure ?? "yes"}; free segments at open {claimedBefore}; crash points {first}..{last}; released {closed.Heap.ReleasedSegments}");
        Assert.Null(closed.SavedStateFailure);
        Check(domain.CapturedCrashes.Select(c => (c.Point, c.Image)).Append((last, domain.GetDurableImage())), expected, Capacity);
    }

    [Fact]
    public void EmptiedSmallPayloadHeap_CrashAtEveryPointOfDispose()
    {
        const long Size = 2L << 20;
        var options = new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan };
        using var domain = new SimulatedPersistenceDomain(Size, Size);
        BufferedDurableHeap closed;
        long first, last;
        var expected = new Dictionary<long, long>();
        using (HeapFile file = HeapFile.Create(domain))
        {
            using (BufferedDurableHeap heap = BufferedDurableHeap.Open(file, options))
            {
                closed = heap;
                var map = new PersistentByteMap<long>(heap, typeId: 1);
                var small = new PersistentHashMap<long, long>(heap, MapTypeId);
                for (long i = 0; i < 50; i++)
                {
                    small.Set(i, i * 3);
                    expected[i] = i * 3;
                }

                FastReopenTests.FillWithSmallPayloadsAndEmpty(heap, map);

                heap.Sync();
                heap.Sync();
                first = ArmEveryCrashPointFromNow(domain);
            }

            last = domain.CrashPointCount;
        }

        _output.WriteLine($"saved: {closed.SavedStateFailure ?? "yes"}; crash points {first}..{last}; released segments {closed.Heap.ReleasedSegments}");
        Assert.Null(closed.SavedStateFailure);
        Check(domain.CapturedCrashes.Select(c => (c.Point, c.Image)).Append((last, domain.GetDurableImage())), expected, Size);
    }

    private void Check(IEnumerable<(long Point, byte[] Image)> images, Dictionary<long, long> expected, long capacity)
    {
        int n = 0, fast = 0;
        var failures = new List<string>();
        foreach ((long point, byte[] image) in images)
        {
            n++;
            try
            {
                using var crashed = SimulatedPersistenceDomain.FromImage(image, capacity);
                using HeapFile file = HeapFile.Open(crashed);
                using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, NoAdvancer);
                fast += heap.Recovery.FastReopen ? 1 : 0;
                if (n % 6 == 1) _output.WriteLine($"point {point}: fast {heap.Recovery.FastReopen} clean {heap.Recovery.WasCleanShutdown} rejection {heap.Recovery.FastReopenRejection} damaged {heap.Recovery.DamagedBlocks.Count}");
                var m = new PersistentHashMap<long, long>(heap, MapTypeId);
                var now = m.ToDictionary();
                if (!now.OrderBy(kv => kv.Key).SequenceEqual(expected.OrderBy(kv => kv.Key)))
                {
                    failures.Add($"point {point}: {now.Count} entries, expected {expected.Count}");
                }

                HeapStatistics s = heap.Heap.GetStatistics();
                if (!s.AddsUp)
                {
                    failures.Add($"point {point}: statistics {s}");
                }

                // A rescan of the same image agrees, and a delete works.
                if (now.Count > 0)
                {
                    m.Remove(now.Keys.First());
                    heap.Sync();
                }
            }
            catch (Exception e)
            {
                failures.Add($"point {point}: {e.GetType().Name}: {e.Message}");
            }
        }

        _output.WriteLine($"{n} images, {fast} fast reopens, {failures.Count} failures");
        Assert.True(failures.Count == 0, string.Join("\n", failures.Take(20)));
    }
}
