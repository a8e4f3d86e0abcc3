using System;
using System.Collections.Generic;
using System.IO;
using System.Runtime.CompilerServices;
using System.Runtime.InteropServices;
using System.Threading;

namespace Epvs.Persistence;

/// <summary>
/// The hash map behind <see cref="PersistentHashMap{TKey, TValue}"/> and <see cref="PersistentByteMap{TKey}"/>: a
/// DRAM index (key → payload offset) in lock-striped shards over payloads [key bytes | value bytes] of one type id.
/// Every operation is one <see cref="DurableOperation"/> that takes its shard's lock inside the region, so the order
/// of operations on a key agrees with their versions (a version transition is a quiescent cut).
/// </summary>
internal sealed unsafe class DurableMapCore<TKey>
    where TKey : unmanaged, IEquatable<TKey>
{
    /// <summary>The offset of an entry that holds no payload: never a payload's (the superblock is at offset 0).</summary>
    private const long Absent = 0;

    private readonly BufferedDurableHeap _heap;
    private readonly int _typeId;
    private readonly Shard[] _shards;
    private readonly int _mask;
    private long _count;

    internal DurableMapCore(BufferedDurableHeap heap, int typeId, int recoveryParallelism)
    {
        ArgumentNullException.ThrowIfNull(heap);
        StructureKind.RefuseHugeKeys(typeof(TKey), sizeof(TKey));
        _heap = heap;

        // The rebuild reads the payloads in the mapping: inside a read operation, so that a disposed heap throws and a
        // Dispose waits for it instead of unmapping under it (see StructureRecovery.Rebuild).
        List<RecoveredPayload> losers;
        using (DurableOperation op = heap.BeginRebuildOperation())
        {
            _typeId = StructureKind.Claim(heap, op, StructureKind.ByteMap, typeId, KeySize);
            int shards = StructureRecovery.StripeCount();
            _shards = new Shard[shards];
            _mask = shards - 1;
            for (int i = 0; i < shards; i++)
            {
                _shards[i] = new Shard();
            }

            IReadOnlyList<RecoveredPayload> payloads = StructureRecovery.KeepNewestPerKey(heap, heap.TakeRecoveredPayloads(_typeId), size => size >= KeySize, KeySize, payload => MemoryMarshal.Read<TKey>(heap.PayloadUnchecked(payload.Block.Offset)), out losers);
            Rebuild(payloads, recoveryParallelism);
        }

        // After a salvage: the older payloads of keys that had two (a dropped anti-payload) are deleted, durably.
        StructureRecovery.DeleteSalvageLosers(heap, losers);
    }

    internal static int KeySize => sizeof(TKey);

    // Volatile.Read: one untorn 64-bit load (also on a 32-bit runtime); nothing is published with the count, which is
    // maintained with Interlocked under the shard locks.
    internal long Count => Volatile.Read(ref _count);

    /// <summary>For tests: the index's entries, placeholders included (a lookup takes a placeholder as absent).</summary>
    internal long EntriesForTesting
    {
        get
        {
            long entries = 0;
            foreach (Shard shard in _shards)
            {
                lock (shard)
                {
                    entries += shard.Map.Count;
                }
            }

            return entries;
        }
    }

    internal bool Upsert(TKey key, ReadOnlySpan<byte> value)
    {
        if (value.Length > _heap.Heap.MaxPayloadSize - KeySize)
        {
            // Named as the caller's argument: the heap would name a payload size that counts the key.
            ThrowHelper.ThrowArgumentOutOfRange(nameof(value), $"A value of {value.Length} bytes does not fit this heap: with its {KeySize}-byte key, a value holds at most {_heap.Heap.MaxPayloadSize - KeySize} bytes (PersistentHeap.MaxPayloadSize is {_heap.Heap.MaxPayloadSize}).");
        }

        int size = KeySize + value.Length;
        using DurableOperation op = _heap.BeginOperation();
        Shard shard = ShardOf(key);
        lock (shard)
        {
            // Every call of the key's GetHashCode and Equals (user code, which may throw) comes before the heap changes: the
            // entry is found, or added as a placeholder, first, and written through its reference once the payload is.
            // (A throw from a lookup after the payload was written left the index on a retired block, a double free at
            // its next update, or a durable key the running map lacked.)
            ref long entry = ref CollectionsMarshal.GetValueRefOrAddDefault(shard.Map, key, out _);
            bool added = entry == Absent;
            PayloadRef block;
            if (added)
            {
                try
                {
                    block = op.AllocateTyped(size, _typeId);
                }
                catch
                {
                    RemovePlaceholder(shard, key);
                    throw;
                }

                MemoryMarshal.Write(_heap.PayloadUnchecked(block.Offset), in key);
            }
            else
            {
                // The key's bytes as the map first stored them (a key Equal to it may differ in its bytes: -0.0 and 0.0),
                // so that the reopened map has the key the running one has.
                TKey stored = MemoryMarshal.Read<TKey>(_heap.PayloadUnchecked(entry));
                block = op.ReplaceOwned(new PayloadRef(entry), size);
                MemoryMarshal.Write(_heap.PayloadUnchecked(block.Offset), in stored);
            }

            value.CopyTo(_heap.PayloadUnchecked(block.Offset)[KeySize..]);
            entry = block.Offset;
            if (added)
            {
                // Interlocked.Increment: the count is shared across shards; atomicity only.
                Interlocked.Increment(ref _count);
            }

            return added;
        }
    }

    internal int TryCopy(TKey key, Span<byte> destination)
    {
        using DurableOperation op = _heap.BeginReadOperation();
        Shard shard = ShardOf(key);
        lock (shard)
        {
            if (!shard.Map.TryGetValue(key, out long offset) || offset == Absent)
            {
                return -1;
            }

            ReadOnlySpan<byte> value = _heap.PayloadUnchecked(offset)[KeySize..];
            value[..Math.Min(value.Length, destination.Length)].CopyTo(destination);
            return value.Length;
        }
    }

    internal bool Remove(TKey key)
    {
        using DurableOperation op = _heap.BeginOperation();
        Shard shard = ShardOf(key);
        lock (shard)
        {
            // The key's code runs before the heap changes, as in Upsert: the entry is marked absent through its reference.
            ref long entry = ref CollectionsMarshal.GetValueRefOrNullRef(shard.Map, key);
            if (Unsafe.IsNullRef(ref entry))
            {
                return false;
            }

            if (entry == Absent)
            {
                // A placeholder left by an earlier failure: tidied now, if the key's code lets it.
                RemovePlaceholder(shard, key);
                return false;
            }

            // The anti-payload first: if the heap is full it throws and the entry stays, as recovery would see it.
            op.DeleteOwned(new PayloadRef(entry));
            entry = Absent;
            RemovePlaceholder(shard, key);
            // Interlocked.Decrement: see Upsert.
            Interlocked.Decrement(ref _count);
            return true;
        }
    }

    internal List<(TKey Key, byte[] Value)> Snapshot()
    {
        var result = new List<(TKey, byte[])>();
        using DurableOperation op = _heap.BeginReadOperation();
        foreach (Shard shard in _shards)
        {
            lock (shard)
            {
                foreach ((_, long offset) in shard.Map)
                {
                    if (offset == Absent)
                    {
                        continue;
                    }

                    // The key as the payload holds it, as a reopened map reads it: an entry that was a placeholder (a
                    // failed insert or remove) keeps the bytes of the key that made it, while the payload that filled it
                    // has those of the key that did (Equal, perhaps with other bytes: a probe saw the two maps differ).
                    ReadOnlySpan<byte> payload = _heap.PayloadUnchecked(offset);
                    result.Add((MemoryMarshal.Read<TKey>(payload), payload[KeySize..].ToArray()));
                }
            }
        }

        return result;
    }

    /// <summary>
    /// Removes the entry of <paramref name="key"/> once it is <see cref="Absent"/> (a removed key, or an insert that
    /// failed). If the key's code throws now, the entry stays as a placeholder, which every lookup takes as absent.
    /// </summary>
    private static void RemovePlaceholder(Shard shard, TKey key)
    {
        try
        {
            shard.Map.Remove(key);
        }
        catch (Exception e) when (e is not OutOfMemoryException)
        {
            // User code (GetHashCode, Equals) threw: the placeholder reads as absent.
        }
    }

    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    private Shard ShardOf(TKey key)
    {
        uint h = (uint)key.GetHashCode() * 0x9E37_79B9u;
        return _shards[(int)(h >> 16) & _mask];
    }

    private void Rebuild(IReadOnlyList<RecoveredPayload> payloads, int parallelism)
    {
        // Each shard sized for its share of the keys, with room for the spread: grown from empty, the shards rehashed
        // every key several times over during the rebuild.
        int perShard = payloads.Count / _shards.Length;
        if (perShard > 0)
        {
            foreach (Shard shard in _shards)
            {
                shard.Map.EnsureCapacity(perShard + (perShard / 8) + 16);
            }
        }

        StructureRecovery.Rebuild(payloads, parallelism, size => size >= KeySize, $"byte map with type id {_typeId & (StructureKind.TypeIdLimit - 1)}", $"at least {KeySize} bytes (a {typeof(TKey).Name} key)", payload =>
        {
            TKey key = MemoryMarshal.Read<TKey>(_heap.PayloadUnchecked(payload.Block.Offset));
            Shard shard = ShardOf(key);
            lock (shard)
            {
                if (!shard.Map.TryAdd(key, payload.Block.Offset))
                {
                    throw new InvalidDataException($"Recovery found two live payloads for one key of the map with type id {_typeId & (StructureKind.TypeIdLimit - 1)} ({payload.Header} and the payload at 0x{shard.Map[key]:X}): the heap is inconsistent.");
                }
            }
        });
        _count = payloads.Count;
    }

    private sealed class Shard
    {
        internal Dictionary<TKey, long> Map { get; } = new();
    }
}
