using System;
using System.Collections.Generic;
using System.Runtime.CompilerServices;
using System.Runtime.InteropServices;

namespace Epvs.Persistence;

/// <summary>
/// A persistent hash map from unmanaged keys to unmanaged values on a <see cref="BufferedDurableHeap"/> (DESIGN §4,
/// layer 5): each entry is one payload of <c>sizeof(TKey) + sizeof(TValue)</c> bytes; the index lives in DRAM and is
/// rebuilt from the payloads when the heap is recovered. After a crash the map holds exactly the operations up to the
/// heap's durable frontier; <see cref="BufferedDurableHeap.Sync()"/> makes completed operations durable.
/// </summary>
/// <typeparam name="TKey">An unmanaged key type with value equality; stored by its bytes. Its <see cref="object.GetHashCode"/>
/// and <see cref="IEquatable{T}.Equals(T)"/> must agree with each other and not change while the map is open (a hash that
/// changes between calls can add one key twice, which every later open refuses as an inconsistent heap); the map calls
/// them under its locks (an index growth calls every key's hash with every lock stripe held), so they must not take a
/// lock that a thread may hold while it calls the map, nor call into the heap. If they throw, the call fails before the
/// heap changes. Of keys that are Equal with different bytes (<c>0.0</c> and <c>-0.0</c>), the map keeps the bytes of
/// the key's first insert, and so does a reopened map.</typeparam>
/// <typeparam name="TValue">An unmanaged value type; stored by its bytes (no references).</typeparam>
/// <remarks>
/// <para>All members are thread-safe. Each write is one operation (one EPVS region) that locks the key's index slot (an
/// update or remove) or its lock stripe (an insert); reads take no lock and read the DRAM index only, which holds the
/// values too.</para>
/// <para>Memory: the index is an open-addressing table in native memory, one 64-byte slot per key for keys and values
/// of up to 32 bytes together (whole cache lines for wider ones), kept at most half full and doubled when it gets
/// there: 2 to 4 slots per key (128–256 bytes for a <c>long</c> key and value), in exchange for one cache miss per
/// lookup.</para>
/// </remarks>
public sealed class PersistentHashMap<TKey, TValue>
    where TKey : unmanaged, IEquatable<TKey>
    where TValue : unmanaged
{
    private readonly ValueMapCore<TKey, TValue> _core;

    /// <summary>Opens the map with type id <paramref name="typeId"/> on <paramref name="heap"/>: rebuilds its index from the recovered payloads (empty on a new heap).</summary>
    /// <param name="heap">The heap.</param>
    /// <param name="typeId">This map's type id, distinct from every other structure's on the heap.</param>
    /// <remarks>The rebuild runs inside one operation of the heap, which holds back version transitions (and so Sync) until it ends; once the advancer starts one, every operation that begins waits for it too. Open the structures before other threads use the heap, or expect them to pause for as long as the rebuild.</remarks>
    /// <exception cref="ArgumentOutOfRangeException"><paramref name="typeId"/> is not in [0, 2^24) (the high bits record the structure's kind).</exception>
    /// <exception cref="InvalidOperationException">A structure with this type id was already opened on the heap.</exception>
    /// <exception cref="System.IO.InvalidDataException">The recovered payloads of this type id are not this map's (other key or value size).</exception>
    /// <exception cref="NotSupportedException"><typeparamref name="TKey"/> takes more than 4 KiB (4,096 bytes): the map
    /// passes keys by value on the thread's stack and keeps them in .NET dictionaries.</exception>
    /// <exception cref="ObjectDisposedException">The heap has been disposed.</exception>
    public PersistentHashMap(BufferedDurableHeap heap, int typeId)
    {
        ArgumentNullException.ThrowIfNull(heap);
        _core = new ValueMapCore<TKey, TValue>(heap, typeId, heap.Recovery.Parallelism);
    }

    /// <summary>The number of entries: exact while no write runs. It takes no lock, and counts an insert or a remove that is
    /// in progress on another thread: meanwhile it may count a key that a read does not find yet, or no longer count one
    /// that a read still finds (unlike <see cref="System.Collections.Concurrent.ConcurrentDictionary{TKey, TValue}.Count"/>,
    /// which takes every lock).</summary>
    public long Count => _core.Count;

    /// <summary>How many times the index allocated (or tried to allocate) a larger table (tests).</summary>
    internal long IndexGrowthAttempts => _core.IndexGrowthAttempts;

    /// <summary>The map's core (tests: its hooks and controls).</summary>
    internal ValueMapCore<TKey, TValue> CoreForTesting => _core;

    /// <summary>Test hook: see <see cref="ValueIndex{TKey, TValue}.BeforeGrowLocksSlotForTesting"/>.</summary>
    internal Action<TKey>? BeforeGrowLocksSlotForTesting
    {
        get => _core.IndexForTesting.BeforeGrowLocksSlotForTesting;
        set => _core.IndexForTesting.BeforeGrowLocksSlotForTesting = value;
    }

    /// <summary>Test hook: see <see cref="ValueIndex{TKey, TValue}.FailingGrowthsForTesting"/>.</summary>
    internal int FailingIndexGrowthsForTesting
    {
        get => _core.IndexForTesting.FailingGrowthsForTesting;
        set => _core.IndexForTesting.FailingGrowthsForTesting = value;
    }

    /// <summary>The index's number of slots (tests).</summary>
    internal long IndexCapacity => _core.IndexCapacity;

    /// <summary>Inserts or replaces the value of <paramref name="key"/>.</summary>
    /// <param name="key">The key.</param>
    /// <param name="value">The value.</param>
    /// <returns><see langword="true"/> if the key was added, <see langword="false"/> if its value was replaced.</returns>
    /// <exception cref="InsufficientMemoryException">The heap is full.</exception>
    /// <exception cref="OutOfMemoryException">A new key needs a larger index and there is no memory for it; nothing was written.</exception>
    /// <exception cref="InvalidOperationException">No operation can begin on the heap (this one changed nothing): its advancer
    /// failed (a write-back or a fence failed: see <see cref="BufferedDurableHeap.Sync()"/>), its version space is used up, or the
    /// calling thread is inside an operation of another buffered heap.</exception>
    /// <exception cref="System.IO.IOException">In <see cref="DurabilityMode.Strict"/>, this write's own write-back failed: the
    /// write is in place but not durable (see <see cref="DurabilityMode.Strict"/>).</exception>
    /// <exception cref="ObjectDisposedException">The heap was disposed.</exception>
    public bool Set(TKey key, TValue value) => _core.Upsert(key, in value);

    /// <summary>
    /// Inserts or replaces the value of each key of <paramref name="items"/>, in order: the same as <see cref="Set"/>
    /// for each item, and faster for many random keys. A batch enters one operation per 64 items instead of one per item,
    /// and on x86 loads the index slots of the next 8 keys while it writes this one, so their cache misses overlap
    /// (elsewhere only the first saving applies).
    /// </summary>
    /// <param name="items">The keys and values; a key may appear more than once (its last value wins).</param>
    /// <returns>How many of the keys were inserted (the others were replaced).</returns>
    /// <remarks>
    /// <para>Not atomic: each item is its own write, as with <see cref="Set"/>, and the items of one batch may fall into
    /// different versions, so after a crash a prefix of the batch may be durable without the rest
    /// (<see cref="BufferedDurableHeap.Sync()"/> after the call makes all of them durable). Only a prefix: what is durable
    /// is every version up to the durable frontier, and the items are written in order, so an item is never durable
    /// without the items before it, in this batch and in the thread's earlier calls.</para>
    /// <para>If it throws part-way — an item does not fit (the heap is full, the index cannot grow), an item's key throws
    /// from its <see cref="object.GetHashCode"/> or <see cref="IEquatable{T}.Equals(T)"/> (the same exception), or the heap is
    /// disposed or fails between two groups of 64 items (<see cref="ObjectDisposedException"/>,
    /// <see cref="InvalidOperationException"/>) — the items before that point are written and the rest are not:
    /// <see cref="TryGetValue"/> tells which while the heap is open, and after a dispose a reopen shows the written ones
    /// as after any writes (a clean Dispose makes them durable). Each key's <see cref="object.GetHashCode"/> is called
    /// once, up to 8 items before the key is written, and each key is read from <paramref name="items"/> once, then. In
    /// <see cref="DurabilityMode.Strict"/> each group of up to 64 items is written back and fenced when its operation
    /// ends: a failure of that write-back is reported for the group (its items are in the map, their durability unknown),
    /// as <see cref="Set"/> reports it for its one item.</para>
    /// </remarks>
    /// <exception cref="InsufficientMemoryException">The heap has no room for an item's payload.</exception>
    /// <exception cref="OutOfMemoryException">The index needs to grow and there is no memory for it.</exception>
    /// <exception cref="InvalidOperationException">The heap's advancer failed (before or during the call: see the remarks).</exception>
    /// <exception cref="ObjectDisposedException">The heap was disposed (before or during the call: see the remarks).</exception>
    public int SetMany(ReadOnlySpan<KeyValuePair<TKey, TValue>> items) => _core.UpsertMany(items);

    /// <summary>Reads the value of <paramref name="key"/>.</summary>
    /// <param name="key">The key.</param>
    /// <param name="value">The value, or default when absent.</param>
    /// <returns>Whether the key is present.</returns>
    /// <exception cref="ObjectDisposedException">The heap was disposed.</exception>
    public bool TryGetValue(TKey key, out TValue value) => _core.TryRead(key, out value);

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

    /// <summary>A copy of every entry. Each entry is read atomically, the whole map is not (like enumerating a <see cref="System.Collections.Concurrent.ConcurrentDictionary{TKey, TValue}"/>).</summary>
    /// <returns>The entries, in no particular order.</returns>
    /// <exception cref="ObjectDisposedException">The heap was disposed.</exception>
    /// <exception cref="NotSupportedException"><typeparamref name="TKey"/> or <typeparamref name="TValue"/> is too large for
    /// a .NET array (64 KiB or more, with the other and the dictionary's entry fields): read the values one at a time with
    /// <see cref="TryGetValue"/>.</exception>
    public Dictionary<TKey, TValue> ToDictionary()
    {
        try
        {
            return _core.Snapshot();
        }
        catch (TypeLoadException e)
        {
            // The dictionary's entry array: the runtime refuses arrays of value types of 64 KiB or more. Each entry holds
            // a key and a value, either of which (or both together) may make it too large: the message names both.
            ThrowHelper.ThrowTooLargeForArrays(nameof(ToDictionary), $"a {typeof(TKey).Name} key ({Unsafe.SizeOf<TKey>()} bytes) and a {typeof(TValue).Name} value ({Unsafe.SizeOf<TValue>()} bytes)", e);
            throw;
        }
    }
}
