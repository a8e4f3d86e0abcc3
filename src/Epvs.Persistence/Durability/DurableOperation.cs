using System;
using System.Runtime.CompilerServices;

namespace Epvs.Persistence;

/// <summary>
/// One operation on a <see cref="BufferedDurableHeap"/>: an EPVS protected region of one version, through which the
/// operation creates, replaces and deletes payloads, all tagged with <see cref="Version"/>. Begin with
/// <see cref="BufferedDurableHeap.BeginOperation"/>; end with <see cref="Dispose"/> on the same thread.
/// </summary>
/// <remarks>
/// <para>Rules (Montage's): write a payload's bytes only through the reference this operation returned for it
/// (<see cref="Allocate(int, int)"/> or <see cref="Replace(PayloadRef, int)"/>), never into a payload of an older
/// version; publish a reference to other threads only under the structure's own synchronization. Payloads are
/// read through <see cref="GetPayload(PayloadRef)"/> while the operation lasts; a payload replaced or deleted by
/// another operation stays readable until every operation that might hold it has ended.</para>
/// <para>A ref struct: it cannot escape the thread, be boxed, or live across an <c>await</c>.</para>
/// </remarks>
public ref struct DurableOperation
{
    private BufferedDurableHeap? _heap;
    private readonly ThreadBuffers? _buffers;

    /// <summary>This operation's serial number on its thread (see <see cref="ThreadBuffers.OpenOperation"/>).</summary>
    private readonly long _serial;

    internal DurableOperation(BufferedDurableHeap heap, ThreadBuffers buffers, long version, long serial)
    {
        _heap = heap;
        _buffers = buffers;
        Version = version;
        _serial = serial;
    }

    /// <summary>The version this operation observes; every payload it writes carries it as its epoch tag.</summary>
    public readonly long Version { get; }

    /// <summary>Whether the operation is still open (not default, not disposed).</summary>
    public readonly bool IsActive => _heap is not null;

    /// <summary>Allocates a new payload (a new uid) tagged with <see cref="Version"/>; write its bytes with <see cref="GetPayload(PayloadRef)"/>.</summary>
    /// <param name="size">Payload size in bytes.</param>
    /// <param name="typeId">The structure's type id (what <see cref="BufferedDurableHeap.TakeRecoveredPayloads(int)"/> groups by),
    /// in [0, 2^24): the ids above belong to the library's structures (their kind is in the high bits), whose recovery
    /// would otherwise take such a payload for one of theirs.</param>
    /// <returns>The new payload.</returns>
    /// <exception cref="ArgumentOutOfRangeException"><paramref name="typeId"/> is not in [0, 2^24), or <paramref name="size"/>
    /// is negative or larger than <see cref="PersistentHeap.MaxPayloadSize"/>.</exception>
    /// <exception cref="InvalidOperationException">The operation has ended.</exception>
    /// <exception cref="InsufficientMemoryException">The heap is full.</exception>
    public readonly PayloadRef Allocate(int size, int typeId)
    {
        if ((uint)typeId >= StructureKind.TypeIdLimit)
        {
            ThrowHelper.ThrowArgumentOutOfRange(nameof(typeId), $"A payload's type id must be in [0, {StructureKind.TypeIdLimit}); {typeId} is not (the ids above belong to the library's structures).");
        }

        return AllocateTyped(size, typeId);
    }

    /// <summary><see cref="Allocate(int, int)"/> for the library's structures, whose type ids carry their kind in the high bits.</summary>
    internal readonly PayloadRef AllocateTyped(int size, int typeId)
    {
        BufferedDurableHeap heap = InsideHeap;
        _buffers!.EnsureRoom(ThreadBuffers.Slot(Version));
        PayloadRef block = heap.Allocator.AllocateInOperation(AllocatorCache(heap), size, typeId, Version, PayloadKind.Alloc, 0);
        heap.Track(_buffers!, Version, block);
        return block;
    }

    /// <summary>
    /// Returns the payload to write the new contents of <paramref name="current"/> into: <paramref name="current"/>
    /// itself when it was written in this version and keeps its size (update in place), otherwise a copy with the
    /// same uid and bytes (up to <paramref name="newSize"/>) tagged with <see cref="Version"/>; the old payload is
    /// then reclaimed two versions later. A same-version payload whose size changes is deleted (anti-payload) and
    /// replaced by a new uid.
    /// </summary>
    /// <param name="current">The payload being updated (allocated, not yet replaced or deleted).</param>
    /// <param name="newSize">The payload's new size in bytes.</param>
    /// <returns>The payload that now holds the value; store it in place of <paramref name="current"/>.</returns>
    /// <exception cref="ArgumentOutOfRangeException"><paramref name="newSize"/> is negative or larger than <see cref="PersistentHeap.MaxPayloadSize"/>.</exception>
    /// <exception cref="InvalidOperationException">The operation has ended, or <paramref name="current"/> is not allocated,
    /// or was already replaced or deleted and its block is not reused yet (nothing is allocated or retired then; a
    /// reference kept past its block's reuse names the new payload, which no check can tell), or is an anti-payload or a
    /// payload of one of the library's structures (type id at or above 2^24).</exception>
    public readonly PayloadRef Replace(PayloadRef current, int newSize) => Replace(current, newSize, claim: true);

    /// <summary>
    /// The public <see cref="Replace(PayloadRef, int)"/> and <see cref="Delete(PayloadRef)"/> take the caller's payloads
    /// only. An anti-payload is already on its way to reclamation: replacing or deleting it retired it twice (the heap
    /// failed at its reclamation: a double free), and a replace also made a live payload of it that recovery kept. A
    /// payload of the library's structures (a type id at or above 2^24) is its structure's: the index went on pointing
    /// at it (a deleted key came back in the running map but not at the next open), and retired it again at its next
    /// update (a double free). Refused before anything changes.
    /// </summary>
    private static void ThrowIfNotTheCallersPayload(PayloadRef current, PayloadHeader header)
    {
        if (header.Kind == PayloadKind.Delete)
        {
            ThrowHelper.ThrowInvalidOperation($"{current} is an anti-payload (a deletion, reclaimed with the payload it deletes): it cannot be replaced or deleted.");
        }

        if ((uint)header.TypeId >= StructureKind.TypeIdLimit)
        {
            ThrowHelper.ThrowInvalidOperation($"{current} belongs to one of the library's structures (type id 0x{header.TypeId:X}, at or above 2^24): update it through that structure, not through the heap.");
        }
    }

    /// <summary><see cref="Replace(PayloadRef, int)"/> for the library's structures, whose indexes never retire a payload
    /// twice: without the claim that refuses a second retirement (a dictionary update per call).</summary>
    internal readonly PayloadRef ReplaceOwned(PayloadRef current, int newSize) => Replace(current, newSize, claim: false);

    private readonly PayloadRef Replace(PayloadRef current, int newSize, bool claim)
    {
        BufferedDurableHeap heap = InsideHeap;
        if (claim && (uint)newSize > (uint)heap.Heap.MaxPayloadSize)
        {
            // (The structures check their sizes themselves.)
            ThrowHelper.ThrowArgumentOutOfRange(nameof(newSize), $"A payload's size must be in [0, {heap.Heap.MaxPayloadSize}] (PersistentHeap.MaxPayloadSize); {newSize} is not.");
        }

        PayloadHeader header = heap.Allocator.GetHeader(current);
        if (claim)
        {
            ThrowIfNotTheCallersPayload(current, header);
        }
        bool inPlaceFault = (heap.Faults & DurabilityFaults.UpdateOlderVersionInPlace) != 0;
        if (header.Size == newSize && (header.EpochTag == Version || heap.Mode == DurabilityMode.Transient || inPlaceFault))
        {
            if (claim && heap.RetiredByACaller(current, header.EpochTag) && (heap.Faults & DurabilityFaults.AcceptDoubleRetirement) == 0)
            {
                ThrowHelper.ThrowInvalidOperation($"The payload at offset {current.Offset} was already replaced or deleted: it cannot be updated in place.");
            }

            heap.TrackRewrite(_buffers!, current);
            return current;
        }

        // Before anything is allocated or claimed: no append after the allocations below can run out of memory.
        _buffers!.EnsureRoom(ThreadBuffers.Slot(Version));

        // Claimed before anything is allocated: a payload already retired is refused here, with nothing to undo.
        if (claim)
        {
            heap.ClaimRetirement(current, header.EpochTag);
        }

        if (header.EpochTag == Version || heap.Mode == DurabilityMode.Transient)
        {
            // Two payloads of one uid in one version would tie at recovery: retire this uid and start a new one: a copy,
            // then an anti-payload. The two allocations run to their end if the thread is interrupted, and whatever makes
            // the second fail undoes the first (an interrupt at a pool's lock between them used to leave the copy live
            // beside the current payload: two live payloads of one key, which recovery refused). The broken control
            // (DurabilityFaults.UndoCopyOnlyWhenFull) does neither, as before.
            bool control = (heap.Faults & DurabilityFaults.UndoCopyOnlyWhenFull) != 0;
            InterruptShield.Scope? shield = control ? null : InterruptShield.Enter();
            try
            {
                return ReplaceWithAnotherUid(heap, current, header, newSize, claim, control);
            }
            finally
            {
                shield?.Dispose();
            }
        }

        PayloadRef copy;
        try
        {
            copy = heap.Allocator.AllocateForOwner(newSize, header.TypeId, Version, PayloadKind.Update, header.Uid);
        }
        catch
        {
            heap.ReleaseRetirement(current, header.EpochTag, claim);
            throw;
        }

        heap.Allocator.GetPayload(current)[..Math.Min(header.Size, newSize)].CopyTo(heap.Allocator.GetPayload(copy));
        heap.Track(_buffers!, Version, copy);
        int slot = ThreadBuffers.Slot(Version);
        _buffers!.Retire(slot, current.Offset, HeapLayout.HeaderSize + header.Size);
        return copy;
    }

    /// <summary>A replace of a payload of this version (or on a transient heap): a copy under a new uid, then an anti-payload for the old one (see <see cref="Replace(PayloadRef, int, bool)"/>).</summary>
    private readonly PayloadRef ReplaceWithAnotherUid(BufferedDurableHeap heap, PayloadRef current, PayloadHeader header, int newSize, bool claim, bool control)
    {
        PayloadRef fresh;
        try
        {
            fresh = AllocateTyped(newSize, header.TypeId);
        }
        catch
        {
            heap.ReleaseRetirement(current, header.EpochTag, claim);
            throw;
        }

        heap.Allocator.GetPayload(current)[..Math.Min(header.Size, newSize)].CopyTo(heap.Allocator.GetPayload(fresh));
        heap.AfterReplaceCopiedForTesting?.Invoke(fresh.Offset);
        PayloadRef? anti;
        try
        {
            anti = AllocateAntiPayload(heap, current, header, claim);
        }
        catch (Exception e) when (!control || e is InsufficientMemoryException)
        {
            // The anti-payload could not be allocated (nothing of it exists; the claim is given back): undo the copy, so
            // the caller keeps current and recovery does not find two live payloads for one key. The copy was never
            // published; it leaves the write-back list first, so the advancer never seals or writes back a block that
            // may by then be part of another one.
            heap.Untrack(_buffers!, Version, fresh);
            if (heap.Mode == DurabilityMode.Transient)
            {
                heap.Allocator.FreeForOwner(fresh);
            }
            else
            {
                // Freed durably before it can be handed out again: a write-back of a neighbouring block may already
                // have copied its allocated header to the file (a page run through the page cache), and no later
                // write-back would cover the free; a full scan would then find a second live payload for the key.
                heap.Allocator.MarkFree(fresh);
                heap.Allocator.WriteBackHeader(fresh);
                heap.Allocator.Fence();
                heap.Allocator.ReleaseFreed(fresh);
            }

            throw;
        }

        RetireWithAntiPayload(current, header, anti);
        return fresh;
    }

    /// <summary>
    /// <see cref="Replace(PayloadRef, int)"/> for a caller that overwrites every byte of the payload and knows the
    /// header of <paramref name="current"/> (its uid and tag, from its own DRAM index): reads nothing of the old
    /// payload and copies nothing, which saves a cache miss per update.
    /// </summary>
    /// <param name="current">The payload being updated (allocated, not yet replaced or deleted).</param>
    /// <param name="uid">The uid in <paramref name="current"/>'s header.</param>
    /// <param name="tag">The epoch tag in <paramref name="current"/>'s header.</param>
    /// <param name="size">The payload's size (old and new: a hash map's payloads have one size).</param>
    /// <param name="typeId">The type id in <paramref name="current"/>'s header.</param>
    /// <param name="newUid">The uid of the returned payload.</param>
    /// <returns>The payload to write the whole new contents into; store it in place of <paramref name="current"/>.</returns>
    internal readonly PayloadRef ReplaceWhole(PayloadRef current, long uid, long tag, int size, int typeId, out long newUid)
    {
        BufferedDurableHeap heap = Heap;
        bool inPlaceFault = (heap.Faults & DurabilityFaults.UpdateOlderVersionInPlace) != 0;
        if (tag == Version || heap.Mode == DurabilityMode.Transient || inPlaceFault)
        {
            heap.TrackRewrite(_buffers!, current);
            newUid = uid;
            return current;
        }

        ThrowIfEnded();
        _buffers!.EnsureRoom(ThreadBuffers.Slot(Version));
        PayloadRef copy = heap.Allocator.AllocateInOperation(AllocatorCache(heap), size, typeId, Version, PayloadKind.Update, uid);
        heap.Track(_buffers!, Version, copy);
        _buffers!.Retire(ThreadBuffers.Slot(Version), current.Offset, HeapLayout.HeaderSize + size);
        newUid = uid;
        return copy;
    }

    /// <summary>
    /// Deletes <paramref name="current"/>: writes an anti-payload (same uid, tagged with <see cref="Version"/>) and
    /// reclaims both two versions later. Stop publishing <paramref name="current"/> before the operation ends.
    /// </summary>
    /// <param name="current">The payload to delete (allocated, not yet replaced or deleted).</param>
    /// <exception cref="InvalidOperationException">The operation has ended, or <paramref name="current"/> is not allocated,
    /// or was already replaced or deleted and its block is not reused yet, or is an anti-payload or a payload of one of
    /// the library's structures (type id at or above 2^24): nothing is written then.</exception>
    /// <exception cref="InsufficientMemoryException">The heap has no block for the anti-payload: possible only on a heap
    /// that cannot grow (at its maximum size, or the libpmem domain) after a burst of deletes that took the whole delete
    /// reserve (a segment's worth, about 1,000 anti-payloads beyond the free blocks of their size, which other
    /// allocations leave free) before any of them was reclaimed; they are reclaimed, and the reserve refilled, two
    /// versions after the deletes (a <see cref="BufferedDurableHeap.Sync()"/>, or the advancer's next cycles). Nothing is
    /// changed then.</exception>
    public readonly void Delete(PayloadRef current) => Delete(current, claim: true);

    /// <summary><see cref="Delete(PayloadRef)"/> for the library's structures (see <see cref="ReplaceOwned"/>).</summary>
    internal readonly void DeleteOwned(PayloadRef current) => Delete(current, claim: false);

    private readonly void Delete(PayloadRef current, bool claim)
    {
        BufferedDurableHeap heap = InsideHeap;
        PayloadHeader header = heap.Allocator.GetHeader(current);
        _buffers!.EnsureRoom(ThreadBuffers.Slot(Version));
        if (claim)
        {
            ThrowIfNotTheCallersPayload(current, header);
            heap.ClaimRetirement(current, header.EpochTag);
        }

        DeleteClaimed(heap, current, header, claim);
    }

    /// <summary>Deletes a payload whose retirement is claimed (if <paramref name="claim"/>): gives the claim back if the anti-payload cannot be allocated.</summary>
    private readonly void DeleteClaimed(BufferedDurableHeap heap, PayloadRef current, PayloadHeader header, bool claim) =>
        RetireWithAntiPayload(current, header, AllocateAntiPayload(heap, current, header, claim));

    /// <summary>
    /// The anti-payload that deletes <paramref name="current"/> (none on a transient heap); if it cannot be allocated,
    /// gives the claim back (if <paramref name="claim"/>) and throws, with nothing allocated.
    /// </summary>
    private readonly PayloadRef? AllocateAntiPayload(BufferedDurableHeap heap, PayloadRef current, PayloadHeader header, bool claim)
    {
        if (heap.Mode == DurabilityMode.Transient)
        {
            return null;
        }

        try
        {
            return heap.Allocator.AllocateForOwner(0, header.TypeId, Version, PayloadKind.Delete, header.Uid);
        }
        catch
        {
            heap.ReleaseRetirement(current, header.EpochTag, claim);
            throw;
        }
    }

    /// <summary>Retires <paramref name="current"/> in this version, with its anti-payload (if any), written back with the version.</summary>
    private readonly void RetireWithAntiPayload(PayloadRef current, PayloadHeader header, PayloadRef? anti)
    {
        int slot = ThreadBuffers.Slot(Version);
        if (anti is { } antiPayload)
        {
            Heap.Track(_buffers!, Version, antiPayload);
            _buffers!.RetireAntiPayload(slot, antiPayload.Offset);
        }

        _buffers!.Retire(slot, current.Offset, HeapLayout.HeaderSize + header.Size);
    }

    /// <summary>The bytes of a payload, valid while this operation lasts.</summary>
    /// <param name="block">An allocated payload.</param>
    /// <returns>The payload bytes.</returns>
    /// <exception cref="InvalidOperationException">The operation has ended, or <paramref name="block"/> is not allocated.</exception>
    public readonly Span<byte> GetPayload(PayloadRef block) => InsideHeap.Allocator.GetPayload(block);

    /// <summary>
    /// Ends the operation: in <see cref="DurabilityMode.Strict"/> writes back and fences its payloads first, then
    /// leaves the protected region. Disposing twice, or disposing <c>default</c>, does nothing.
    /// </summary>
    /// <exception cref="InvalidOperationException">This is a copy of an operation that has ended: nothing is ended,
    /// and the operations open on this thread stay open.</exception>
    public void Dispose()
    {
        BufferedDurableHeap? heap = _heap;
        if (heap is not null)
        {
            // A stale copy would otherwise end (leave the protected region of) an operation this thread has open now.
            // Nested operations may end in any order, as the version scheme's regions may.
            if (!_buffers!.CloseOperation(_serial))
            {
                ThrowHelper.ThrowInvalidOperation("DurableOperation.Dispose: this operation has already ended (a copy that outlived its Dispose); nothing was ended.");
            }

            _heap = null;
            heap.EndOperation(_buffers);
        }
    }

    internal readonly ThreadBuffers Buffers => _buffers!;

    /// <summary>This thread's allocator cache, looked up once per thread and kept in its buffers.</summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    private readonly PersistentHeap.ThreadCache AllocatorCache(BufferedDurableHeap heap) =>
        _buffers!.AllocatorCache ??= heap.Allocator.CurrentThreadCache;

    /// <summary>
    /// <see cref="Heap"/>, for the calls that touch the mapping without the heap file's own epoch (allocation, replace,
    /// delete, payload spans): they are safe only inside an operation, which Dispose waits for. A copy of this ref
    /// struct used after the original was disposed is not inside one, and throws instead of writing into a version
    /// that may already be durable, or into a heap that may be unmapped.
    /// </summary>
    private readonly BufferedDurableHeap InsideHeap
    {
        [MethodImpl(MethodImplOptions.AggressiveInlining)]
        get
        {
            BufferedDurableHeap heap = Heap;
            ThrowIfEnded();
            return heap;
        }
    }

    /// <summary>
    /// Throws unless this operation is still open on its thread: a copy that outlived its Dispose is refused even while
    /// another operation is open on the thread (it would write payloads tagged with its own, older version).
    /// </summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    private readonly void ThrowIfEnded()
    {
        if (!_buffers!.IsOpen(_serial))
        {
            ThrowHelper.ThrowInvalidOperation("This DurableOperation has ended (a copy of it outlived its Dispose): use only the operation that is open on this thread.");
        }
    }

    private readonly BufferedDurableHeap Heap
    {
        [MethodImpl(MethodImplOptions.AggressiveInlining)]
        get
        {
            BufferedDurableHeap? heap = _heap;
            if (heap is null)
            {
                ThrowHelper.ThrowInvalidOperation("This DurableOperation has ended (or was never begun): begin one with BufferedDurableHeap.BeginOperation and use it until Dispose.");
            }

            return heap;
        }
    }
}
