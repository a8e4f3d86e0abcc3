using System.Collections.Generic;
using System.Runtime.CompilerServices;
using System.Threading;

namespace Epvs.Persistence;

// The delete reserve: room that only anti-payloads (PayloadKind.Delete allocations of the smallest size
// class, what DurableOperation.Delete(PayloadRef) writes) may take once the heap cannot grow. Deleting is
// the only way to make room in a full heap, and a delete needs a block for its anti-payload: without a reserve, a heap
// that cannot grow, once full, refused every delete for ever (after Syncs and reopens too).
// Only for an owner whose deletes write anti-payloads (PersistentHeapOptions.KeepsDeleteReserve: a
// buffered heap in Buffered or Strict mode); a raw heap frees with Free, and a transient heap writes none.
// The rule, under the segment gate: while the heap cannot grow (HeapFile.CanGrowBeyond: at its
// maximum size, a domain that cannot grow, or a medium that refused the last growth — each growth, and each open, keeps a
// spare segment of medium beyond the heap for that moment, see HeapFile.TryGrow and
// HeapFile.EnsureGrowthSpare) and no reserve segment is designated, an ordinary allocation (and the
// stocker) leaves the last free segment free. An anti-payload that finds no block of its class takes it, and the
// segment becomes the reserve segment: formatted for the smallest class like any other, but a block of it that an
// ordinary allocation pops (from its cache, wherever the block came from: the format, a pool, a reclaimed
// anti-payload's free) is set aside for anti-payloads instead. Anti-payloads take any block, and the set-aside ones
// once their class has none left. So the reserve holds up to a segment's worth of anti-payloads (1,365) beyond the
// free blocks of their class; it refills as the deletes are reclaimed, two versions after them, together with the
// payloads they delete.
// All of it is transient, like the rest of the allocator's state. Recovery rebuilds it: a heap that opens unable
// to grow and with no free segment designates the segment of the smallest class with the most free blocks (the
// former reserve segment, typically); one that opens with a free segment keeps the rule above. The designation lasts
// until the heap closes: the reserve segment is never released to other classes (ReleasePooledSegmentsLocked).
public sealed unsafe partial class PersistentHeap
{
    /// <summary>The size class of anti-payloads (0-byte payloads): the only class the reserve serves.</summary>
    private const int AntiPayloadClass = 0;

    /// <summary>What <see cref="_reserveStart"/> holds while no segment is designated: no offset is within a segment of it.</summary>
    private const long NoReserveStart = long.MinValue / 2;

    /// <summary>Whether this heap keeps a delete reserve at all (<see cref="PersistentHeapOptions.KeepsDeleteReserve"/>).</summary>
    private readonly bool _keepsDeleteReserve;

    /// <summary>The designated reserve segment, or -1 (under <see cref="_segmentGate"/>).</summary>
    private long _reserveSegment = -1;

    /// <summary>The offset of the reserve segment's first block, or <see cref="NoReserveStart"/>; read by allocating threads.</summary>
    private long _reserveStart = NoReserveStart;

    /// <summary>Free blocks of the reserve segment set aside for anti-payloads (guarded by locking the instance).</summary>
    private readonly Stack<long> _reserveBlocks = new();

    /// <summary>The designated reserve segment, or -1 (tests).</summary>
    internal long ReserveSegmentForTesting
    {
        get
        {
            using (InterruptShield.Hold(_segmentGate))
            {
                return _reserveSegment;
            }
        }
    }

    /// <summary>Free blocks set aside for anti-payloads (tests).</summary>
    internal int ReserveBlocksForTesting
    {
        get
        {
            using (InterruptShield.Hold(_reserveBlocks))
            {
                return _reserveBlocks.Count;
            }
        }
    }

    /// <summary>Whether an allocation of <paramref name="kind"/> in class <paramref name="cls"/> is an anti-payload, which may take the reserve.</summary>
    private static bool IsAntiPayload(PayloadKind kind, int cls) => kind == PayloadKind.Delete && cls == AntiPayloadClass;

    /// <summary>
    /// Under the segment gate: how many free segments an allocation must leave free — one for an ordinary allocation
    /// while the heap cannot grow and no reserve segment is designated (the reserve), none otherwise.
    /// </summary>
    private long ReservedSegmentsLocked(bool antiPayload) =>
        !_keepsDeleteReserve || antiPayload || _reserveSegment >= 0 || _file.CanGrowBeyond(_segmentFree.Length) ? 0 : 1;

    /// <summary>
    /// Under the segment gate, right after an anti-payload took <paramref name="segment"/> (free, not yet formatted):
    /// if it was the reserve (the heap cannot grow, no segment is designated, none is left free), it becomes the
    /// reserve segment — before any of its blocks is published (to the pool, under its lock, or a cache).
    /// </summary>
    private void DesignateIfReserveLocked(long segment)
    {
        if (_keepsDeleteReserve && _reserveSegment < 0 && _freeSegmentCount == 0 && !_file.CanGrowBeyond(_segmentFree.Length))
        {
            DesignateLocked(segment);
        }
    }

    private void DesignateLocked(long segment)
    {
        _reserveSegment = segment;

        // Volatile.Write: release; an allocating thread gets a block of the segment only through a pool's lock or its
        // own cache, after this store (the blocks are published after it), so it tests the block against this start.
        Volatile.Write(ref _reserveStart, SegmentStart(segment));
    }

    /// <summary>Whether the block at <paramref name="offset"/> belongs to the reserve segment.</summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    private bool InReserve(long offset) =>
        // Volatile.Read: acquire; pairs with the release in DesignateLocked.
        (ulong)(offset - Volatile.Read(ref _reserveStart)) < (ulong)HeapLayout.SegmentSize;

    /// <summary>Sets a free block of the reserve segment aside for anti-payloads (an ordinary allocation popped it).</summary>
    private void SetAside(long offset)
    {
        // Popped from the thread's cache already: an interrupt here would lose the block until the next open.
        using InterruptShield.Scope shield = InterruptShield.Enter();
        using (InterruptShield.Hold(_reserveBlocks))
        {
            _reserveBlocks.Push(offset);
        }
    }

    /// <summary>Moves one set-aside block into <paramref name="cache"/> (whose anti-payload class is empty), if there is one.</summary>
    private bool TryTakeReserveBlock(ThreadCache cache)
    {
        using (InterruptShield.Hold(_reserveBlocks))
        {
            if (_reserveBlocks.Count == 0)
            {
                return false;
            }

            cache.Blocks[AntiPayloadClass][cache.Counts[AntiPayloadClass]++] = _reserveBlocks.Pop();
            return true;
        }
    }

    /// <summary>
    /// Under the segment gate, at a clean shutdown that found no free segment for the saved state: the reserve segment
    /// stops being one (its set-aside blocks go back to their class's pool), so that it can be released like any segment
    /// whose blocks are all free. Recovery designates a reserve again at the next open.
    /// </summary>
    private void ReleaseReserveDesignationLocked()
    {
        if (_reserveSegment < 0)
        {
            return;
        }

        long[] setAside;
        using (InterruptShield.Hold(_reserveBlocks))
        {
            setAside = _reserveBlocks.ToArray();
            _reserveBlocks.Clear();
        }

        _reserveSegment = -1;
        Volatile.Write(ref _reserveStart, NoReserveStart); // release: no block tests as the reserve's from here on
        PushFree(AntiPayloadClass, setAside);
    }

    /// <summary>The free blocks set aside in the reserve (a copy; the saved state counts them free).</summary>
    private long[] ReserveBlocksSnapshot()
    {
        using (InterruptShield.Hold(_reserveBlocks))
        {
            return _reserveBlocks.ToArray();
        }
    }

    /// <summary>Free bytes set aside in the reserve (statistics).</summary>
    private long ReserveFreeBytes()
    {
        using (InterruptShield.Hold(_reserveBlocks))
        {
            return (long)_reserveBlocks.Count * SizeClasses.BlockSizes[AntiPayloadClass];
        }
    }

    /// <summary>
    /// After recovery rebuilt the pools and freed what it drops (for a buffered heap, once its own recovery has freed the
    /// superseded and cancelled payloads: the former reserve's anti-payloads are among them), before the heap is
    /// published: a heap that cannot grow and has no free segment left designates the segment of the anti-payloads' class
    /// with the most free blocks in the pool (any such segment if none has one: its blocks join the reserve as they are
    /// freed). Without a segment of that class (a file full of other classes, written before the reserve existed) there
    /// is no reserve until one becomes free. Designated before the frees, it took a segment full of live payloads while
    /// the former reserve's blocks, freed just after, went to ordinary allocations: once full again, the heap refused
    /// every delete for good.
    /// </summary>
    internal void DesignateReserveAfterRecovery()
    {
        if (_keepsDeleteReserve)
        {
            _file.EnsureGrowthSpare();
        }

        using (InterruptShield.Hold(_segmentGate))
        {
            DesignateReserveWithoutFreeSegmentLocked();
        }
    }

    /// <summary>
    /// Under the segment gate: if the heap keeps a delete reserve, cannot grow, has no free segment and no reserve
    /// segment, designates the segment of the anti-payloads' class with the most free blocks in the pool (see
    /// <see cref="DesignateReserveAfterRecovery"/>; also when the medium refuses a growth at run time).
    /// </summary>
    private void DesignateReserveWithoutFreeSegmentLocked()
    {
        if (!_keepsDeleteReserve || _reserveSegment >= 0 || _freeSegmentCount != 0 || _file.CanGrowBeyond(_segmentFree.Length))
        {
            return;
        }

        var pooled = new Dictionary<long, int>();
        ClassPool pool = _pools[AntiPayloadClass];
        using (InterruptShield.Hold(pool))
        {
            foreach (long[] batch in pool.Batches)
            {
                foreach (long offset in batch)
                {
                    long segment = SegmentOf(offset);
                    pooled[segment] = pooled.GetValueOrDefault(segment) + 1;
                }
            }
        }

        long best = -1;
        int bestCount = -1;
        for (long s = 0; s < _segmentFree.Length; s++)
        {
            ulong descriptor = _table[s];
            if (HeapLayout.DescriptorRole(descriptor) == HeapLayout.RoleSmall && (int)HeapLayout.DescriptorPayload(descriptor) == AntiPayloadClass && pooled.GetValueOrDefault(s) > bestCount)
            {
                best = s;
                bestCount = pooled.GetValueOrDefault(s);
            }
        }

        if (best >= 0)
        {
            DesignateLocked(best);
        }
    }
}
