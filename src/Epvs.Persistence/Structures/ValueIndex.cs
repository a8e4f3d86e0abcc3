using System;
using System.Collections.Generic;
using System.Numerics;
using System.Runtime.CompilerServices;
using System.Threading;

namespace Epvs.Persistence;

/// <summary>
/// The DRAM index of <see cref="ValueMapCore{TKey, TValue}"/>: a chained hash table whose nodes hold the key, the
/// value and what an update needs of the payload header, with lock-free reads and striped-lock writes.
/// </summary>
/// <remarks>
/// <para>Why not <see cref="System.Collections.Concurrent.ConcurrentDictionary{TKey, TValue}"/>: its node holds the
/// value, and a value wider than a word is replaced by a new node at every write (an allocation per update, each one a
/// gen-2 survivor: every gen-0 GC became a gen-1 GC); a separate mutable slot per key avoids that but adds a dependent
/// cache miss to every read and update. Here the node is the slot: a read is one bucket load and one node load.</para>
/// <para>Writers hold <see cref="LockFor(uint)"/> of the key's hash. The lock index is the hash's top bits and the
/// bucket index its top <c>log2(buckets)</c> bits (at least as many), so one lock covers every bucket of its keys:
/// inserts and removes of a bucket's chain are serialized, and an update of a node's value is done in place under the
/// same lock (a sequence lock guards the value against torn reads). A resize takes every lock and publishes a new
/// table of copied nodes (a reader on the old table sees the values as of the resize, which is linearizable: the
/// resize happened during its read). Nodes are published with release stores and read with acquire loads.</para>
/// </remarks>
internal sealed class ValueIndex<TKey, TValue>
    where TKey : unmanaged, IEquatable<TKey>
    where TValue : unmanaged
{
    private readonly object[] _locks;
    private readonly int _lockShift;
    private Node?[] _buckets;
    private int _bucketShift;
    private long _nodes;

    private readonly bool _relinkOnGrow;
    private readonly bool _growWithoutLocks;

    internal ValueIndex(int lockCount, int capacity, bool relinkOnGrow = false, bool growWithoutLocks = false)
    {
        _growWithoutLocks = growWithoutLocks;
        _relinkOnGrow = relinkOnGrow;
        _locks = new object[lockCount];
        for (int i = 0; i < lockCount; i++)
        {
            _locks[i] = new object();
        }

        _lockShift = 32 - Log2(lockCount);
        int buckets = Math.Max(lockCount, (int)Math.Min(1 << 30, BitOperations.RoundUpToPowerOf2((uint)Math.Max(1, capacity))));
        _buckets = new Node?[buckets];
        _bucketShift = 32 - Log2(buckets);
    }

    /// <summary>The key's hash: Fibonacci hashing of <see cref="object.GetHashCode"/>, whose top bits choose the lock and the bucket.</summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    internal static uint Hash(TKey key) => (uint)key.GetHashCode() * 0x9E37_79B9u;

    /// <summary>The lock a writer of a key with this hash holds.</summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    internal object LockFor(uint hash) => _locks[(int)(hash >> _lockShift)];

    /// <summary>The node of <paramref name="key"/>, or null. Lock-free.</summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    internal Node? Find(TKey key, uint hash)
    {
        // Volatile.Read: acquire; pairs with the release in Grow, so the new table's nodes are seen initialized.
        Node?[] buckets = Volatile.Read(ref _buckets);

        // Volatile.Read: acquire; pairs with the release stores that publish a node (Add, Remove).
        Node? node = Volatile.Read(ref buckets[(int)(hash >> (32 - Log2(buckets.Length)))]);
        while (node is not null)
        {
            if (node.Hash == hash && node.Key.Equals(key))
            {
                return node;
            }

            // Volatile.Read: acquire; as above.
            node = Volatile.Read(ref node.Next);
        }

        return null;
    }

    /// <summary>Adds a node for a key that is not in the index. The caller holds <see cref="LockFor(uint)"/> of its hash.</summary>
    /// <returns>Whether the table should grow (call <see cref="Grow"/> after releasing the lock).</returns>
    /// <summary>How many keys the index holds (exact when no insert or remove is in flight).</summary>
    // Volatile.Read: atomicity only (64-bit on 32-bit runtimes); inserts and removes change it with Interlocked.
    internal long Count => Volatile.Read(ref _nodes);

    internal bool Add(Node node)
    {
        Node?[] buckets = _buckets;
        ref Node? head = ref buckets[(int)(node.Hash >> _bucketShift)];
        node.Next = head;

        // Volatile.Write: release; the node's fields (key, value, next) are visible before the node is reachable.
        Volatile.Write(ref head, node);

        // Interlocked.Increment: counted across locks; atomicity only.
        return Interlocked.Increment(ref _nodes) > buckets.Length;
    }

    /// <summary>Unlinks the node of <paramref name="key"/>. The caller holds <see cref="LockFor(uint)"/> of its hash.</summary>
    internal bool Remove(TKey key, uint hash)
    {
        ref Node? link = ref _buckets[(int)(hash >> _bucketShift)];
        while (link is not null)
        {
            Node node = link;
            if (node.Hash == hash && node.Key.Equals(key))
            {
                // Volatile.Write: an atomic store, no new ordering needed (node.Next was published when the node was
                // linked); a reader that already holds the node still walks on from it.
                Volatile.Write(ref link, node.Next);

                // Interlocked.Decrement: see Add.
                Interlocked.Decrement(ref _nodes);
                return true;
            }

            link = ref node.Next;
        }

        return false;
    }

    /// <summary>Doubles the table if it is still over its load factor. The caller holds no lock of this index.</summary>
    [MethodImpl(MethodImplOptions.NoInlining)]
    internal void Grow()
    {
        // Volatile.Read: acquire, a racy pre-check only (decided again under every lock below): of several threads
        // that crossed the load factor together, those that find the table already grown take no lock.
        if (Volatile.Read(ref _nodes) <= Volatile.Read(ref _buckets).Length || Volatile.Read(ref _buckets).Length >= 1 << 30)
        {
            return;
        }

        int taken = 0;
        try
        {
            // (The broken control takes only the first lock, so writers of the other stripes update nodes it is
            // copying: an update that lands on an old node after its copy is lost.)
            for (int locks = _growWithoutLocks ? 1 : _locks.Length; taken < locks; taken++)
            {
                Monitor.Enter(_locks[taken]);
            }

            Node?[] old = _buckets;

            // Volatile.Read: atomicity only (every writer is excluded now).
            if (Volatile.Read(ref _nodes) <= old.Length || old.Length >= 1 << 30)
            {
                return;
            }

            var grown = new Node?[old.Length * 2];
            int shift = _bucketShift - 1;
            foreach (Node? first in old)
            {
                for (Node? node = first; node is not null;)
                {
                    Node? next = node.Next;
                    ref Node? head = ref grown[(int)(node.Hash >> shift)];
                    if (_relinkOnGrow)
                    {
                        // Test control (DurabilityFaults.RelinkOnGrow): moves the node, rewriting its link under readers.
                        Volatile.Write(ref node.Next, head);
                        head = node;
                    }
                    else
                    {
                        // A copy, not a relink: a reader walking the old table must not be led into another chain.
                        head = node.CopyWithNext(head);
                    }

                    node = next;
                }
            }

            _bucketShift = shift;

            // Volatile.Write: release; pairs with the acquire in Find: the copies are initialized before the table is seen.
            Volatile.Write(ref _buckets, grown);
        }
        finally
        {
            for (int i = taken - 1; i >= 0; i--)
            {
                Monitor.Exit(_locks[i]);
            }
        }
    }

    /// <summary>Every node, read without locks (each value atomically, the whole table not).</summary>
    internal IEnumerable<Node> Nodes()
    {
        // Volatile.Read: acquire; see Find.
        Node?[] buckets = Volatile.Read(ref _buckets);
        for (int i = 0; i < buckets.Length; i++)
        {
            // Volatile.Read: acquire; see Find.
            for (Node? node = Volatile.Read(ref buckets[i]); node is not null; node = Volatile.Read(ref node.Next))
            {
                yield return node;
            }
        }
    }

    private static int Log2(int powerOfTwo) => BitOperations.Log2((uint)powerOfTwo);

    /// <summary>
    /// One key: the value (for lock-free reads) and what an update needs of the payload header. Updated in place
    /// under the key's lock, so an update allocates nothing. The value is guarded by a sequence lock (as in the Linux
    /// kernel's seqlock): the writer makes the sequence odd, stores the value, makes it even; a reader retries until it
    /// read the same even sequence before and after the value, so it never returns a torn value.
    /// </summary>
    internal sealed class Node
    {
        internal readonly TKey Key;
        internal readonly uint Hash;
        internal Node? Next;
        private int _sequence;
        private TValue _value;

        internal Node(TKey key, uint hash, long offset, long uid, long tag, TValue value)
        {
            Key = key;
            Hash = hash;
            Offset = offset;
            Uid = uid;
            Tag = tag;
            _value = value;
        }

        /// <summary>The payload's offset. Read and written under the key's lock only.</summary>
        internal long Offset { get; private set; }

        /// <summary>The payload header's uid. Under the key's lock only.</summary>
        internal long Uid { get; private set; }

        /// <summary>The payload header's epoch tag. Under the key's lock only.</summary>
        internal long Tag { get; private set; }

        /// <summary>Publishes a new payload and value. The caller holds the key's lock (one writer at a time).</summary>
        internal void Write(long offset, long uid, long tag, TValue value)
        {
            Offset = offset;
            Uid = uid;
            Tag = tag;
            int sequence = _sequence;

            // Volatile.Write: release (odd: a write is in progress); the store-store barrier after it keeps the value's
            // stores below from becoming visible before the odd sequence (store-store), pairing with the reader's
            // second sequence load.
            Volatile.Write(ref _sequence, sequence + 1);
            StoreStoreBarrier();
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

            // LoadLoadBarrier: the value's loads complete before the sequence is loaded again, pairing with the
            // writer's odd store followed by its store-store barrier.
            LoadLoadBarrier();

            // Volatile.Read: the second sequence load (ordered after the value's loads by the barrier above); equal to
            // the first and even means no write overlapped the copy.
            if ((before & 1) == 0 && Volatile.Read(ref _sequence) == before)
            {
                return value;
            }

            return ReadContended();
        }

        /// <summary>Test control (<see cref="DurabilityFaults.TornIndexReads"/>): reads the value without the sequence check.</summary>
        internal TValue ReadTorn() => _value;

        /// <summary>A copy for a grown table (under every lock of the index: no write is in progress).</summary>
        internal Node CopyWithNext(Node? next) => new(Key, Hash, Offset, Uid, Tag, _value) { Next = next };

        /// <summary>
        /// Loads before it complete before loads after it. On .NET 10 <c>Volatile.ReadBarrier</c>: free on x64 (the JIT
        /// only keeps the order), a load barrier on Arm64. On .NET 8 a full fence (a locked instruction even on x64,
        /// paid by every read): correct, slower; the published figures are .NET 10.
        /// </summary>
        [MethodImpl(MethodImplOptions.AggressiveInlining)]
        private static void LoadLoadBarrier()
        {
#if NET10_0_OR_GREATER
            Volatile.ReadBarrier();
#else
            Interlocked.MemoryBarrier();
#endif
        }

        /// <summary>Stores before it become visible before stores after it.</summary>
        [MethodImpl(MethodImplOptions.AggressiveInlining)]
        private static void StoreStoreBarrier()
        {
#if NET10_0_OR_GREATER
            Volatile.WriteBarrier();
#else
            Interlocked.MemoryBarrier();
#endif
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        private TValue ReadContended()
        {
            var spinner = new SpinWait();
            while (true)
            {
                spinner.SpinOnce();

                // Volatile.Read / LoadLoadBarrier: as in Read.
                int before = Volatile.Read(ref _sequence);
                TValue value = _value;
                LoadLoadBarrier();
                if ((before & 1) == 0 && Volatile.Read(ref _sequence) == before)
                {
                    return value;
                }
            }
        }
    }
}
