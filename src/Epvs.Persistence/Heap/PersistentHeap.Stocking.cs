using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Runtime.InteropServices;
using System.Threading;

namespace Epvs.Persistence;

// Stocking the class pools for a BufferedDurableHeap's allocating threads: after each advance cycle, and
// whenever an allocating thread finds its class's pool below its low-water mark, each class gets its demand over the
// stocking horizon ready, from free segments first (formatted in a batch), and only then from the densest parked frees
// of that class.
// Why a horizon and a low-water mark. An allocating thread whose pool is empty formats a segment or sweeps for
// itself: a write-back and a fence (through the page cache, an fdatasync of milliseconds) inside its operation,
// which every other thread's next transition waits for. Stocked only after each cycle, for twice the last cycle's
// demand, the pools ran dry whenever the demand grew (a burst after a quiet spell, a writer speeding up) or a stocking
// took longer than a cycle: under two full-speed writers through the page cache, hundreds of such fences per second on
// the writers' threads (their time off the CPU, measured with perf sched). The stocking now keeps
// StockHorizonPeriods periods of each class's demand ready, at the rate measured since the previous
// stocking (at least twice the demand since then); a thread that takes a batch and leaves the pool below half of that
// wakes the stocker at once instead of waiting for the next cycle.
// Why free segments first. A sweep hands out the parked blocks of segments whose live blocks sit between them,
// so a version's new payloads share their pages with blocks nobody touched, and through the page cache every such page
// is copied to the file whole: for the payloads, again for their seals, and again when they are freed. Swept every cycle
// while the heap still had free segments, even the densest segments were mostly live blocks. Formatted segments are
// handed out whole; meanwhile the parked frees accumulate, so that when the free segments run out the sweep's densest
// segments are mostly parked blocks.
// Why per class. A pool is stocked for the demand of its own class, so a workload of one size does not leave
// blocks of every other class formatted or swept for nothing.
// Durability: as for a segment an allocating thread formats (TryFormatSmallSegment), the zeroing
// and the unused commit words are durable before the descriptors are, and the descriptors before any block is handed
// out; here one write-back pass and one fence cover the whole batch, twice.
public sealed unsafe partial class PersistentHeap
{
    /// <summary>Blocks of each class that allocating threads took from the pools or formatted themselves, since the heap opened.</summary>
    private readonly long[] _takenByClass = new long[SizeClasses.Count];

    /// <summary><see cref="_takenByClass"/> at the last <see cref="StockPools"/> (its caller serializes the calls).</summary>
    private readonly long[] _takenAtLastStock = new long[SizeClasses.Count];

    /// <summary>Per class: below this many ready blocks, an allocating thread taking a batch wakes the stocker (<see cref="PoolRunningLow"/>); set by <see cref="StockPools"/>.</summary>
    private readonly long[] _lowWater = new long[SizeClasses.Count];

    /// <summary>Per class: 1 once an allocating thread has woken the stocker since the last stocking of the class (one wake per stocking).</summary>
    private readonly int[] _lowWaterSignalled = new int[SizeClasses.Count];

    /// <summary><see cref="Stopwatch.GetTimestamp"/> at the last <see cref="StockPools"/> (its caller serializes the calls), or when the heap opened.</summary>
    private long _lastStockTimestamp = Stopwatch.GetTimestamp();

    /// <summary>Test hook: the clock <see cref="StockPools"/> measures the demand's rate with, instead of <see cref="Stopwatch.GetTimestamp"/>.</summary>
    internal Func<long>? StockClockForTesting { get; set; }

    private long _stockFormattedSegments;
    private long _stockSweptBlocks;
    private long _allocatorRefills;

    /// <summary>
    /// Called on an allocating thread, outside every lock of the heap, when it took a batch from a class pool and left it
    /// below the class's low-water mark (once per stocking of the class), or found the pool empty: the owner's stocker
    /// should stock now. Null (the default): nobody stocks between cycles.
    /// </summary>
    internal Action? PoolRunningLow { get; set; }

    /// <summary>
    /// How many times an allocating thread found its class's pool empty and formatted a segment or swept parked frees for
    /// itself (a write-back and a fence on its own thread), since the heap opened.
    /// </summary>
    internal long AllocatorRefills => Volatile.Read(ref _allocatorRefills);

    /// <summary>Segments <see cref="StockPools"/> formatted so far (diagnostic, tests).</summary>
    internal long StockFormattedSegments => Volatile.Read(ref _stockFormattedSegments);

    /// <summary>Parked blocks the stockings swept so far (<see cref="SweepForStocking"/>: for the classes' pools and the bound on parked frees; diagnostic, tests).</summary>
    internal long StockSweptBlocks => Volatile.Read(ref _stockSweptBlocks);

    /// <summary>Free blocks of class <paramref name="cls"/> in its shared pool (approximate while other threads allocate).</summary>
    internal long ReadyBlocks(int cls)
    {
        ClassPool pool = _pools[cls];
        using (InterruptShield.Hold(pool))
        {
            return pool.BlockCount;
        }
    }

    /// <summary>Test hook: takes every batch out of class <paramref name="cls"/>'s pool, as other threads' allocations would (<see cref="PutBackForTesting"/> returns them).</summary>
    internal List<long[]> TakePoolForTesting(int cls)
    {
        ClassPool pool = _pools[cls];
        using (InterruptShield.Hold(pool))
        {
            var taken = new List<long[]>(pool.Batches);
            pool.Batches.Clear();
            pool.BlockCount = 0;
            return taken;
        }
    }

    /// <summary>Test hook: puts batches <see cref="TakePoolForTesting"/> took back into class <paramref name="cls"/>'s pool.</summary>
    internal void PutBackForTesting(int cls, List<long[]> batches)
    {
        foreach (long[] batch in batches)
        {
            PushFree(cls, batch, batch.Length);
        }
    }

    /// <summary>How many advance periods of each class's demand a stocking keeps ready (see <see cref="StockPools"/>).</summary>
    internal const int StockHorizonPeriods = 4;

    /// <summary>
    /// Stocks each class's pool with the blocks its allocating threads take over <see cref="StockHorizonPeriods"/>
    /// periods at the rate they took them since the previous call (measured over at least one period), and at least
    /// twice as many as they took since then (plus <paramref name="reserveBytes"/>): free segments first, without growing
    /// the file, then the densest parked frees of the class; and sets the class's low-water mark to half of that. Called
    /// by one thread at a time (a buffered heap's stocker thread, or without a background advancer its cycle, under the
    /// cycle gate), while allocating threads and cycles run.
    /// </summary>
    /// <remarks>
    /// Stocked once a period, that is four times the period's demand. Woken sooner by a pool below its mark (a burst),
    /// the rate is measured over one period whatever the interval, so each stocking keeps four times the blocks taken
    /// since the previous one ready: about twice as long an interval each time, until it reaches a period. Never more
    /// than four times the demand since the previous stocking, however often cycles run (a caller's Syncs).
    /// </remarks>
    /// <param name="reserveBytes">Bytes of blocks to keep ready beyond the demand, for each class that had any (in bytes,
    /// so that a class of large blocks does not take a segment per reserved block).</param>
    /// <param name="period">The advance period; <see cref="TimeSpan.Zero"/>: twice the demand since the previous call only
    /// (cycles driven by hand, at no particular rate).</param>
    internal void StockPools(long reserveBytes, TimeSpan period)
    {
        using InterruptShield.Scope shield = InterruptShield.Enter();
        long now = StockClockForTesting?.Invoke() ?? Stopwatch.GetTimestamp();
        long periodTicks = (long)(period.TotalSeconds * Stopwatch.Frequency);
        long elapsed = Math.Max(now - _lastStockTimestamp, Math.Max(1, periodTicks));
        _lastStockTimestamp = now;
        for (int cls = 0; cls < SizeClasses.Count; cls++)
        {
            // Volatile.Read: atomicity only; allocating threads add to it under the pool lock or the segment gate.
            long taken = Volatile.Read(ref _takenByClass[cls]);
            long demand = taken - _takenAtLastStock[cls];
            _takenAtLastStock[cls] = taken;
            if (demand == 0)
            {
                // Volatile.Write: see below (a class first used after its demand was read above is stocked next time).
                Volatile.Write(ref _lowWaterSignalled[cls], 0);
                continue;
            }

            long atRate = periodTicks == 0 ? 0 : (long)((double)demand * StockHorizonPeriods * periodTicks / elapsed);
            long target = Math.Max(2 * demand, atRate) + (reserveBytes / SizeClasses.BlockSizes[cls]);
            try
            {
                long missing = target - ReadyBlocks(cls);
                if (missing > 0)
                {
                    missing -= FormatIntoPool(cls, missing);
                    if (missing > 0 && Volatile.Read(ref _pendingByClass[cls]) != 0)
                    {
                        SweepForStocking(missing, cls);
                    }
                }
            }
            finally
            {
                // The new mark and the next wake only once the class is stocked: a batch taken during the refill (the
                // pool still below the mark) would otherwise ask for another stocking at once, which would measure
                // only the demand during this one and lower the mark while the pool holds this target. A wake during
                // the refill is not lost: it asked for the next stocking (the stocker's flag), which runs after this one.
                // Volatile.Write: atomicity only (the mark is read under the pool lock); the flag pairs with the
                // Interlocked.Exchange in SignalRunningLow.
                Volatile.Write(ref _lowWater[cls], target / 2);
                Volatile.Write(ref _lowWaterSignalled[cls], 0);
            }
        }
    }

    /// <summary>
    /// Sweeps at least <paramref name="blocks"/> parked blocks of class <paramref name="cls"/> (-1: of every class) for a
    /// stocking (the classes' pools, or the bound on parked frees) and counts them in <see cref="StockSweptBlocks"/>.
    /// </summary>
    /// <returns>How many blocks were handed out.</returns>
    internal long SweepForStocking(long blocks, int cls)
    {
        long swept = SweepPendingFrees(blocks, cls);
        // Volatile.Write: atomicity only (one stocking at a time writes it).
        Volatile.Write(ref _stockSweptBlocks, _stockSweptBlocks + swept);
        return swept;
    }

    /// <summary>Counts blocks an allocating thread took for class <paramref name="cls"/> (the demand <see cref="StockPools"/> stocks for).</summary>
    private void CountTaken(int cls, long blocks) => Interlocked.Add(ref _takenByClass[cls], blocks);

    /// <summary>Whether a pool left with <paramref name="ready"/> blocks is below the low-water mark of class <paramref name="cls"/> (under the pool's lock).</summary>
    private bool IsRunningLow(int cls, long ready) => PoolRunningLow is not null && ready < Volatile.Read(ref _lowWater[cls]);

    /// <summary>Wakes the stocker through <see cref="PoolRunningLow"/>, once per stocking of class <paramref name="cls"/>; outside every lock of the heap.</summary>
    private void SignalRunningLow(int cls)
    {
        // Interlocked.Exchange: one thread wakes the stocker per stocking; pairs with the reset in StockPools.
        if (PoolRunningLow is { } wake && Volatile.Read(ref _lowWaterSignalled[cls]) == 0 && Interlocked.Exchange(ref _lowWaterSignalled[cls], 1) == 0)
        {
            wake();
        }
    }

    /// <summary>Counts a refill an allocating thread did for itself (a format or a sweep).</summary>
    private void CountAllocatorRefill() => Interlocked.Increment(ref _allocatorRefills);

    /// <summary>
    /// Formats free segments (never growing the file) for class <paramref name="cls"/> until they hold at least
    /// <paramref name="blocks"/> blocks, or no free segment is left, and puts their blocks in the class's pool.
    /// </summary>
    /// <returns>How many blocks it put in the pool.</returns>
    private long FormatIntoPool(int cls, long blocks)
    {
        int perSegment = SizeClasses.BlocksPerSegment[cls];
        long wanted = (blocks + perSegment - 1) / perSegment;
        var segments = new List<long>();
        _file.EnterOperation();
        try
        {
            // The whole format under the gate, as an allocating thread formats a segment: a thread that finds no
            // segment free waits for these to reach the pool rather than report the heap full while they are formatted.
            using (InterruptShield.Hold(_segmentGate))
            {
                TakeFreeSegmentsLocked(wanted, segments);
                return segments.Count == 0 ? 0 : FormatLocked(cls, segments);
            }
        }
        finally
        {
            _file.ExitOperation();
        }
    }

    /// <summary>Formats <paramref name="segments"/> (taken off the free list) for class <paramref name="cls"/> and puts their blocks in its pool.</summary>
    private long FormatLocked(int cls, List<long> segments)
    {
        FormatSegmentsLocked(cls, segments);
        Volatile.Write(ref _stockFormattedSegments, _stockFormattedSegments + segments.Count);

        // Highest segment first: the pool pops the lowest addresses first.
        int perSegment = SizeClasses.BlocksPerSegment[cls];
        int blockSize = SizeClasses.BlockSizes[cls];
        for (int i = segments.Count - 1; i >= 0; i--)
        {
            PushFree(cls, SegmentStart(segments[i]), blockSize, 0, perSegment);
        }

        return (long)segments.Count * perSegment;
    }

    /// <summary>
    /// Under the segment gate: formats <paramref name="segments"/> (taken off the free list; a durable descriptor that
    /// still claims one is freed first) for class <paramref name="cls"/>, durably, in two batches: every segment zeroed and every
    /// block given the checked unused commit word of the segment's next generation (so no header of an earlier use —
    /// another size class's boundaries, an old seal — survives into this one: after a crash every commit word of a
    /// segment in use is a whole checked word of this generation, and anything else, zero included, can be reported as
    /// damage), then every descriptor with that generation (which invalidates every header of an earlier use). Both are
    /// durable before any block is handed out. If the zeroing fails, the segments go back to the free list (nothing of
    /// them changed on the file but their bytes).
    /// </summary>
    private void FormatSegmentsLocked(int cls, List<long> segments)
    {
        try
        {
            // (The broken control leaves the zeroing in the working image only.)
            bool durable = (_faults & HeapFaults.StockWithoutDurableZeroing) == 0;
            FreeClaimingDescriptorsLocked(segments);

            // Only now, every segment free on the medium too: their bytes may reach the file from here on.
            PrepareOverwrite(segments);
            var zeroed = new WriteBackRuns(_file.Domain);
            int blockSize = SizeClasses.BlockSizes[cls];
            int blocks = SizeClasses.BlocksPerSegment[cls];
            foreach (long segment in segments)
            {
                long start = SegmentStart(segment);
                uint generation = HeapLayout.NextGeneration(_table[segment]);
                NativeMemory.Clear(_base + start, HeapLayout.SegmentSize);
                for (int k = 0; k < blocks; k++)
                {
                    long offset = start + ((long)k * blockSize);
                    *(ulong*)(_base + offset + HeapLayout.EpochOffset) = FormattedEpochWord(offset);
                    *(ulong*)(_base + offset + HeapLayout.CommitOffset) = HeapLayout.UnusedWord(offset, generation);
                }

                if (durable)
                {
                    zeroed.Add(SegmentStart(segment), HeapLayout.SegmentSize);
                }
            }

            zeroed.Flush();
            if (durable)
            {
                _file.Domain.FenceOwned();
            }
        }
        catch
        {
            foreach (long segment in segments)
            {
                _segmentFree[segment] = true;
            }

            _freeSegmentCount += segments.Count;
            throw;
        }

        var table = new WriteBackRuns(_file.Domain);
        foreach (long segment in segments)
        {
            // Volatile.Write: release; the blocks are published to other threads by the class pool's lock (or kept in
            // the formatting thread's cache).
            Volatile.Write(ref _table[segment], HeapLayout.Descriptor(HeapLayout.NextGeneration(_table[segment]), HeapLayout.RoleSmall, (ulong)cls, segment));
            _overheadBytes += SizeClasses.SegmentOverhead(cls);
            table.Add(TableOffset(segment), sizeof(ulong));
        }

        table.Flush();
        _file.Domain.FenceOwned();
    }

    /// <summary>
    /// Before <paramref name="segments"/> (free, durably; in ascending order) are zeroed and written back whole: tells the
    /// domain their bytes are not needed (see <see cref="PersistenceDomain.PrepareOverwrite"/>), once per run of
    /// adjacent segments.
    /// </summary>
    private void PrepareOverwrite(List<long> segments)
    {
        for (int i = 0; i < segments.Count;)
        {
            int j = i + 1;
            while (j < segments.Count && segments[j] == segments[j - 1] + 1)
            {
                j++;
            }

            _file.Domain.PrepareOverwrite(SegmentStart(segments[i]), (long)(j - i) * HeapLayout.SegmentSize);
            i = j;
        }
    }

    /// <summary>
    /// Takes up to <paramref name="count"/> free segments (without growing the file), lowest first, into
    /// <paramref name="taken"/>; never the delete reserve's (<see cref="ReservedSegmentsLocked"/>).
    /// </summary>
    private void TakeFreeSegmentsLocked(long count, List<long> taken)
    {
        count = Math.Min(count, _freeSegmentCount - ReservedSegmentsLocked(antiPayload: false));
        for (long s = 0; s < _segmentFree.Length && taken.Count < count; s++)
        {
            if (_segmentFree[s])
            {
                _segmentFree[s] = false;
                taken.Add(s);
            }
        }

        _freeSegmentCount -= taken.Count;
    }
}
