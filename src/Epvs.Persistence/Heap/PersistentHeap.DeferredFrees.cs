using System;
using System.Collections.Generic;
using System.Numerics;
using System.Runtime.InteropServices;

namespace Epvs.Persistence;

/// <summary>
/// Deferred frees for a <see cref="BufferedDurableHeap"/>: a freed small block is parked, untouched, with the other
/// pending frees of its segment; a sweep later takes the segments with the most pending frees, marks those free, writes
/// them back, fences, and only then hands the blocks out again, in address order.
/// </summary>
/// <remarks>
/// <para>Why. A version's frees fall on random pages of the heap. Writing each version's frees back as they happen costs
/// one cache-line flush or one dirty page (and, through the page cache, a write-protect fault) per free, every version;
/// swept densest segment first, each page is written once for all the frees it collected meanwhile, and the blocks
/// handed out next lie together, so a version's new payloads fill a few runs of pages instead of one page each.</para>
/// <para>Safety. A pending block keeps its durable image (its old, sealed payload) until the sweep writes its free
/// back, and is never handed out before that free is durable (the invariant reclamation had before: a reuse never
/// reaches the file over an old seal). Its replacement is durable already, so after a crash recovery finds both copies
/// of the uid and keeps the newer. An anti-payload may be freed only once every older copy of its uid is durably free:
/// <see cref="FlushPendingFrees"/> (all of them) comes first.</para>
/// <para>Threads. Guarded by <see cref="_pendingGate"/>; the write-back and fence run under it (slow path only: the
/// advancer each cycle, an allocating thread only when no block is ready and no free segment is left, before it
/// grows the file, and under the segment gate when the heap cannot grow and gives segments back to the free list;
/// lock order: the segment gate, then this one).</para>
/// </remarks>
public sealed unsafe partial class PersistentHeap
{
    private readonly object _pendingGate = new();
    private List<long>?[] _pendingBySegment = Array.Empty<List<long>?>();
    private readonly long[] _pendingByClass = new long[SizeClasses.Count];
    private long _pendingBlocks;
    private long _pendingBytes;

    /// <summary>Why a sweep failed after it had taken blocks off the pending lists; every later sweep then throws (fail-stop).</summary>
    private Exception? _sweepFailure;

    /// <summary>Test hook: runs inside a sweep after its frees are marked and before they are written back (the window in which an early reuse would race the free to the file). May allocate from the pools only when they have blocks (an allocation that needs a segment takes the segment gate, which a releasing thread holds while it waits for this sweep); must not sweep or flush (it runs under the sweep's lock).</summary>
    internal Action? AfterSweepMarkedForTesting { get; set; }

    /// <summary>Small blocks freed but parked for the sweep: not marked free yet, not handed out (approximate while the advancer runs).</summary>
    internal long PendingFreeBlocks => System.Threading.Volatile.Read(ref _pendingBlocks);

    /// <summary>Bytes of the blocks parked for the sweep (approximate while the advancer runs).</summary>
    internal long PendingFreeBytes => System.Threading.Volatile.Read(ref _pendingBytes);

    /// <summary>
    /// Frees the blocks at <paramref name="offsets"/>: a small block is parked for the sweep (<see cref="SweepPendingFrees(long)"/>),
    /// which marks it free, makes the free durable and hands it out again; a large block is left to the caller.
    /// </summary>
    /// <param name="offsets">Allocated blocks, none freed yet.</param>
    /// <param name="count">How many of <paramref name="offsets"/> to free.</param>
    /// <param name="large">Receives the large blocks, left allocated, for the caller to free the eager way (mark, write back, fence, release).</param>
    internal void DeferFrees(long[] offsets, int count, List<long> large)
    {
        _file.EnterOperation();
        try
        {
            ThreadCache cache = _caches.Value!;
            lock (_pendingGate)
            {
                for (int i = 0; i < count; i++)
                {
                    (long segment, ulong descriptor) = Locate(new PayloadRef(offsets[i]));
                    if (HeapLayout.DescriptorRole(descriptor) != HeapLayout.RoleSmall)
                    {
                        large.Add(offsets[i]);
                        continue;
                    }

                    int cls = (int)HeapLayout.DescriptorPayload(descriptor);
                    int blockSize = SizeClasses.BlockSizes[cls];
                    cache.LiveBlocks--;
                    cache.LiveBytes -= blockSize;
                    if (segment >= _pendingBySegment.Length)
                    {
                        Array.Resize(ref _pendingBySegment, (int)Math.Max(segment + 1, _pendingBySegment.Length * 2L));
                    }

                    (_pendingBySegment[segment] ??= new List<long>()).Add(offsets[i]);
                    // Volatile.Write: the counters are read without the lock (statistics, the refill's check); atomicity only.
                    System.Threading.Volatile.Write(ref _pendingByClass[cls], _pendingByClass[cls] + 1);
                    System.Threading.Volatile.Write(ref _pendingBlocks, _pendingBlocks + 1);
                    System.Threading.Volatile.Write(ref _pendingBytes, _pendingBytes + blockSize);
                }
            }
        }
        finally
        {
            _file.ExitOperation();
        }
    }

    /// <summary>
    /// Makes the pending frees of the densest segments durable and hands their blocks out (in address order), until at
    /// least <paramref name="minimumBlocks"/> blocks were handed out (<see cref="long.MaxValue"/>: every pending free).
    /// </summary>
    /// <returns>How many blocks were handed out.</returns>
    internal long SweepPendingFrees(long minimumBlocks) => SweepPendingFrees(minimumBlocks, -1);

    /// <summary>Like <see cref="SweepPendingFrees(long)"/>, for the segments of class <paramref name="onlyClass"/> only (-1: every class).</summary>
    internal long SweepPendingFrees(long minimumBlocks, int onlyClass)
    {
        _file.EnterOperation();
        try
        {
            lock (_pendingGate)
            {
                return SweepLocked(minimumBlocks, onlyClass);
            }
        }
        finally
        {
            _file.ExitOperation();
        }
    }

    /// <summary>
    /// An allocating thread found no block of class <paramref name="cls"/> ready: if enough of that class are parked,
    /// sweeps them (densest segments first) rather than take a free segment for the class, and refills the cache. A
    /// thread that waited for another's sweep takes that sweep's blocks instead of sweeping again.
    /// </summary>
    private bool TrySweepForRefill(ThreadCache cache, int cls)
    {
        if (System.Threading.Volatile.Read(ref _pendingByClass[cls]) < 2 * BatchSize)
        {
            return false;
        }

        _file.EnterOperation();
        try
        {
            lock (_pendingGate)
            {
                if (TryTakeBatch(cache, cls))
                {
                    return true;
                }

                SweepLocked(8 * BatchSize, cls);
            }
        }
        finally
        {
            _file.ExitOperation();
        }

        return TryTakeBatch(cache, cls);
    }

    /// <summary>Makes every pending free durable and hands the blocks out (before an anti-payload is freed, and at a clean shutdown).</summary>
    internal void FlushPendingFrees() => SweepPendingFrees(long.MaxValue);

    private long SweepLocked(long minimumBlocks, int onlyClass)
    {
        if (_sweepFailure is { } failure)
        {
            // The failed sweep's blocks are marked free in memory but their frees may not be durable: freeing anything
            // that relies on them (an anti-payload) could bring a deleted key back after a crash. Stop instead.
            throw new System.IO.IOException($"An earlier sweep of deferred frees failed ({failure.Message}); no more frees can be made durable.", failure);
        }

        if (_pendingBlocks == 0)
        {
            return 0;
        }

        // The densest segments first (most blocks per page written back), then in address order for the write-back.
        bool all = minimumBlocks == long.MaxValue;
        var candidates = new List<(int Count, long Segment)>();
        for (long segment = 0; segment < _pendingBySegment.Length; segment++)
        {
            if (_pendingBySegment[segment] is { Count: > 0 } list && (onlyClass < 0 || (int)HeapLayout.DescriptorPayload(_table[segment]) == onlyClass))
            {
                candidates.Add((list.Count, segment));
            }
        }

        if (!all)
        {
            candidates.Sort((a, b) => b.Count.CompareTo(a.Count));
            long take = 0;
            int chosen = 0;
            while (chosen < candidates.Count && take < minimumBlocks)
            {
                take += candidates[chosen++].Count;
            }

            candidates.RemoveRange(chosen, candidates.Count - chosen);
            candidates.Sort((a, b) => a.Segment.CompareTo(b.Segment));
        }

        // Detached first: a callback below (the test hook) may allocate, and an allocation may sweep. From here on a
        // failure leaves blocks taken but not handed out: it stops every later sweep (see above).
        var swept = new List<(long Segment, List<long> Blocks)>(candidates.Count);
        long handedOut = 0;
        try
        {
            foreach ((_, long segment) in candidates)
            {
                List<long> blocks = _pendingBySegment[segment]!;
                _pendingBySegment[segment] = null;
                int cls = (int)HeapLayout.DescriptorPayload(_table[segment]);
                // Volatile.Write: as in DeferFrees (read without the lock; atomicity only).
                System.Threading.Volatile.Write(ref _pendingByClass[cls], _pendingByClass[cls] - blocks.Count);
                System.Threading.Volatile.Write(ref _pendingBlocks, _pendingBlocks - blocks.Count);
                System.Threading.Volatile.Write(ref _pendingBytes, _pendingBytes - ((long)blocks.Count * SizeClasses.BlockSizes[cls]));
                PutInAddressOrder(segment, blocks);
                swept.Add((segment, blocks));
                handedOut += blocks.Count;
            }

            return MarkWriteBackAndHandOut(swept, handedOut);
        }
        catch (Exception e)
        {
            _sweepFailure = e;
            throw;
        }
    }

    /// <summary>
    /// Puts a segment's parked blocks in address order with a bitmap of block indexes (one pass over the blocks and one
    /// over the bitmap) instead of a comparison sort: the blocks of a small segment sit at fixed strides.
    /// </summary>
    /// <exception cref="InvalidOperationException">A block was parked twice (a double free).</exception>
    private void PutInAddressOrder(long segment, List<long> blocks)
    {
        int cls = (int)HeapLayout.DescriptorPayload(_table[segment]);
        long blockSize = SizeClasses.BlockSizes[cls];
        long start = SegmentStart(segment);
        Span<ulong> present = stackalloc ulong[(SizeClasses.BlocksPerSegment[cls] + 63) / 64];
        foreach (long offset in blocks)
        {
            long index = SizeClasses.BlockIndex((uint)(offset - start), cls);
            present[(int)(index >> 6)] |= 1UL << (int)(index & 63);
        }

        int parked = blocks.Count;
        blocks.Clear();
        for (int word = 0; word < present.Length; word++)
        {
            for (ulong bits = present[word]; bits != 0; bits &= bits - 1)
            {
                blocks.Add(start + (((word * 64L) + BitOperations.TrailingZeroCount(bits)) * blockSize));
            }
        }

        if (blocks.Count != parked)
        {
            ThrowHelper.ThrowInvalidOperation($"{parked - blocks.Count} block(s) of segment {segment} were parked for the sweep twice (a double free).");
        }
    }

    private long MarkWriteBackAndHandOut(List<(long Segment, List<long> Blocks)> swept, long handedOut)
    {
        foreach ((_, List<long> blocks) in swept)
        {
            ReadOnlySpan<long> offsets = CollectionsMarshal.AsSpan(blocks);
            for (int i = 0; i < offsets.Length; i++)
            {
                // Each mark is a compare-and-swap, whose fence would wait for the next block's cache miss: the blocks
                // a few places ahead are prefetched (a prefetch is not held back by the fence), so the misses overlap.
                if (i + PrefetchDistance < offsets.Length)
                {
                    Prefetch(_base + offsets[i + PrefetchDistance]);
                }

                // Marked only now: through the page cache, the first store to a page written back earlier takes a
                // write-protect fault, so marking a segment's frees together costs one per page, not one per free.
                MarkFreeCore(new PayloadRef(offsets[i]));
            }
        }

        // (The broken control hands the blocks out before their frees are durable.)
        bool early = (_faults & HeapFaults.HandOutSweptFreesEarly) != 0;
        if (early)
        {
            HandOut(swept);
        }

        AfterSweepMarkedForTesting?.Invoke();
        // Segments are in address order, so through the page cache the headers merge into runs of pages.
        var runs = new WriteBackRuns(_file.Domain);
        foreach ((_, List<long> blocks) in swept)
        {
            foreach (long offset in blocks)
            {
                runs.Add(offset, HeapLayout.HeaderSize);
            }
        }

        runs.Flush();
        _file.Domain.Fence();
        if (!early)
        {
            HandOut(swept);
        }

        return handedOut;
    }

    private void HandOut(List<(long Segment, List<long> Blocks)> swept)
    {
        foreach ((long segment, List<long> blocks) in swept)
        {
            // Pushed highest first: the pool pops the lowest addresses first.
            blocks.Reverse();
            PushFree((int)HeapLayout.DescriptorPayload(_table[segment]), blocks);
        }
    }
}
