using System;
using System.Collections.Generic;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// A segment keeps the size class it was formatted for while any of its blocks is in use; once all of them sit unused
/// in the class's pool, a heap that has no free segment left and cannot grow takes the segment back for another size
/// (a large block, another class) instead of reporting the heap full. Nothing of the old use may leak into the new one,
/// in memory or after a crash.
/// </summary>
public sealed class SegmentReuseTests
{
    private const int SmallSize = 4000; // the 4 KiB class: 16 blocks per segment
    private const int LargeSize = 300_000; // 5 segments
    private readonly ITestOutputHelper _output;

    public SegmentReuseTests(ITestOutputHelper output) => _output = output;

    [Theory]
    [InlineData(SmallSize)]
    [InlineData(3000)] // the 3 KiB class: 1 KiB of each segment is overhead, which a released segment gives back
    [InlineData(9000)]
    [InlineData(16_000)] // every block fits in the thread's own cache: none reaches the shared pool on its own
    public void HeapFullOfFreedBlocksOfOneClass_TakesTheirSegmentsForOtherSizes(int smallSize)
    {
        List<string> violations = FillFreeAndReuse(HeapFaults.None, smallSize, out long released);
        _output.WriteLine($"{smallSize}-byte blocks: {released} segments released");
        Assert.True(released >= 5, $"{released} segments released");
        Assert.Empty(violations);
    }

    [Fact]
    public void Control_ReleaseLeavingTheBlocksPooled_IsCaught()
    {
        List<string> violations = FillFreeAndReuse(HeapFaults.ReleaseSegmentsLeavingBlocksPooled, SmallSize, out _);
        _output.WriteLine($"control caught {violations.Count} violations, e.g. {(violations.Count > 0 ? violations[0] : "none")}");
        Assert.NotEmpty(violations);
    }

    [Fact]
    public void Crash_AtEveryPointOfTheReuse_RecoversAConsistentHeap()
    {
        // Deterministic (one thread): a first run counts the crash points of the reuse, the second captures an image at
        // each of them with two seeds (which unflushed words survive).
        long points;
        using (Run(HeapFaults.None, _ => { }, out long firstPoint, out long lastPoint))
        {
            points = lastPoint - firstPoint;
        }

        using var domain = Run(HeapFaults.None, d =>
        {
            for (long p = d.CrashPointCount; p < d.CrashPointCount + points; p++)
            {
                d.ArmCrash(p, seed: (int)p);
                d.ArmCrash(p, seed: (int)p + 1_000_000);
            }
        }, out _, out _);

        int images = 0;
        foreach (SimulatedCrash crash in domain.CapturedCrashes)
        {
            images++;
            using var crashed = SimulatedPersistenceDomain.FromImage(crash.Image);
            using HeapFile file = HeapFile.Open(crashed);

            // Damage would throw here; a block of the old use surviving inside the new one would be damage or a phantom.
            using var recovered = new PersistentHeap(file);
            HeapStatistics statistics = recovered.RecoveryStatistics;
            Assert.True(statistics.AddsUp, $"point {crash.Point} seed {crash.Seed}: {statistics}");
            Assert.True(statistics.LiveBlocks <= 1, $"point {crash.Point} seed {crash.Seed}: {statistics.LiveBlocks} live blocks (only the large one was ever live after the frees)");
            recovered.ForEachAllocated((block, header) =>
                Assert.True(header.Size == LargeSize, $"point {crash.Point} seed {crash.Seed}: a live block of {header.Size} bytes at 0x{block.Offset:X}"));
        }

        _output.WriteLine($"{points} crash points, {images} images");
        Assert.True(images >= 2 * points && points > 0, $"{images} images of {points} points");
    }

    [Fact]
    public void ByteMap_ValuesChangeSize_OnAHeapThatCannotGrow()
    {
        // A user's values change size: 4 KiB values shrunk to 100 bytes (the old blocks reclaimed, parked for the sweep
        // in the 4 KiB class), then one large value. Before, the heap reported itself full while 10 of its 15 segments
        // held nothing live.
        using var dir = new TempDirectory();
        string path = dir.File("map.heap");
        var noAdvancer = new BufferedDurableHeapOptions { AdvancePeriod = System.Threading.Timeout.InfiniteTimeSpan };
        byte[] large = new byte[LargeSize];
        new Random(5).NextBytes(large);
        const long keys = 10 * 16; // 10 segments of the 4 KiB class
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, new HeapFileOptions { Size = 1L << 20, MaxSize = 1L << 20, Domain = PersistenceDomainKind.MappedFile }, noAdvancer))
        {
            var map = new PersistentByteMap<long>(heap, typeId: 1);
            for (long k = 0; k < keys; k++)
            {
                Assert.True(map.Set(k, new byte[SmallSize - 8]));
            }

            heap.Sync();
            for (long k = 0; k < keys; k++)
            {
                Assert.False(map.Set(k, new byte[100]));
            }

            // Two more advances: the 4 KiB payloads are reclaimed (parked for the sweep, nothing else asks for that class).
            for (int i = 0; i < 3; i++)
            {
                heap.AdvanceVersion(TimeSpan.FromSeconds(30));
            }

            Assert.True(heap.Heap.PendingFreeBlocks >= keys / 2, $"{heap.Heap.PendingFreeBlocks} parked frees");
            Assert.True(map.Set(-1, large));
            heap.Sync();
            Assert.True(heap.Heap.ReleasedSegments >= 5, $"{heap.Heap.ReleasedSegments} segments released");
            Assert.True(heap.Heap.GetStatistics().AddsUp, heap.Heap.GetStatistics().ToString());
        }

        using BufferedDurableHeap reopened = BufferedDurableHeap.Open(path, new HeapFileOptions { Domain = PersistenceDomainKind.MappedFile }, noAdvancer);
        var recovered = new PersistentByteMap<long>(reopened, typeId: 1);
        Assert.Equal(keys + 1, recovered.Count);
        Assert.Equal(large, recovered.Get(-1));
        Assert.Equal(100, recovered.Get(7)!.Length);
    }

    [Fact]
    public void Concurrent_MixedSizesOnAHeapThatCannotGrow_NeverHandOutABlockTwice()
    {
        (List<string> violations, long released) = MixedSizesOnAHeapThatCannotGrow(HeapFaults.None);
        Assert.Empty(violations);
        Assert.True(released > 0, "no segment changed class");
    }

    [Fact]
    public void Concurrent_Control_ReleaseLeavingTheBlocksPooled_IsCaught()
    {
        (List<string> violations, _) = MixedSizesOnAHeapThatCannotGrow(HeapFaults.ReleaseSegmentsLeavingBlocksPooled);
        _output.WriteLine($"control caught {violations.Count} violations, e.g. {(violations.Count > 0 ? violations[0] : "none")}");
        Assert.NotEmpty(violations);
    }

    /// <summary>
    /// Four threads allocate, stamp, check and free blocks of sizes that change in phases, on a heap that cannot grow,
    /// so segments keep changing class. Bounded: a few seconds. Returns the violations and the segments released.
    /// </summary>
    private (List<string> Violations, long Released) MixedSizesOnAHeapThatCannotGrow(HeapFaults faults)
    {
        const int threads = 4, operations = 40_000, seed = 11;
        using var domain = new SimulatedPersistenceDomain(2 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using var heap = new PersistentHeap(file, new PersistentHeapOptions { Faults = faults });
        int[] sizes = [100, SmallSize, 9000, 70_000, LargeSize];
        var violations = new System.Collections.Concurrent.ConcurrentQueue<string>();
        long failures = 0;
        var workers = new Thread[threads];
        for (int w = 0; w < threads; w++)
        {
            int worker = w;
            workers[w] = new Thread(() =>
            {
                var random = new Random(seed + worker);
                var mine = new List<(PayloadRef Block, long Uid)>();
                try
                {
                    for (int op = 0; op < operations && violations.IsEmpty; op++)
                    {
                        int size = sizes[((op / 2000) + worker) % sizes.Length];
                        if (mine.Count > 0 && (mine.Count > 60 || random.Next(2) == 0))
                        {
                            int i = random.Next(mine.Count);
                            (PayloadRef block, long uid) = mine[i];
                            mine[i] = mine[^1];
                            mine.RemoveAt(mine.Count - 1);
                            if (!Stamp.Matches(heap.GetPayload(block), uid))
                            {
                                violations.Enqueue($"the block at 0x{block.Offset:X} was overwritten");
                            }

                            heap.Free(block);
                        }
                        else if (heap.TryAllocate(size, 1, out PayloadRef block))
                        {
                            long uid = heap.GetHeader(block).Uid;
                            Stamp.Write(heap.GetPayload(block), uid);
                            mine.Add((block, uid));
                        }
                        else
                        {
                            Interlocked.Increment(ref failures);
                        }
                    }

                    foreach ((PayloadRef block, long uid) in mine)
                    {
                        if (!Stamp.Matches(heap.GetPayload(block), uid))
                        {
                            violations.Enqueue($"the block at 0x{block.Offset:X} was overwritten (at the end)");
                        }

                        heap.Free(block);
                    }
                }
                catch (Exception e)
                {
                    violations.Enqueue($"worker {worker}: {e.GetType().Name}: {e.Message}");
                }
            });
            workers[w].Start();
        }

        foreach (Thread worker in workers)
        {
            Assert.True(worker.Join(TimeSpan.FromSeconds(60)), "a worker did not finish");
        }

        _output.WriteLine($"seed={seed} failures={failures} released={heap.ReleasedSegments} {heap.GetStatistics()}");
        var found = new List<string>(violations);
        if (!heap.GetStatistics().AddsUp)
        {
            found.Add($"accounting does not add up: {heap.GetStatistics()}");
        }

        return (found, heap.ReleasedSegments);
    }

    /// <summary>Allocates blocks of <paramref name="size"/> bytes until the heap is full, then frees them all (with
    /// <paramref name="durably"/>, each allocation persisted and each free written back, then one fence).</summary>
    private static void FillThenFree(PersistentHeap heap, int size, bool durably)
    {
        var blocks = new List<PayloadRef>();
        while (heap.TryAllocate(size, 1, out PayloadRef block))
        {
            if (durably)
            {
                heap.Persist(block);
            }

            blocks.Add(block);
        }

        foreach (PayloadRef block in blocks)
        {
            heap.Free(block);
            if (durably)
            {
                heap.WriteBackHeader(block);
            }
        }

        if (durably)
        {
            heap.Fence();
        }
    }

    /// <summary>Fills a fixed-size heap with 4 KiB blocks, frees them all, then allocates a large block and stamps it.</summary>
    private static SimulatedPersistenceDomain Run(HeapFaults faults, Action<SimulatedPersistenceDomain> arm, out long firstPoint, out long lastPoint)
    {
        var domain = new SimulatedPersistenceDomain(1 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using var heap = new PersistentHeap(file, new PersistentHeapOptions { Faults = faults });
        FillThenFree(heap, SmallSize, durably: true);
        firstPoint = domain.CrashPointCount;
        arm(domain);
        PayloadRef large = heap.Allocate(LargeSize, 2);
        Stamp.Write(heap.GetPayload(large), heap.GetHeader(large).Uid);
        heap.Persist(large);
        lastPoint = domain.CrashPointCount;
        return domain;
    }

    private static List<string> FillFreeAndReuse(HeapFaults faults, int smallSize, out long released)
    {
        var violations = new List<string>();
        using var domain = new SimulatedPersistenceDomain(1 << 20);
        using (HeapFile file = HeapFile.Create(domain))
        using (var heap = new PersistentHeap(file, new PersistentHeapOptions { Faults = faults }))
        {
            FillThenFree(heap, smallSize, durably: false);

            // Before, every segment stayed in the 4 KiB class: this threw InsufficientMemoryException.
            if (!heap.TryAllocate(LargeSize, 2, out PayloadRef large))
            {
                violations.Add($"the large block found no room: {heap.GetStatistics()}");
                released = heap.ReleasedSegments;
                return violations;
            }

            long largeUid = heap.GetHeader(large).Uid;
            Stamp.Write(heap.GetPayload(large), largeUid);
            heap.Persist(large);

            // Everything else the heap still has, in both sizes, stamped: none may overlap the large block.
            foreach (int size in new[] { smallSize, 100 })
            {
                while (heap.TryAllocate(size, 3, out PayloadRef block))
                {
                    if (block.Offset < large.Offset + LargeSize + 32 && large.Offset < block.Offset + size + 32)
                    {
                        violations.Add($"a {size}-byte block at 0x{block.Offset:X} overlaps the large block at 0x{large.Offset:X}");
                        continue;
                    }

                    try
                    {
                        long uid = heap.GetHeader(block).Uid;
                        Stamp.Write(heap.GetPayload(block), uid);
                        heap.Persist(block);
                    }
                    catch (InvalidOperationException e)
                    {
                        // A block of the old use handed out in a segment since formatted for another class.
                        violations.Add($"a {size}-byte block at 0x{block.Offset:X} is not a block of its segment: {e.Message}");
                    }
                }
            }

            if (!Stamp.Matches(heap.GetPayload(large), largeUid))
            {
                violations.Add("the large block's payload was overwritten");
            }

            if (!heap.GetStatistics().AddsUp)
            {
                violations.Add($"accounting does not add up: {heap.GetStatistics()}");
            }

            released = heap.ReleasedSegments;
        }

        // What was persisted is what recovery finds (a durable image, no torn words).
        using var reopenedDomain = SimulatedPersistenceDomain.FromImage(domain.GetDurableImage());
        try
        {
            using HeapFile reopenedFile = HeapFile.Open(reopenedDomain);
            using var reopened = new PersistentHeap(reopenedFile);
            int largeBlocks = 0;
            reopened.ForEachAllocated((block, header) =>
            {
                if (header.Size == LargeSize)
                {
                    largeBlocks++;
                    if (!Stamp.Matches(reopened.GetPayload(block), header.Uid))
                    {
                        violations.Add($"after reopen the large block at 0x{block.Offset:X} differs");
                    }
                }
            });
            if (largeBlocks != 1)
            {
                violations.Add($"after reopen {largeBlocks} large blocks");
            }

            if (!reopened.RecoveryStatistics.AddsUp)
            {
                violations.Add($"after reopen the accounting does not add up: {reopened.RecoveryStatistics}");
            }
        }
        catch (Exception e) when (e is System.IO.InvalidDataException or HeapFileException or InvalidOperationException)
        {
            violations.Add($"reopen failed: {e.GetType().Name}: {e.Message}");
        }

        return violations;
    }
}
