using System;
using System.Collections.Generic;

namespace Epvs.Persistence;

/// <summary>
/// A persistent hash map from unmanaged keys to variable-size byte values on a <see cref="BufferedDurableHeap"/>
/// (DESIGN §4, layer 5): each entry is one payload; the index lives in DRAM and is rebuilt from the payloads when the
/// heap is recovered. Durability is the heap's: after a crash the map holds exactly the operations up to the durable
/// frontier; <see cref="BufferedDurableHeap.Sync()"/> makes completed operations durable.
/// </summary>
/// <typeparam name="TKey">An unmanaged key type with value equality; stored by its bytes. Its <see cref="object.GetHashCode"/>
/// and <see cref="IEquatable{T}.Equals(T)"/> must agree with each other and not change while the map is open (a hash that
/// changes between calls can add one key twice, which every later open refuses as an inconsistent heap); the map calls
/// them under its locks (an index growth calls every key's hash with every lock stripe held), so they must not take a
/// lock that a thread may hold while it calls the map, nor call into the heap. If they throw, the call fails before the
/// heap changes. Of keys that are Equal with different bytes (<c>0.0</c> and <c>-0.0</c>), the map keeps the bytes of
/// the insert that added the key (since it was last absent), and so does a reopened map.</typeparam>
/// <remarks>All members are thread-safe; each is one operation (one EPVS region, one shard lock), reads included, except
/// <see cref="Count"/>. Called inside another <see cref="DurableOperation"/> of the same heap on the same thread, they nest;
/// inside an operation of another heap they throw <see cref="InvalidOperationException"/> (see
/// <see cref="BufferedDurableHeap.BeginOperation"/>).</remarks>
public sealed class PersistentByteMap<TKey>
    where TKey : unmanaged, IEquatable<TKey>
{
    private readonly DurableMapCore<TKey> _core;

    /// <summary>Opens the map with type id <paramref name="typeId"/> on <paramref name="heap"/>: rebuilds its index from the recovered payloads (empty on a new heap).</summary>
    /// <param name="heap">The heap.</param>
    /// <param name="typeId">This map's type id, distinct from every other structure's on the heap.</param>
    /// <remarks>The rebuild runs inside one operation of the heap, which holds back version transitions (and so Sync) until it ends; once the advancer starts one, every operation that begins waits for it too. Open the structures before other threads use the heap, or expect them to pause for as long as the rebuild.</remarks>
    /// <exception cref="ArgumentOutOfRangeException"><paramref name="typeId"/> is not in [0, 2^24) (the high bits record the structure's kind).</exception>
    /// <exception cref="InvalidOperationException">A structure with this type id was already opened on the heap.</exception>
    /// <exception cref="System.IO.InvalidDataException">The recovered payloads of this type id are not this map's.</exception>
    /// <exception cref="NotSupportedException"><typeparamref name="TKey"/> takes more than 4 KiB (4,096 bytes): the map
    /// passes keys by value on the thread's stack and keeps them in .NET dictionaries.</exception>
    /// <exception cref="ObjectDisposedException">The heap has been disposed.</exception>
    public PersistentByteMap(BufferedDurableHeap heap, int typeId)
    {
        ArgumentNullException.ThrowIfNull(heap);
        _core = new DurableMapCore<TKey>(heap, typeId, heap.Recovery.Parallelism);
    }

    /// <summary>The number of entries.</summary>
    public long Count => _core.Count;

    /// <summary>For tests: the index's entries, placeholders included.</summary>
    internal long EntriesForTesting => _core.EntriesForTesting;

    /// <summary>Inserts or replaces the value of <paramref name="key"/>.</summary>
    /// <param name="key">The key.</param>
    /// <param name="value">The value bytes (copied).</param>
    /// <returns><see langword="true"/> if the key was added, <see langword="false"/> if its value was replaced.</returns>
    /// <exception cref="ArgumentOutOfRangeException"><paramref name="value"/> is longer than the heap's
    /// <see cref="PersistentHeap.MaxPayloadSize"/> less the key's size (the map is unchanged).</exception>
    /// <exception cref="InsufficientMemoryException">The heap is full.</exception>
    /// <exception cref="InvalidOperationException">No operation can begin on the heap (this one changed nothing): its advancer
    /// failed (a write-back or a fence failed: see <see cref="BufferedDurableHeap.Sync()"/>), its version space is used up, or the
    /// calling thread is inside an operation of another buffered heap.</exception>
    /// <exception cref="System.IO.IOException">In <see cref="DurabilityMode.Strict"/>, this write's own write-back failed: the
    /// write is in place but not durable (see <see cref="DurabilityMode.Strict"/>).</exception>
    /// <exception cref="ObjectDisposedException">The heap was disposed.</exception>
    public bool Set(TKey key, ReadOnlySpan<byte> value) => _core.Upsert(key, value);

    /// <summary>Copies the value of <paramref name="key"/> into <paramref name="destination"/> (as much as fits).</summary>
    /// <param name="key">The key.</param>
    /// <param name="destination">Where to copy the value.</param>
    /// <returns>The value's full length, or -1 if the key is absent.</returns>
    public int TryCopyValue(TKey key, Span<byte> destination) => _core.TryCopy(key, destination);

    /// <summary>Returns a copy of the value of <paramref name="key"/>, or null if absent.</summary>
    /// <param name="key">The key.</param>
    /// <returns>The value bytes or null.</returns>
    public byte[]? Get(TKey key)
    {
        Span<byte> buffer = stackalloc byte[256];
        int length = _core.TryCopy(key, buffer);
        if (length < 0)
        {
            return null;
        }

        if (length <= buffer.Length)
        {
            return buffer[..length].ToArray();
        }

        byte[] value = new byte[length];
        while (true)
        {
            length = _core.TryCopy(key, value);
            if (length < 0)
            {
                return null;
            }

            if (length == value.Length)
            {
                return value;
            }

            value = new byte[length];
        }
    }

    /// <summary>Removes <paramref name="key"/> (writes an anti-payload).</summary>
    /// <param name="key">The key.</param>
    /// <returns>Whether the key was present.</returns>
    /// <exception cref="InsufficientMemoryException">The heap has no block for the anti-payload: possible only on a heap
    /// that cannot grow (at its maximum size, or the libpmem domain) after a burst of deletes that took the whole delete
    /// reserve (a segment's worth, about 1,400 anti-payloads beyond the free blocks of their size, which other
    /// allocations leave free) before any of them was reclaimed; they are reclaimed, and the reserve refilled, two
    /// versions after the deletes (a <see cref="BufferedDurableHeap.Sync()"/>, or the advancer's next cycles). The key stays
    /// then.</exception>
    /// <exception cref="InvalidOperationException">No operation can begin on the heap (this one changed nothing): its advancer
    /// failed (a write-back or a fence failed: see <see cref="BufferedDurableHeap.Sync()"/>), its version space is used up, or the
    /// calling thread is inside an operation of another buffered heap.</exception>
    /// <exception cref="System.IO.IOException">In <see cref="DurabilityMode.Strict"/>, this write's own write-back failed: the
    /// write is in place but not durable (see <see cref="DurabilityMode.Strict"/>).</exception>
    /// <exception cref="ObjectDisposedException">The heap was disposed.</exception>
    public bool Remove(TKey key) => _core.Remove(key);

    /// <summary>A copy of every entry. Each shard is copied atomically, the whole map is not: concurrent operations may be partly seen.</summary>
    /// <returns>The entries, in no particular order.</returns>
    public List<KeyValuePair<TKey, byte[]>> ToList()
    {
        var result = new List<KeyValuePair<TKey, byte[]>>();
        foreach ((TKey key, byte[] value) in _core.Snapshot())
        {
            result.Add(new KeyValuePair<TKey, byte[]>(key, value));
        }

        return result;
    }
}
