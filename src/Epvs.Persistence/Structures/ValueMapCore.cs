using System;
using System.Collections.Concurrent;
using System.Collections.Generic;
using System.IO;
using System.Runtime.CompilerServices;
using System.Runtime.InteropServices;
using System.Threading;

namespace Epvs.Persistence;

/// <summary>
/// The core of <see cref="PersistentHashMap{TKey, TValue}"/>: a DRAM index (a <see cref="ConcurrentDictionary{TKey, TValue}"/>)
/// from each key to a <see cref="Slot"/> that holds the value and what an update needs of the payload header (offset,
/// uid, epoch tag), over payloads [key bytes | value bytes] of one type id.
/// </summary>
/// <remarks>
/// <para>Reads take no lock and do not touch the persistent heap: they read the value the last completed (or
/// in-progress) write published, like <see cref="ConcurrentDictionary{TKey, TValue}"/>. The slot's value is guarded by
/// a sequence lock, so a read never sees a torn value, and it lives in DRAM, so reclamation of the payload behind it
/// cannot hurt.</para>
/// <para>Writes to one key are serialized by a striped lock taken inside the operation's region, so the order of
/// writes to a key agrees with their versions (a version transition is a quiescent cut), and an update finds the old
/// payload's uid and tag in the slot without reading the payload (one cache miss fewer).</para>
/// </remarks>
internal sealed unsafe class ValueMapCore<TKey, TValue>
    where TKey : unmanaged, IEquatable<TKey>
    where TValue : unmanaged
{
    private readonly BufferedDurableHeap _heap;
    private readonly int _typeId;
    private readonly ConcurrentDictionary<TKey, Slot> _index;
    private readonly bool _tornReads;
    private readonly object[] _stripes;
    private readonly int _mask;
    private long _count;

    internal ValueMapCore(BufferedDurableHeap heap, int typeId, int recoveryParallelism)
    {
        ArgumentNullException.ThrowIfNull(heap);
        _heap = heap;
        _typeId = StructureKind.Claim(heap, StructureKind.HashMap, typeId);
        int stripes = StructureRecovery.StripeCount();
        _stripes = new object[stripes];
        _mask = stripes - 1;
        for (int i = 0; i < stripes; i++)
        {
            _stripes[i] = new object();
        }

        IReadOnlyList<RecoveredPayload> payloads = heap.TakeRecoveredPayloads(_typeId);
        _tornReads = (heap.Faults & DurabilityFaults.TornIndexReads) != 0;
        _index = new ConcurrentDictionary<TKey, Slot>(Math.Max(1, recoveryParallelism), Math.Max(31, payloads.Count));
        Rebuild(payloads, recoveryParallelism);
    }

    private static int PayloadSize => sizeof(TKey) + sizeof(TValue);

    // Volatile.Read: acquire; the count is maintained with Interlocked under the stripe locks.
    internal long Count => Volatile.Read(ref _count);

    internal bool Upsert(TKey key, TValue value)
    {
        using DurableOperation op = _heap.BeginOperation();
        lock (StripeOf(key))
        {
            // One lookup: an existing key's slot is updated in place (no allocation, no second hash lookup).
            if (_index.TryGetValue(key, out Slot? slot))
            {
                PayloadRef block = op.ReplaceWhole(new PayloadRef(slot.Offset), slot.Uid, slot.Tag, PayloadSize, _typeId, out long uid);

                // Updated in place (same block): the header (uid, tag) is unchanged.
                long tag = block.Offset == slot.Offset ? slot.Tag : op.Version;
                WritePayload(block, key, value);
                slot.Write(block.Offset, uid, tag, value);
                return false;
            }

            PayloadRef added = op.Allocate(PayloadSize, _typeId);
            WritePayload(added, key, value);
            _index[key] = new Slot(added.Offset, _heap.HeaderWords(added.Offset).Uid, op.Version, value);

            // Interlocked.Increment: the count is shared across stripes; atomicity only.
            Interlocked.Increment(ref _count);
            return true;
        }
    }

    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    internal bool TryRead(TKey key, out TValue value)
    {
        if (_index.TryGetValue(key, out Slot? slot))
        {
            value = _tornReads ? slot.ReadTorn() : slot.Read();
            return true;
        }

        value = default;
        return false;
    }

    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    private void WritePayload(PayloadRef block, TKey key, TValue value)
    {
        byte* payload = _heap.PayloadPointer(block.Offset);
        Unsafe.WriteUnaligned(payload, key);
        Unsafe.WriteUnaligned(payload + sizeof(TKey), value);
    }

    internal bool Remove(TKey key)
    {
        using DurableOperation op = _heap.BeginOperation();
        lock (StripeOf(key))
        {
            if (!_index.TryGetValue(key, out Slot? current))
            {
                return false;
            }

            // The anti-payload first: if the heap is full, Delete throws and the index still agrees with the heap.
            op.Delete(new PayloadRef(current.Offset));
            _index.TryRemove(key, out _);
            // Interlocked.Decrement: see Upsert.
            Interlocked.Decrement(ref _count);
            return true;
        }
    }

    internal Dictionary<TKey, TValue> Snapshot()
    {
        var result = new Dictionary<TKey, TValue>();
        foreach (KeyValuePair<TKey, Slot> pair in _index)
        {
            result[pair.Key] = pair.Value.Read();
        }

        return result;
    }

    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    private object StripeOf(TKey key)
    {
        uint h = (uint)key.GetHashCode() * 0x9E37_79B9u;
        return _stripes[(int)(h >> 16) & _mask];
    }

    private int UserTypeId => _typeId & (StructureKind.TypeIdLimit - 1);

    private void Rebuild(IReadOnlyList<RecoveredPayload> payloads, int parallelism)
    {
        StructureRecovery.Rebuild(payloads, parallelism, size => size == PayloadSize, $"map with type id {UserTypeId}", $"{PayloadSize} bytes (a {sizeof(TKey)}-byte {typeof(TKey).Name} key and a {sizeof(TValue)}-byte {typeof(TValue).Name} value)", payload =>
        {
            byte* bytes = _heap.PayloadPointer(payload.Block.Offset);
            TKey key = Unsafe.ReadUnaligned<TKey>(bytes);
            var entry = new Slot(payload.Block.Offset, payload.Header.Uid, payload.Header.EpochTag, Unsafe.ReadUnaligned<TValue>(bytes + sizeof(TKey)));
            if (!_index.TryAdd(key, entry))
            {
                throw new InvalidDataException($"Recovery found two live payloads for one key of the map with type id {UserTypeId} ({payload.Header} and the payload at 0x{_index[key].Offset:X}): the heap is inconsistent.");
            }
        });
        _count = payloads.Count;
    }

    /// <summary>
    /// One key's state: the value (for lock-free reads) and what an update needs of the payload header. Allocated
    /// once per key and updated in place under the key's stripe lock, so an update allocates nothing (a new node per
    /// update, as the dictionary makes for a value wider than a word, is a gen-2 survivor each time: every gen-0 GC
    /// became a gen-1 GC). The value is guarded by a sequence lock (Lameter's seqlock, as in the Linux kernel): the
    /// writer makes the sequence odd, stores the value, makes it even; a reader retries until it read the same even
    /// sequence before and after the value, so it never returns a torn value.
    /// </summary>
    private sealed class Slot
    {
        private int _sequence;
        private TValue _value;

        internal Slot(long offset, long uid, long tag, TValue value)
        {
            Offset = offset;
            Uid = uid;
            Tag = tag;
            _value = value;
        }

        /// <summary>The payload's offset. Read and written under the key's stripe lock only.</summary>
        internal long Offset { get; private set; }

        /// <summary>The payload header's uid. Under the stripe lock only.</summary>
        internal long Uid { get; private set; }

        /// <summary>The payload header's epoch tag. Under the stripe lock only.</summary>
        internal long Tag { get; private set; }

        /// <summary>Publishes a new payload and value. The caller holds the key's stripe lock (one writer at a time).</summary>
        internal void Write(long offset, long uid, long tag, TValue value)
        {
            Offset = offset;
            Uid = uid;
            Tag = tag;
            int sequence = _sequence;

            // Volatile.Write: release (odd: a write is in progress); the WriteBarrier after it keeps the value's
            // stores below from becoming visible before the odd sequence (store-store), pairing with the reader's
            // second sequence load.
            Volatile.Write(ref _sequence, sequence + 1);
            Volatile.WriteBarrier();
            _value = value;

            // Volatile.Write: release; the value's stores are visible before the even sequence, pairing with the
            // reader's first (acquire) sequence load.
            Volatile.Write(ref _sequence, sequence + 2);
        }

        /// <summary>The value, never torn: retries while a write is in progress or one completed during the read.</summary>
        [MethodImpl(MethodImplOptions.AggressiveInlining)]
        internal TValue Read()
        {
            // Volatile.Read: acquire; pairs with the writer's final release, so the value loads below see at least
            // that write.
            int before = Volatile.Read(ref _sequence);
            TValue value = _value;

            // Volatile.ReadBarrier: the value's loads complete before the sequence is loaded again (load-load), pairing
            // with the writer's odd store followed by its WriteBarrier.
            Volatile.ReadBarrier();
            if ((before & 1) == 0 && Volatile.Read(ref _sequence) == before)
            {
                return value;
            }

            return ReadContended();
        }

        /// <summary>Test control (<see cref="DurabilityFaults.TornIndexReads"/>): reads the value without the sequence check.</summary>
        internal TValue ReadTorn() => _value;

        [MethodImpl(MethodImplOptions.NoInlining)]
        private TValue ReadContended()
        {
            var spinner = new SpinWait();
            while (true)
            {
                spinner.SpinOnce();

                // Volatile.Read / ReadBarrier: as in Read.
                int before = Volatile.Read(ref _sequence);
                TValue value = _value;
                Volatile.ReadBarrier();
                if ((before & 1) == 0 && Volatile.Read(ref _sequence) == before)
                {
                    return value;
                }
            }
        }
    }
}
