using System;
using System.Collections.Generic;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// Issue 10, the advancer stocking the heap's pools: while free segments remain it formats them (dense, handed out
/// whole) and leaves parked frees to accumulate instead of sweeping them sparse; a segment it formats, even one an
/// earlier use left full of old headers, is zeroed durably before its descriptor, so no crash image reports damage.
/// </summary>
public sealed class PoolStockingTests
{
    private const int TypeId = 17;
    private static readonly TimeSpan Wait = TimeSpan.FromSeconds(30);

    [Fact]
    public void WhileFreeSegmentsRemain_TheAdvancerFormatsThem_AndLeavesParkedFreesToAccumulate()
    {
        const int Keys = 4096;
        using var domain = new SimulatedPersistenceDomain(8 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
        var map = new PersistentHashMap<long, long>(heap, TypeId);
        for (long k = 0; k < Keys; k++)
        {
            map.Set(k, k);
        }

        heap.AdvanceVersion(Wait);
        long retired = 0;
        for (int round = 1; round <= 6; round++)
        {
            for (long k = 0; k < Keys; k++)
            {
                map.Set(k, k + round);
            }

            retired += Keys;
            heap.AdvanceVersion(Wait);
        }

        // Every replaced copy is parked except the last round's (reclaimed a cycle later): nothing was swept while the
        // heap had free segments (the sweep would have taken parked frees out, one page write per handful of blocks).
        PersistentHeap allocator = heap.Heap;
        Assert.True(allocator.GetStatistics().FreeSegments > 0, "the heap ran out of free segments: the test needs a larger heap");
        Assert.Equal(0, allocator.StockSweptBlocks);
        Assert.Equal(retired - Keys, allocator.PendingFreeBlocks);
        Assert.True(allocator.StockFormattedSegments > 0, "the advancer formatted no segment for the writers");
    }

    [Fact]
    public void OnceNoFreeSegmentIsLeft_TheAdvancerSweepsTheDensestParkedFrees_AndTheFileDoesNotGrow()
    {
        const int Keys = 2048;
        using var domain = new SimulatedPersistenceDomain(1 << 20, 8 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
        var map = new PersistentHashMap<long, long>(heap, TypeId);
        long size = file.Size;
        for (int round = 0; round < 40; round++)
        {
            for (long k = 0; k < Keys; k++)
            {
                map.Set(k, k + round);
            }

            heap.AdvanceVersion(Wait);
        }

        PersistentHeap allocator = heap.Heap;
        Assert.Equal(0, allocator.GetStatistics().FreeSegments);
        Assert.True(allocator.StockSweptBlocks > 0, "the advancer never swept, yet the heap has no free segment left");
        Assert.Equal(size, file.Size);
        Assert.Equal(Keys, map.Count);
    }

    [Fact]
    public void AClassOfLargeBlocks_IsStockedForItsDemand_NotWithASegmentPerReservedBlock()
    {
        // The reserve is in bytes: one 16 KB payload (four blocks to a segment) asks for a few segments, not for every
        // free segment of the heap (a reserve of 1,024 blocks would be 256 segments).
        using var domain = new SimulatedPersistenceDomain(2 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
        long free = heap.Heap.GetStatistics().FreeSegments;
        var map = new PersistentByteMap<long>(heap, TypeId);
        map.Set(1, new byte[16_000]);
        heap.AdvanceVersion(Wait);
        heap.AdvanceVersion(Wait);
        long taken = free - heap.Heap.GetStatistics().FreeSegments;
        Assert.True(taken <= 4, $"one 16 KB payload took {taken} of the heap's {free} free segments");
        Assert.True(heap.Heap.StockFormattedSegments > 0, "the advancer stocked nothing for the class");
    }

    [Fact]
    public void AReusedSegment_IsZeroedDurablyBeforeItsDescriptor_NoCrashImageReportsDamage()
    {
        List<string> violations = StockReusedSegments(HeapFaults.None, out int images, out long formatted);
        Assert.True(formatted >= 2, $"the advancer formatted {formatted} segment(s): the test needs it to reuse old ones");
        Assert.True(images >= 20, $"only {images} crash images");
        Assert.Empty(violations);
    }

    [Fact]
    public void StockingWithoutDurableZeroing_IsCaughtAsDamage()
    {
        List<string> violations = StockReusedSegments(HeapFaults.StockWithoutDurableZeroing, out _, out _);
        Assert.Contains(violations, v => v.Contains("damaged", StringComparison.Ordinal));
    }

    /// <summary>
    /// Fills eight segments with 16-byte entries and removes them all, so that at the next open those segments are
    /// free but full of old headers; then writes a hundred 2,000-byte entries (another size class) and runs the advance
    /// whose stocking formats old segments for them, with a power failure armed at each of its crash points (2
    /// adversarial seeds each; the stocking comes after the hundred blocks' write-backs and seals), and the durable
    /// image after it. Returns what reopening each image reported, and how many segments the stocking formatted.
    /// </summary>
    private static List<string> StockReusedSegments(HeapFaults faults, out int images, out long formatted)
    {
        const long Capacity = 4 << 20;
        const int OldKeys = 8 * 1024;
        using var domain = new SimulatedPersistenceDomain(Capacity);
        using (HeapFile file = HeapFile.Create(domain))
        using (BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan }))
        {
            var map = new PersistentHashMap<long, long>(heap, TypeId);
            for (long k = 0; k < OldKeys; k++)
            {
                map.Set(k, k);
            }

            heap.AdvanceVersion(Wait);
            for (long k = 0; k < OldKeys; k++)
            {
                map.Remove(k);
            }

            for (int i = 0; i < 3; i++)
            {
                heap.AdvanceVersion(Wait);
            }
        }

        var violations = new List<string>();
        using (HeapFile file = HeapFile.Open(domain))
        using (BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, HeapFaults = faults }))
        {
            var bytes = new PersistentByteMap<long>(heap, TypeId + 1);
            byte[] value = new byte[2000];
            for (long k = 0; k < 100; k++)
            {
                value[0] = (byte)k;
                bytes.Set(k, value);
            }

            for (long p = domain.CrashPointCount; p < domain.CrashPointCount + 400; p++)
            {
                for (int seed = 0; seed < 2; seed++)
                {
                    domain.ArmCrash(p, (int)(p * 2) + seed);
                }
            }

            heap.AdvanceVersion(Wait);
            formatted = heap.Heap.StockFormattedSegments;
            images = domain.CapturedCrashes.Count + 1;
            Reopen(domain.GetDurableImage(), "after the advance", violations);
        }

        foreach (SimulatedCrash crash in domain.CapturedCrashes)
        {
            Reopen(crash.Image, $"point {crash.Point} seed {crash.Seed}", violations);
        }

        return violations;

        static void Reopen(byte[] image, string what, List<string> violations)
        {
            try
            {
                using var crashed = SimulatedPersistenceDomain.FromImage(image, Capacity);
                using HeapFile file = HeapFile.Open(crashed);
                using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
            }
            catch (HeapFileException e) when (e.Error == HeapFileError.Corrupt)
            {
                violations.Add($"{what}: damaged: {e.Message}");
            }
        }
    }
}
