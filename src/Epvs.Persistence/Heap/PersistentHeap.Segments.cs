using System;
using System.Collections.Generic;
using System.Runtime.InteropServices;
using System.Threading;

namespace Epvs.Persistence;

// Segment management: formatting small-block segments, large blocks, growth. Slow paths, under _segmentGate.
public sealed unsafe partial class PersistentHeap
{
    private readonly object _segmentGate = new();
    private bool[] _segmentFree;
    private long _freeSegmentCount;
    private long _overheadBytes;
    private long _segmentCount;
    private long _recoveredLiveBlocks;
    private long _recoveredLiveBytes;
    private long _releasedSegments;
    private long _heapFullRefills;

    /// <summary>Pushes of free blocks into the class pools so far (atomic increments under the pool locks).</summary>
    private long _poolPushes;

    /// <summary><see cref="_poolPushes"/> when a release last found no segment to give back (under the segment gate).</summary>
    private long _poolPushesAtFruitlessRelease = -1;

    /// <summary>Formatted segments given back to the free list because all their blocks sat unused in a pool (diagnostic, tests).</summary>
    internal long ReleasedSegments => Volatile.Read(ref _releasedSegments);

    /// <summary>
    /// Refills that found no block ready, no free segment and nothing to sweep or wait for (under two batches of the class
    /// parked, none in flight), and took the heap-full path inside the allocating thread's operation: growth, or a flush
    /// of every parked free and the release of pooled segments, or at least its first look under the segment gate, which
    /// may still find blocks a stocking put in the pool meanwhile (diagnostic, tests).
    /// </summary>
    internal long HeapFullRefills => Volatile.Read(ref _heapFullRefills);

    private long SegmentStart(long segment) => _dataStart + (segment * HeapLayout.SegmentSize);

    /// <summary>The segment that holds <paramref name="offset"/> (an offset inside the data area).</summary>
    internal long SegmentOf(long offset) => (offset - _dataStart) / HeapLayout.SegmentSize;

    private long TableOffset(long segment) => HeapLayout.SuperblockSize + (segment * sizeof(ulong));

    /// <summary>Formats a free segment for class <paramref name="cls"/> into <paramref name="cache"/> and its pool; <paramref name="antiPayload"/>: for an anti-payload, which may take the delete reserve.</summary>
    private bool TryFormatSmallSegment(ThreadCache cache, int cls, bool allowGrowth, bool antiPayload)
    {
        long segment;
        using (InterruptShield.Hold(_segmentGate))
        {
            // A stocking holds the gate while it formats: the blocks it put in the pool meanwhile come first.
            if (TryTakeBatch(cache, cls))
            {
                return true;
            }

            segment = TakeRunLocked(1, allowGrowth, antiPayload);
            if (segment < 0)
            {
                return false;
            }

            if (antiPayload)
            {
                DesignateIfReserveLocked(segment);
            }

            // The same durable format as the advancer's stocking (zeroed with unused commit words, then a new generation).
            FormatSegmentsLocked(cls, new List<long>(1) { segment });
            CountAllocatorRefill();

            long start = SegmentStart(segment);
            int blockSize = SizeClasses.BlockSizes[cls];
            int blocks = SizeClasses.BlocksPerSegment[cls];
            int toCache = Math.Min(blocks, BatchSize);

            // Lowest addresses are popped first (the cache pops from the end).
            for (int i = toCache - 1; i >= 0; i--)
            {
                cache.Blocks[cls][cache.Counts[cls]++] = start + ((long)i * blockSize);
            }

            // Still under the gate: a thread that finds no segment free after waiting for it finds these in the pool.
            if (toCache < blocks)
            {
                PushFree(cls, start, blockSize, toCache, blocks);
            }

            CountTaken(cls, toCache);
        }

        return true;
    }

    /// <summary>
    /// Under the segment gate, before anything is written into <paramref name="segments"/> (free in memory, in ascending
    /// order) for a new use: each whose durable descriptor still claims it — a small segment recovery found without a
    /// live block, an orphan continuation — gets a free descriptor of a new generation, durably (one fence for all).
    /// Otherwise a crash before the new descriptor would leave the new use's commit words under the old descriptor,
    /// which recovery reports as damage. Free descriptors (the common case) cost nothing.
    /// </summary>
    private void FreeClaimingDescriptorsLocked(List<long> segments)
    {
        var table = new WriteBackRuns(_file.Domain);
        bool any = false;
        foreach (long segment in segments)
        {
            if (HeapLayout.DescriptorRole(_table[segment]) != HeapLayout.RoleFree)
            {
                // Volatile.Write: release; no block of the segment is reachable (it is free in memory).
                Volatile.Write(ref _table[segment], HeapLayout.FreedDescriptor(_table[segment], segment));
                table.Add(TableOffset(segment), sizeof(ulong));
                any = true;
            }
        }

        if (any)
        {
            table.Flush();
            _file.Domain.FenceOwned();
        }
    }

    /// <summary>Writes the header of a large block at <paramref name="offset"/> as unused of <paramref name="generation"/> and persists it.</summary>
    private void WriteUnusedHeaderDurably(long offset, uint generation)
    {
        ulong* h = (ulong*)(_base + offset);
        h[0] = 0;
        h[1] = FormattedEpochWord(offset);
        h[2] = 0;
        h[3] = HeapLayout.UnusedWord(offset, generation);
        _file.Domain.PersistOwned(offset, HeapLayout.HeaderSize);
    }

    private void PushFree(int cls, long start, int blockSize, int from, int to)
    {
        ClassPool pool = _pools[cls];
        using (InterruptShield.Hold(pool))
        {
            for (int i = to; i > from; i -= BatchSize)
            {
                int count = Math.Min(BatchSize, i - from);
                var batch = new long[count];
                for (int j = 0; j < count; j++)
                {
                    batch[j] = start + ((long)(i - 1 - j) * blockSize);
                }

                pool.Batches.Push(batch);
                pool.BlockCount += count;
            }

            Interlocked.Increment(ref _poolPushes);
        }
    }

    private void PushFree(int cls, long[] offsets, int count) => PushFree(cls, offsets.AsSpan(0, count));

    private void PushFree(int cls, List<long> offsets) => PushFree(cls, CollectionsMarshal.AsSpan(offsets));

    private void PushFree(int cls, ReadOnlySpan<long> offsets)
    {
        ClassPool pool = _pools[cls];
        using (InterruptShield.Hold(pool))
        {
            for (int i = 0; i < offsets.Length; i += BatchSize)
            {
                pool.Batches.Push(offsets.Slice(i, Math.Min(BatchSize, offsets.Length - i)).ToArray());
                pool.BlockCount += Math.Min(BatchSize, offsets.Length - i);
            }

            Interlocked.Increment(ref _poolPushes);
        }
    }

    private bool TryAllocateLarge(int size, int typeId, long epochTag, PayloadKind kind, long uid, ThreadCache cache, out PayloadRef block)
    {
        if (size < 0 || size > MaxPayloadSize)
        {
            ThrowHelper.ThrowArgumentOutOfRange(nameof(size), $"A payload of {size} bytes does not fit this heap (at most {MaxPayloadSize}).");
        }

        long span = (HeapLayout.HeaderSize + (long)size + HeapLayout.SegmentSize - 1) / HeapLayout.SegmentSize;
        long segment;
        using InterruptShield.Scope shield = InterruptShield.Enter();
        using (InterruptShield.Hold(_segmentGate))
        {
            segment = TakeRunLocked(span, allowGrowth: true, antiPayload: false);
            if (segment < 0)
            {
                block = default;
                return false;
            }

            // The header is written durably first as unused of the new generation (see TryFormatSmallSegment; the
            // segment's durable descriptor says free meanwhile). Continuations next, start last, one fence for all: if
            // the start is not durable the continuations are orphans, which recovery treats as free; if it is,
            // recovery skips the whole span.
            FreeClaimingDescriptorsLocked([segment]);
            uint generation = HeapLayout.NextGeneration(_table[segment]);
            WriteUnusedHeaderDurably(SegmentStart(segment), generation);
            for (long s = segment + 1; s < segment + span; s++)
            {
                _table[s] = HeapLayout.Descriptor(HeapLayout.NextGeneration(_table[s]), HeapLayout.RoleLargeContinuation, 0, s);
            }

            // Volatile.Write: release; the continuation descriptors are stored before the start descriptor.
            Volatile.Write(ref _table[segment], HeapLayout.Descriptor(generation, HeapLayout.RoleLargeStart, (ulong)span, segment));
            _file.Domain.PersistOwned(TableOffset(segment), span * sizeof(ulong));
        }

        long offset = SegmentStart(segment);
        WriteHeader(offset, uid, epochTag, HeapLayout.Shape(size, typeId), kind);
        cache.LiveBlocks++;
        cache.LiveBytes += span * HeapLayout.SegmentSize;
        block = new PayloadRef(offset);
        return true;
    }

    private void FreeLarge(long segment, ulong descriptor, ThreadCache cache)
    {
        long span = HeapLayout.DescriptorPayload(descriptor);
        using InterruptShield.Scope shield = InterruptShield.Enter();
        using (InterruptShield.Hold(_segmentGate))
        {
            ReleaseSpanLocked(segment, span);
        }

        cache.LiveBlocks--;
        cache.LiveBytes -= span * HeapLayout.SegmentSize;
    }

    /// <summary>Rewrites the descriptors of a span as free (durably) and returns the segments to the pool.</summary>
    private void ReleaseSpanLocked(long segment, long span)
    {
        for (long s = segment; s < segment + span; s++)
        {
            // Volatile.Write: release; ordered after the block's free commit store by the caller.
            Volatile.Write(ref _table[s], HeapLayout.FreedDescriptor(_table[s], s));
        }

        _file.Domain.PersistOwned(TableOffset(segment), span * sizeof(ulong));
        for (long s = segment; s < segment + span; s++)
        {
            _segmentFree[s] = true;
        }

        _freeSegmentCount += span;
    }

    /// <summary>
    /// Takes <paramref name="span"/> contiguous free segments; -1 if impossible. With <paramref name="allowGrowth"/>, a
    /// heap that has none grows, and one that cannot grow gives back the segments formatted for a size class whose
    /// blocks all sit unused in that class's pool (<see cref="ReleasePooledSegmentsLocked"/>) before it gives up. Only
    /// an <paramref name="antiPayload"/> may take the delete reserve's segment (<see cref="ReservedSegmentsLocked"/>).
    /// </summary>
    private long TakeRunLocked(long span, bool allowGrowth, bool antiPayload)
    {
        long start = FindRunLocked(span, ReservedSegmentsLocked(antiPayload));
        if (start >= 0 || !allowGrowth)
        {
            return start;
        }

        // The reserve is counted again after each step: growth may reach the maximum size.
        if (TryGrowLocked(span))
        {
            start = FindRunLocked(span, ReservedSegmentsLocked(antiPayload));
        }

        if (start < 0 && ReleasePooledSegmentsLocked() != 0)
        {
            start = FindRunLocked(span, ReservedSegmentsLocked(antiPayload));
        }

        return start;
    }

    /// <summary>Takes the lowest run of <paramref name="span"/> free segments, if that leaves at least <paramref name="keep"/> free; -1 otherwise.</summary>
    private long FindRunLocked(long span, long keep)
    {
        if (_freeSegmentCount - span < keep)
        {
            return -1;
        }

        long run = 0;
        for (long s = 0; s < _segmentFree.Length; s++)
        {
            run = _segmentFree[s] ? run + 1 : 0;
            if (run == span)
            {
                long start = s - span + 1;
                for (long t = start; t <= s; t++)
                {
                    _segmentFree[t] = false;
                }

                _freeSegmentCount -= span;
                return start;
            }
        }

        return -1;
    }

    /// <summary>
    /// Under the segment gate, when no free segment is left and the heap cannot grow: a small-block segment keeps the
    /// size class it was formatted for, so a workload whose sizes changed would find the heap full while whole segments
    /// sit unused in other classes' pools. Every parked free is made durable first; then every segment whose blocks are
    /// all in its class's pool (none in a thread's cache, none allocated) leaves the pool and becomes free again: its descriptor, with a new generation,
    /// is written back and fenced before the segment can be taken, so after a crash recovery finds it free or finds it
    /// formatted with every block free, never a block of both uses.
    /// </summary>
    /// <returns>How many segments became free.</returns>
    private long ReleasePooledSegmentsLocked()
    {
        // Parked frees first (a buffered heap parks its frees for the sweep): made durable, their blocks join the pools.
        // (Lock order: the segment gate, then the sweep's. No code of the heap takes them the other way round. The flush
        // waits, under the segment gate, for sweeps in flight on other threads, which take no gate but a pool's; the
        // test hook AfterSweepMarkedForTesting runs inside a sweep and must not take the segment gate.)
        if (_sweepFailure is not null)
        {
            // An earlier sweep failed: no free can be made durable any more (fail-stop); the allocation fails as before.
            // (A sweep that fails in the flush below throws: an I/O fault the caller must see.)
            return 0;
        }

        FlushPendingFrees();

        // This thread's own cache too (up to 64 blocks per class): a workload of large small blocks keeps a whole
        // segment's worth there, and those of threads that have exited. Other threads' caches are theirs; their
        // segments stay. (Lock order: the segment gate, then the caches' gate, then a pool's.)
        ReleaseExitedThreadCaches();
        ThreadCache own = _caches.Value!;

        // With the frees it holds until they are durable (a raw heap's: see Free), made durable now.
        ReleaseHeldFrees(own);
        for (int cls = 0; cls < SizeClasses.Count; cls++)
        {
            if (own.Counts[cls] != 0)
            {
                PushFree(cls, own.Blocks[cls], own.Counts[cls]);
                own.Counts[cls] = 0;
            }
        }

        // A heap full of live data fails every allocation here: scan the pools again only once something joined them.
        long pushes = Volatile.Read(ref _poolPushes);
        if (pushes == _poolPushesAtFruitlessRelease)
        {
            return 0;
        }

        var released = new List<long>();
        for (int cls = 0; cls < SizeClasses.Count; cls++)
        {
            int perSegment = SizeClasses.BlocksPerSegment[cls];
            ClassPool pool = _pools[cls];
            using (InterruptShield.Hold(pool))
            {
                if (pool.BlockCount < perSegment)
                {
                    continue;
                }

                var pooled = new Dictionary<long, int>();
                foreach (long[] batch in pool.Batches)
                {
                    foreach (long offset in batch)
                    {
                        long segment = SegmentOf(offset);
                        pooled[segment] = pooled.GetValueOrDefault(segment) + 1;
                    }
                }

                var whole = new HashSet<long>();
                foreach ((long segment, int count) in pooled)
                {
                    // Not the delete reserve's segment: it stays formatted for anti-payloads (see PersistentHeap.DeleteReserve.cs).
                    if (count == perSegment && segment != _reserveSegment)
                    {
                        whole.Add(segment);
                    }
                }

                if (whole.Count == 0)
                {
                    continue;
                }

                // The pool without those segments' blocks, in the same order (Stack enumerates from the top).
                long[][] batches = pool.Batches.ToArray();
                var kept = new List<long>((int)pool.BlockCount);
                for (int b = batches.Length - 1; b >= 0; b--)
                {
                    foreach (long offset in batches[b])
                    {
                        if (!whole.Contains(SegmentOf(offset)))
                        {
                            kept.Add(offset);
                        }
                    }
                }

                // (The broken control keeps the pool as it was.)
                if ((_faults & HeapFaults.ReleaseSegmentsLeavingBlocksPooled) == 0)
                {
                    pool.Batches.Clear();
                    pool.BlockCount = 0;
                    PushFree(cls, kept);
                }

                released.AddRange(whole);
            }
        }

        if (released.Count == 0)
        {
            _poolPushesAtFruitlessRelease = pushes;
            return 0;
        }

        // In address order: through the page cache the descriptors merge into one run.
        released.Sort();
        var table = new WriteBackRuns(_file.Domain);
        foreach (long segment in released)
        {
            ulong descriptor = _table[segment];
            int cls = (int)HeapLayout.DescriptorPayload(descriptor);
            _overheadBytes -= SizeClasses.SegmentOverhead(cls);

            // Volatile.Write: release; no block of the segment is reachable any more (it left the pool under its lock).
            Volatile.Write(ref _table[segment], HeapLayout.FreedDescriptor(descriptor, segment));
            table.Add(TableOffset(segment), sizeof(ulong));
        }

        try
        {
            table.Flush();
            _file.Domain.FenceOwned();
        }
        finally
        {
            // Free in memory whatever the write-back did: the blocks left the pools. If it failed, the domain is
            // fail-stop (no later write-back reaches the file), and the file keeps the segments formatted and their
            // blocks free, which recovery reads back as such.
            foreach (long segment in released)
            {
                _segmentFree[segment] = true;
            }

            _freeSegmentCount += released.Count;
            Volatile.Write(ref _releasedSegments, _releasedSegments + released.Count);
        }

        return released.Count;
    }

    private bool TryGrowLocked(long span)
    {
        long current = _segmentFree.Length;

        // Doubling, clipped to what the domain can reach (an open's MaxSize may cap it below the recorded maximum: past
        // it every growth failed the doubling and fell back to one span at a time).
        long reachable = Math.Min(_file.MaxSegments, (_file.Domain.Capacity - _file.DataStart) / HeapLayout.SegmentSize);
        long doubled = Math.Min(reachable, Math.Max(current * 2, current + span));
        if (doubled <= current)
        {
            // At what the domain can reach: nothing to grow (TryGrow would report success without growing).
            return false;
        }

        // The last try, one segment, fits the spare an earlier growth left (HeapFile.TryGrow): it becomes the reserve.
        if (!_file.TryGrow(doubled) && !_file.TryGrow(current + span) && (span == 1 || !_file.TryGrow(current + 1)))
        {
            // The medium refused (a file size limit, a full file system): the heap counts as unable to grow until a
            // later growth succeeds (freed space, a raised limit). With no free segment to keep as the delete reserve,
            // one of the anti-payloads' class is designated, as recovery does for a full heap that cannot grow.
            _file.RefuseGrowth();
            DesignateReserveWithoutFreeSegmentLocked();
            return false;
        }

        long grown = _file.SegmentCount;
        bool[] free = new bool[grown];
        Array.Copy(_segmentFree, free, current);
        for (long s = current; s < grown; s++)
        {
            free[s] = true;
        }

        _segmentFree = free;
        _freeSegmentCount += grown - current;

        // Volatile.Write: release; Locate reads the count with acquire, and blocks in new segments are only handed
        // out after this store anyway.
        Volatile.Write(ref _segmentCount, grown);
        return true;
    }
}
