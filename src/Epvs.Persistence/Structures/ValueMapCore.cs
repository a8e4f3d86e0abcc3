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
/// from each key to an <see cref="Entry"/> that holds the value and what an update needs of the payload
/// header (offset, uid, epoch tag), over payloads [key bytes | value bytes] of one type id.
/// </summary>
/// <remarks>
/// <para>Reads take no lock and do not touch the persistent heap: they read the entry the last completed (or
/// in-progress) write published, like <see cref="ConcurrentDictionary{TKey, TValue}"/>. The entry is a multi-word struct, which
/// the dictionary never writes in place (it swaps the node), so a read never sees a torn value, and it lives in DRAM, so reclamation of the payload behind it cannot hurt.</para>
/// <para>Writes to one key are serialized by a striped lock taken inside the operation's region, so the order of
/// writes to a key agrees with their versions (a version transition is a quiescent cut), and an update finds the old
/// payload's uid and tag in the entry without reading the payload (one cache miss fewer).</para>
/// </remarks>
internal sealed unsafe class ValueMapCore<TKey, TValue>
    where TKey : unmanaged, IEquatable<TKey>
    where TValue : unmanaged
{
    private readonly BufferedDurableHeap _heap;
    private readonly int _typeId;
    private readonly ConcurrentDictionary<TKey, Entry> _index;
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
        _index = new ConcurrentDictionary<TKey, Entry>(Math.Max(1, recoveryParallelism), Math.Max(31, payloads.Count));
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
            PayloadRef block;
            long uid;
            long tag = op.Version;
            bool added = !_index.TryGetValue(key, out Entry current);
            if (added)
            {
                block = op.Allocate(PayloadSize, _typeId);
                uid = _heap.HeaderWords(block.Offset).Uid;
            }
            else
            {
                block = op.ReplaceWhole(new PayloadRef(current.Offset), current.Uid, current.Tag, PayloadSize, _typeId, out uid);
                if (block.Offset == current.Offset)
                {
                    // Updated in place: the header (uid, tag) is unchanged.
                    tag = current.Tag;
                }
            }

            byte* payload = _heap.PayloadPointer(block.Offset);
            Unsafe.WriteUnaligned(payload, key);
            Unsafe.WriteUnaligned(payload + sizeof(TKey), value);
            _index[key] = new Entry(block.Offset, uid, tag, value);
            if (added)
            {
                // Interlocked.Increment: the count is shared across stripes; atomicity only.
                Interlocked.Increment(ref _count);
            }

            return added;
        }
    }

    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    internal bool TryRead(TKey key, out TValue value)
    {
        if (_index.TryGetValue(key, out Entry entry))
        {
            value = entry.Value;
            return true;
        }

        value = default;
        return false;
    }

    internal bool Remove(TKey key)
    {
        using DurableOperation op = _heap.BeginOperation();
        lock (StripeOf(key))
        {
            if (!_index.TryGetValue(key, out Entry current))
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
        foreach (KeyValuePair<TKey, Entry> pair in _index)
        {
            result[pair.Key] = pair.Value.Value;
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
            var entry = new Entry(payload.Block.Offset, payload.Header.Uid, payload.Header.EpochTag, Unsafe.ReadUnaligned<TValue>(bytes + sizeof(TKey)));
            if (!_index.TryAdd(key, entry))
            {
                throw new InvalidDataException($"Recovery found two live payloads for one key of the map with type id {UserTypeId} ({payload.Header} and the payload at 0x{_index[key].Offset:X}): the heap is inconsistent.");
            }
        });
        _count = payloads.Count;
    }

    /// <summary>
    /// One key's state, stored inline in the index's node. Larger than a word, so the dictionary replaces the node at
    /// each write rather than writing the value in place: reads never tear.
    /// </summary>
    private readonly struct Entry
    {
        internal Entry(long offset, long uid, long tag, TValue value)
        {
            Offset = offset;
            Uid = uid;
            Tag = tag;
            Value = value;
        }

        internal long Offset { get; }

        internal long Uid { get; }

        internal long Tag { get; }

        internal TValue Value { get; }
    }
}
