using System;
using System.Collections.Generic;
using System.Runtime.InteropServices;
using System.Threading;

namespace Epvs.Persistence;

/// <summary>Segment management: formatting small-block segments, large blocks, growth. Slow paths, under <see cref="_segmentGate"/>.</summary>
public sealed unsafe partial class PersistentHeap
{
    private readonly object _segmentGate = new();
    private bool[] _segmentFree;
    private long _freeSegmentCount;
    private long _overheadBytes;
    private long _segmentCount;
    private long _recoveredLiveBlocks;
    private long _recoveredLiveBytes;

    private long SegmentStart(long segment) => _dataStart + (segment * HeapLayout.SegmentSize);

    private long TableOffset(long segment) => HeapLayout.SuperblockSize + (segment * sizeof(ulong));

    private bool TryFormatSmallSegment(ThreadCache cache, int cls, bool allowGrowth = true)
    {
        long segment;
        lock (_segmentGate)
        {
            segment = TakeRunLocked(1, allowGrowth);
            if (segment < 0)
            {
                return false;
            }

            // The same durable format as the advancer's stocking (zeroed, then a new generation).
            FormatSegmentsLocked(cls, new List<long>(1) { segment });

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

    private void ZeroDurably(long offset, long length)
    {
        System.Runtime.InteropServices.NativeMemory.Clear(_base + offset, (nuint)length);
        _file.Domain.Persist(offset, length);
    }

    private void PushFree(int cls, long start, int blockSize, int from, int to)
    {
        ClassPool pool = _pools[cls];
        lock (pool)
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
        }
    }

    private void PushFree(int cls, long[] offsets, int count) => PushFree(cls, offsets.AsSpan(0, count));

    private void PushFree(int cls, List<long> offsets) => PushFree(cls, CollectionsMarshal.AsSpan(offsets));

    private void PushFree(int cls, ReadOnlySpan<long> offsets)
    {
        ClassPool pool = _pools[cls];
        lock (pool)
        {
            for (int i = 0; i < offsets.Length; i += BatchSize)
            {
                pool.Batches.Push(offsets.Slice(i, Math.Min(BatchSize, offsets.Length - i)).ToArray());
                pool.BlockCount += Math.Min(BatchSize, offsets.Length - i);
            }
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
        lock (_segmentGate)
        {
            segment = TakeRunLocked(span);
            if (segment < 0)
            {
                block = default;
                return false;
            }

            // The header position is zeroed durably first (see TryFormatSmallSegment). Continuations next, start last,
            // one fence for all: if the start is not durable the continuations
            // are orphans, which recovery treats as free; if it is, recovery skips the whole span.
            ZeroDurably(SegmentStart(segment), HeapLayout.HeaderSize);
            for (long s = segment + 1; s < segment + span; s++)
            {
                _table[s] = HeapLayout.Descriptor(HeapLayout.DescriptorGeneration(_table[s]) + 1, HeapLayout.RoleLargeContinuation, 0);
            }

            // Volatile.Write: release; the continuation descriptors are stored before the start descriptor.
            Volatile.Write(ref _table[segment], HeapLayout.Descriptor(HeapLayout.DescriptorGeneration(_table[segment]) + 1, HeapLayout.RoleLargeStart, (ulong)span));
            _file.Domain.Persist(TableOffset(segment), span * sizeof(ulong));
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
        lock (_segmentGate)
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
            Volatile.Write(ref _table[s], HeapLayout.Descriptor(HeapLayout.DescriptorGeneration(_table[s]) + 1, HeapLayout.RoleFree, 0));
        }

        _file.Domain.Persist(TableOffset(segment), span * sizeof(ulong));
        for (long s = segment; s < segment + span; s++)
        {
            _segmentFree[s] = true;
        }

        _freeSegmentCount += span;
    }

    /// <summary>Takes <paramref name="span"/> contiguous free segments (growing the heap if needed); -1 if impossible.</summary>
    private long TakeRunLocked(long span, bool allowGrowth = true)
    {
        for (int attempt = 0; attempt < 2; attempt++)
        {
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

            if (attempt == 0 && (!allowGrowth || !TryGrowLocked(span)))
            {
                return -1;
            }
        }

        return -1;
    }

    private bool TryGrowLocked(long span)
    {
        long current = _segmentFree.Length;
        long doubled = Math.Min(_file.MaxSegments, Math.Max(current * 2, current + span));
        if (!_file.TryGrow(doubled) && !_file.TryGrow(current + span))
        {
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
