using System;
using System.Collections.Generic;
using System.IO;
using System.Runtime.CompilerServices;
using System.Runtime.ExceptionServices;
using System.Runtime.InteropServices;
using System.Threading;

namespace Epvs.Persistence;

/// <summary>
/// The core of <see cref="PersistentHashMap{TKey, TValue}"/>: a DRAM index (<see cref="ValueIndex{TKey, TValue}"/>)
/// whose slot per key holds the value and what an update needs of the payload header (offset, uid, epoch tag), over
/// payloads [key bytes | value bytes] of one type id.
/// </summary>
/// <remarks>
/// <para>Reads take no lock and do not touch the persistent heap: they read the value the last completed (or
/// in-progress) write published, like <see cref="System.Collections.Concurrent.ConcurrentDictionary{TKey, TValue}"/>. The
/// slot's value is guarded by a sequence lock, so a read never sees a torn value, and it lives in DRAM, so reclamation
/// of the payload behind it cannot hurt.</para>
/// <para>Writes to one key are serialized by the key's slot lock (an update or remove) or its stripe lock (an insert),
/// taken inside the operation's region, so the order of writes to a key agrees with their versions (a version
/// transition is a quiescent cut), and an update finds the old payload's uid and tag in the slot without reading the
/// payload (one cache miss fewer). An update of an existing key writes its slot in place: one compare-and-swap on the
/// line the lookup loaded, no allocation in the index.</para>
/// </remarks>
internal sealed unsafe class ValueMapCore<TKey, TValue>
    where TKey : unmanaged, IEquatable<TKey>
    where TValue : unmanaged
{
    /// <summary>
    /// The most items of a <see cref="UpsertMany"/> in one operation: enough to pay for entering it (a full fence)
    /// about once per 64 writes, few enough that a version transition waiting for the operation waits a few microseconds.
    /// </summary>
    internal const int BatchPerOperation = 64;

    /// <summary>How many items ahead <see cref="UpsertMany"/> loads index slots: about as many cache misses as a core keeps in flight.</summary>
    internal const int PrefetchDistance = 8;

    /// <summary>The hashes <see cref="UpsertMany"/> keeps between a key's prefetch and its write: a power of two above <see cref="PrefetchDistance"/> + 1.</summary>
    private const int HashRing = 16;

    /// <summary>The widest key whose <see cref="UpsertMany"/> ring is stackalloc'ed (16 keys, 1 KiB); wider ones take an array.</summary>
    private const int MaxStackRingKeySize = 64;

    private readonly BufferedDurableHeap _heap;
    private readonly int _typeId;
    private readonly ValueIndex<TKey, TValue> _index;
    private readonly bool _tornReads;
    private readonly bool _insertWithoutRecheck;

    internal ValueMapCore(BufferedDurableHeap heap, int typeId, int recoveryParallelism)
    {
        ArgumentNullException.ThrowIfNull(heap);
        StructureKind.RefuseHugeKeys(typeof(TKey), sizeof(TKey));
        _heap = heap;

        // The rebuild reads the payloads in the mapping: inside a read operation, so that a disposed heap throws and a
        // Dispose waits for it instead of unmapping under it (see StructureRecovery.Rebuild).
        List<RecoveredPayload> losers;
        using (DurableOperation op = heap.BeginRebuildOperation())
        {
            _typeId = StructureKind.Claim(heap, op, StructureKind.HashMap, typeId, sizeof(TKey));
            IReadOnlyList<RecoveredPayload> payloads = StructureRecovery.KeepNewestPerKey(heap, heap.TakeRecoveredPayloads(_typeId), size => size == PayloadSize, sizeof(TKey), payload => Unsafe.ReadUnaligned<TKey>(heap.PayloadPointer(payload.Block.Offset)), out losers);
            _tornReads = (heap.Faults & DurabilityFaults.TornIndexReads) != 0;
            _insertWithoutRecheck = (heap.Faults & DurabilityFaults.InsertWithoutRecheck) != 0;
            _index = new ValueIndex<TKey, TValue>(StructureRecovery.StripeCount(), payloads.Count, heap.Faults);
            Rebuild(payloads, recoveryParallelism);
        }

        // After a salvage: the older payloads of keys that had two (a dropped anti-payload) are deleted, durably.
        StructureRecovery.DeleteSalvageLosers(heap, losers);
    }

    private static int PayloadSize => sizeof(TKey) + sizeof(TValue);

    internal long Count => _index.Count;

    /// <summary>See <see cref="ValueIndex{TKey, TValue}.GrowthAttempts"/>.</summary>
    internal long IndexGrowthAttempts => _index.GrowthAttempts;

    /// <summary>Test hook: <see cref="UpsertMany"/> has read the keys ahead of item i (its argument) and is about to write it.</summary>
    internal Action<int>? ItemsReadAheadForTesting { get; set; }

    /// <summary>Broken control for tests: a key's GetHashCode that throws in <see cref="UpsertMany"/>'s read-ahead leaves the call at once
    /// (as it used to), with the items between the one being written and that key not written.</summary>
    internal bool HashFailureEscapesForTesting { get; set; }

    /// <summary>Broken control for tests: <see cref="UpsertMany"/> reads each key again at its write, after hashing it (as it used to).</summary>
    internal bool KeysReadAgainForTesting { get; set; }

    /// <summary>The index (tests: its hooks).</summary>
    internal ValueIndex<TKey, TValue> IndexForTesting => _index;

    /// <summary>See <see cref="ValueIndex{TKey, TValue}.Capacity"/>.</summary>
    internal long IndexCapacity => _index.Capacity;

    /// <remarks>The value is passed by reference down to its copies into the payload and the slot (<c>in</c>, copied as
    /// bytes): a value type as large as a payload (hundreds of KiB) would otherwise be copied into every frame on the way,
    /// and overflow a thread's stack (a 256 KiB value did on a 1 MiB stack).</remarks>
    internal bool Upsert(TKey key, in TValue value)
    {
        uint hash = ValueIndex<TKey, TValue>.Hash(key);

        // The lookup's one cache miss overlaps entering the operation.
        _index.Prefetch(hash);
        while (true)
        {
            Outcome outcome;
            using (DurableOperation op = _heap.BeginOperation())
            {
                outcome = Upsert(in op, key, hash, in value);
            }

            GrowAfter(outcome);
            if (outcome != Outcome.NoRoom)
            {
                return outcome != Outcome.Updated;
            }
        }
    }

    /// <summary>
    /// <see cref="Upsert(TKey, in TValue)"/> of each item in order, <see cref="BatchPerOperation"/> items per operation,
    /// with the index slot of the item <see cref="PrefetchDistance"/> ahead loaded while this one is written: the
    /// lookups' cache misses overlap instead of following one another. Each key is read and hashed once, when its slot
    /// is prefetched (a ring of <see cref="HashRing"/> keys and hashes holds both until its write): a caller's thread
    /// that changes <paramref name="items"/> meanwhile then changes which keys are written, never pairs a key with
    /// another key's hash (which put keys in slots no lookup of them reaches: the index counted one key twice, and the
    /// heap held two live payloads of it, which recovery refuses). Returns how many keys were inserted.
    /// </summary>
    internal int UpsertMany(ReadOnlySpan<KeyValuePair<TKey, TValue>> items)
    {
        // The ring on the stack for small keys only: for wide ones (up to StructureKind.MaxKeySize) it took 16 keys'
        // worth (64 KiB at the limit), most of SetMany's stack. (sizeof(TKey) is a constant: the JIT keeps one branch.)
        Span<TKey> keys = sizeof(TKey) <= MaxStackRingKeySize ? stackalloc TKey[HashRing] : new TKey[HashRing];
        Span<uint> hashes = stackalloc uint[HashRing];
        int ahead = 0;
        int inserted = 0;
        int i = 0;

        // The items written: all of them, or those before the first whose key's GetHashCode threw (user code, called up
        // to PrefetchDistance items ahead): that call fails after writing every item before the key, as the docs say of a
        // failure part-way, not with the few items between the write and the read-ahead left out.
        int limit = items.Length;
        ExceptionDispatchInfo? hashFailure = null;
        while (i < limit)
        {
            Outcome outcome = Outcome.Updated;
            int first = i;
            using (DurableOperation op = _heap.BeginOperation())
            {
                int end = Math.Min(limit, i + BatchPerOperation);
                while (i < Math.Min(end, limit))
                {
                    // Up to PrefetchDistance items past this one (the ring overwrites item i's hash only once ahead
                    // reaches i + HashRing, more than PrefetchDistance + 1 past it, so a retried item still finds it).
                    for (int stop = Math.Min(limit, i + 1 + PrefetchDistance); ahead < stop; ahead++)
                    {
                        TKey key = items[ahead].Key;
                        uint next;
                        try
                        {
                            next = ValueIndex<TKey, TValue>.Hash(key);
                        }
                        catch (Exception e) when (!HashFailureEscapesForTesting)
                        {
                            hashFailure = ExceptionDispatchInfo.Capture(e);
                            limit = ahead;
                            break;
                        }

                        keys[ahead & (HashRing - 1)] = key;
                        hashes[ahead & (HashRing - 1)] = next;
                        _index.Prefetch(next);
                    }

                    if (i == limit)
                    {
                        break;
                    }

                    ItemsReadAheadForTesting?.Invoke(i);
                    ref readonly KeyValuePair<TKey, TValue> item = ref items[i];
                    TKey written = KeysReadAgainForTesting ? item.Key : keys[i & (HashRing - 1)];
                    // One copy of the value in this frame (the pair's Value is a property), none below it.
                    outcome = Upsert(in op, written, hashes[i & (HashRing - 1)], item.Value);
                    if (outcome == Outcome.NoRoom)
                    {
                        // Nothing written for this item: grow outside the operation, then retry it.
                        break;
                    }

                    i++;
                    if (outcome != Outcome.Updated)
                    {
                        inserted++;
                    }

                    if (outcome == Outcome.InsertedAndGrow)
                    {
                        break;
                    }
                }

                // Back-pressure counts items, as for Set in a loop: the lag check (MaxVersionAge) runs every
                // LagCheckInterval operations, and this one did the work of i - first (BeginOperation counted one).
                op.Buffers.OperationsUntilCheck -= Math.Max(0, i - first - 1);
            }

            GrowAfter(outcome);
        }

        hashFailure?.Throw();
        return inserted;
    }

    /// <summary>
    /// Grows the index after an insert asked for it or found no room: outside the operation (growing takes every lock of
    /// the index, and would hold back version transitions inside one) and outside the locks.
    /// </summary>
    private void GrowAfter(Outcome outcome)
    {
        // Runs to its end when the thread is interrupted (its waits: every stripe lock, and each slot an update holds),
        // and requests the interrupt again after: after an insert the call must not fail for a wait, since the insert
        // happened (Set threw ThreadInterruptedException with its key in the map), and an interrupt that broke the
        // slot wait's sleep was taken for a key's hash failure and lost. (No scope on the path that does not grow.)
        if (outcome is Outcome.InsertedAndGrow or Outcome.NoRoom)
        {
            using (InterruptShield.Enter())
            {
                Grow(outcome);
            }
        }
    }

    private void Grow(Outcome outcome)
    {
        if (outcome == Outcome.InsertedAndGrow)
        {
            // The insert is done: if the index cannot grow (no memory, or a key's GetHashCode threw), the next insert
            // that finds no room grows, or fails, before writing anything (Grow marks the table it could not grow). The
            // insert's own call does not fail for it: it happened.
            try
            {
                _index.Grow();
            }
            catch (Exception e) when (e is OutOfMemoryException || ReferenceEquals(e, _index.KeyHashFailure))
            {
            }
        }
        else if (outcome == Outcome.NoRoom)
        {
            // An earlier growth failed (or lags behind many inserts). Nothing was written; if there is no memory to grow,
            // the OutOfMemoryException leaves the map and the heap unchanged.
            _index.Grow();
        }
    }

    private Outcome Upsert(scoped in DurableOperation op, TKey key, uint hash, in TValue value)
    {
        while (true)
        {
            // An existing key: its slot is locked (the one writer of the key) and updated in place: no allocation in
            // the index.
            using (ValueIndex<TKey, TValue>.SlotLock slot = _index.LockLive(key, hash))
            {
                if (slot.IsHeld)
                {
                    _heap.InsideSlotLockForTesting?.Invoke();
                    long offset = slot.Offset;
                    PayloadRef block = op.ReplaceWhole(new PayloadRef(offset), slot.Uid, slot.Tag, PayloadSize, _typeId, out long uid);

                    // Updated in place (same block): the header (uid, tag) is unchanged.
                    long tag = block.Offset == offset ? slot.Tag : op.Version;

                    // The key's bytes as the index holds them (a key Equal to it may differ in its bytes: -0.0 and 0.0),
                    // so that the reopened map has the key the running one has.
                    WritePayload(block, slot.Key, in value);
                    slot.Write(block.Offset, uid, tag, in value);
                    return Outcome.Updated;
                }
            }

            // A new key: inserts of it are serialized by its stripe lock.
            lock (_index.LockFor(hash))
            {
                if (!_insertWithoutRecheck && _index.Contains(key, hash, out _))
                {
                    // Inserted since the lookup: update it instead.
                    continue;
                }

                // The slot first: a full index is found before anything is written to the heap. If the allocation throws
                // (the heap is full), the claim becomes a tombstone and the heap is unchanged.
                using ValueIndex<TKey, TValue>.SlotClaim claim = _index.Claim(hash);
                if (!claim.IsHeld)
                {
                    return Outcome.NoRoom;
                }

                PayloadRef added = op.AllocateTyped(PayloadSize, _typeId);
                WritePayload(added, key, in value);
                return claim.Publish(key, added.Offset, _heap.HeaderWords(added.Offset).Uid, op.Version, in value) ? Outcome.InsertedAndGrow : Outcome.Inserted;
            }
        }
    }

    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    internal bool TryRead(TKey key, out TValue value)
    {
        // The index is in DRAM and outlives the heap; a read after Dispose throws all the same, as every call does.
        _heap.ThrowIfDisposed();
        return _index.TryRead(key, ValueIndex<TKey, TValue>.Hash(key), out value, _tornReads);
    }

    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    private void WritePayload(PayloadRef block, TKey key, in TValue value)
    {
        byte* payload = _heap.PayloadPointer(block.Offset);
        Unsafe.WriteUnaligned(payload, key);
        ValueIndex<TKey, TValue>.CopyValue(payload + sizeof(TKey), in value);
    }


    internal bool Remove(TKey key)
    {
        using DurableOperation op = _heap.BeginOperation();
        using ValueIndex<TKey, TValue>.SlotLock slot = _index.LockLive(key, ValueIndex<TKey, TValue>.Hash(key));
        if (!slot.IsHeld)
        {
            return false;
        }

        _heap.InsideSlotLockForTesting?.Invoke();

        // The anti-payload first: if the heap is full, Delete throws and the index still agrees with the heap.
        op.DeleteOwned(new PayloadRef(slot.Offset));
        slot.MarkDeleted();
        return true;
    }

    internal Dictionary<TKey, TValue> Snapshot()
    {
        _heap.ThrowIfDisposed();
        return _index.Snapshot();
    }

    private int UserTypeId => _typeId & (StructureKind.TypeIdLimit - 1);

    private void Rebuild(IReadOnlyList<RecoveredPayload> payloads, int parallelism)
    {
        StructureRecovery.Rebuild(payloads, parallelism, size => size == PayloadSize, $"map with type id {UserTypeId}", $"{PayloadSize} bytes (a {sizeof(TKey)}-byte {typeof(TKey).Name} key and a {sizeof(TValue)}-byte {typeof(TValue).Name} value)", payload =>
        {
            byte* bytes = _heap.PayloadPointer(payload.Block.Offset);
            TKey key = Unsafe.ReadUnaligned<TKey>(bytes);
            uint hash = ValueIndex<TKey, TValue>.Hash(key);
            lock (_index.LockFor(hash))
            {
                if (_index.Contains(key, hash, out long other))
                {
                    throw new InvalidDataException($"Recovery found two live payloads for one key of the map with type id {UserTypeId} ({payload.Header} and the payload at 0x{other:X}): the heap is inconsistent.");
                }

                // Presized for the payloads: no growth during the rebuild, always room.
                using ValueIndex<TKey, TValue>.SlotClaim claim = _index.Claim(hash);
                if (!claim.IsHeld)
                {
                    ThrowHelper.ThrowInvalidOperation("Internal error: the map's index, sized for the recovered payloads, has no room.");
                }

                claim.Publish(key, payload.Block.Offset, payload.Header.Uid, payload.Header.EpochTag, in Unsafe.AsRef<TValue>(bytes + sizeof(TKey)));
            }
        });
    }

    private enum Outcome
    {
        Updated,
        Inserted,
        InsertedAndGrow,
        NoRoom,
    }
}
