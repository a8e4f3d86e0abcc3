using System;
using System.Collections.Generic;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// Issue 10, stocking ahead of the demand: an allocating thread whose pool runs empty formats a segment for itself, a
/// write-back and a fence inside its operation (through the page cache an <c>fdatasync</c>, which every other thread's
/// next transition then waits for). Under two full-speed writers the pools, stocked only after each cycle for twice
/// the last cycle's demand, ran dry hundreds of times a second. Now the stocking keeps each class's measured rate over
/// a horizon of periods ready, and the thread that leaves a pool below half of that (or finds it empty) wakes the
/// stocker at once, between cycles.
/// </summary>
public sealed class LowWaterStockingTests
{
    private const int TypeId = 29;
    private static readonly TimeSpan Wait = TimeSpan.FromSeconds(30);
    private static readonly int MapClass = SizeClasses.ForPayload(2 * sizeof(long));

    /// <summary>
    /// No cycle runs (a one-hour period): writers that empty their pool wake the stocker, which formats segments for
    /// them. The control stocks only after cycles, so the writers format every segment themselves.
    /// </summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void AWriterThatEmptiesItsPool_WakesTheStocker_WhichStocksBetweenCycles(bool control)
    {
        const int Keys = 20_000;
        using var domain = new SimulatedPersistenceDomain(16 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions
        {
            AdvancePeriod = TimeSpan.FromHours(1),
            Faults = control ? DurabilityFaults.StockOnlyAfterCycles : DurabilityFaults.None,
        });

        int wakes = 0;
        if (heap.Heap.PoolRunningLow is { } wake)
        {
            heap.Heap.PoolRunningLow = () =>
            {
                Interlocked.Increment(ref wakes);
                wake();
            };
        }

        var map = new PersistentHashMap<long, long>(heap, TypeId);
        for (long k = 0; k < Keys; k++)
        {
            map.Set(k, k);
        }

        // The wake is synchronous (the writer's own call): without one, nothing will ever stock before a cycle.
        if (Volatile.Read(ref wakes) > 0)
        {
            Assert.True(SpinWait.SpinUntil(() => heap.Heap.StockFormattedSegments > 0, Wait), "the stocker was woken but formatted nothing");
        }

        Assert.Equal(0, heap.GetAdvancerStatistics().Cycles);
        bool stockedBetweenCycles = Volatile.Read(ref wakes) > 0 && heap.Heap.StockFormattedSegments > 0;
        Assert.Equal(!control, stockedBetweenCycles);
        if (control)
        {
            // Every segment the writer used, it formatted itself: one refill (two fences) per 1,024 blocks.
            Assert.True(heap.GetAdvancerStatistics().AllocatorRefills >= Keys / SizeClasses.BlocksPerSegment[MapClass], $"{heap.GetAdvancerStatistics().AllocatorRefills} refills");
        }
    }

    /// <summary>
    /// The horizon, on a clock of the test's (no stocker thread: the stocking called directly, period 1 s): a demand
    /// taken over half a period is measured over a whole one (four times that demand stocked, not eight), over two periods
    /// at its rate (half of four times), and never below twice the demand since the previous stocking. Each stocking
    /// formats whole segments (1,024 blocks of the map's class) until the pool holds its target.
    /// </summary>
    [Fact]
    public void AStocking_KeepsFourPeriodsOfTheMeasuredRateReady_MeasuredOverAtLeastAPeriod()
    {
        using var domain = new SimulatedPersistenceDomain(32 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
        PersistentHeap allocator = heap.Heap;
        var map = new PersistentHashMap<long, long>(heap, TypeId);
        long clock = 0;
        allocator.StockClockForTesting = () => clock;
        TimeSpan period = TimeSpan.FromSeconds(1);
        long periodTicks = System.Diagnostics.Stopwatch.Frequency;
        int segment = SizeClasses.BlocksPerSegment[MapClass];
        allocator.StockPools(0, period);
        long key = 0;

        // 8,000 blocks in half a period: measured over one, 4 × 8,000 ready.
        key = Insert(map, key, 8_000);
        clock += periodTicks / 2;
        allocator.StockPools(0, period);
        Assert.InRange(allocator.ReadyBlocks(MapClass), 32_000, 32_000 + segment - 1);

        // 20,000 more in two periods: the rate is half as high, 2 × 20,000 ready (and twice the demand, the floor, agrees).
        key = Insert(map, key, 20_000);
        clock += 2 * periodTicks;
        allocator.StockPools(0, period);
        Assert.InRange(allocator.ReadyBlocks(MapClass), 40_000, 40_000 + segment - 1);

        // 30,000 more in eight periods: at the rate, 15,000; never below twice the demand, 60,000.
        key = Insert(map, key, 30_000);
        clock += 8 * periodTicks;
        allocator.StockPools(0, period);
        Assert.InRange(allocator.ReadyBlocks(MapClass), 60_000, 60_000 + segment - 1);
    }

    private static long Insert(PersistentHashMap<long, long> map, long from, int count)
    {
        for (long k = from; k < from + count; k++)
        {
            map.Set(k, k);
        }

        return from + count;
    }

    /// <summary>
    /// The low-water mark, without a stocker thread (cycles by hand, the stocking called directly): a stocking for a
    /// demand over a horizon sets the mark at half of what it stocks; the first batch that leaves the pool below it wakes
    /// the stocker while the pool still holds blocks, and only once until the next stocking.
    /// </summary>
    [Fact]
    public void ABatchThatLeavesThePoolBelowHalfTheStocking_WakesTheStockerOnce_BeforeThePoolIsEmpty()
    {
        using var domain = new SimulatedPersistenceDomain(16 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
        PersistentHeap allocator = heap.Heap;
        var map = new PersistentHashMap<long, long>(heap, TypeId);
        long key = 0;

        // A demand (the writer formats for itself: no stocking yet), then a stocking of it with a horizon.
        for (; key < 5_000; key++)
        {
            map.Set(key, key);
        }

        var readyAtWakes = new List<long>();
        allocator.PoolRunningLow = () => readyAtWakes.Add(allocator.ReadyBlocks(MapClass));
        allocator.StockPools(0, TimeSpan.FromSeconds(1));
        long stocked = allocator.ReadyBlocks(MapClass);
        Assert.True(stocked >= 2 * 5_000, $"{stocked} blocks stocked for a demand of 5,000");
        Assert.Empty(readyAtWakes);

        // Take blocks until the pool is empty: exactly one wake, on the way down, with blocks still in the pool.
        long refills = heap.GetAdvancerStatistics().AllocatorRefills;
        while (allocator.ReadyBlocks(MapClass) > 0)
        {
            map.Set(key, key);
            key++;
        }

        Assert.Equal(refills, heap.GetAdvancerStatistics().AllocatorRefills);
        long wakeAt = Assert.Single(readyAtWakes);
        Assert.InRange(wakeAt, 1, (stocked / 2) - 1);

        // Empty, and nobody stocked: the thread formats for itself, without a second wake (the stocker has been asked).
        while (heap.GetAdvancerStatistics().AllocatorRefills == refills)
        {
            map.Set(key, key);
            key++;
        }

        Assert.Single(readyAtWakes);

        // The next stocking resets the mark: the next empty pool wakes the stocker again.
        allocator.StockPools(0, TimeSpan.Zero);
        while (readyAtWakes.Count == 1 && key < 200_000)
        {
            map.Set(key, key);
            key++;
        }

        Assert.Equal(2, readyAtWakes.Count);
    }
}
