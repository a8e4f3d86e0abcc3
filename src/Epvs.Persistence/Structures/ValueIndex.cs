using System;
using System.Collections.Generic;
using System.Numerics;
using System.Runtime.CompilerServices;
using System.Runtime.InteropServices;
using System.Runtime.Intrinsics.X86;
using System.Threading;

namespace Epvs.Persistence;

/// <summary>
/// The DRAM index of <see cref="ValueMapCore{TKey, TValue}"/>: an open-addressing hash table (linear probing) whose
/// slots hold the key, the value and what an update needs of the payload header, each slot on its own cache line(s),
/// with lock-free reads, per-slot locks for updates and removes, and striped locks for inserts.
/// </summary>
/// <remarks>
/// <para>Why not <see cref="System.Collections.Concurrent.ConcurrentDictionary{TKey, TValue}"/> or a chained table:
/// a chained table costs two dependent cache misses per lookup (the bucket, then the node). Here a lookup costs one:
/// the slot the key hashes to, which holds everything (at most half the slots are used, so the key is mostly there or
/// on the next line). Keys and values are unmanaged, so the table lives in native memory, cache-line aligned, freed
/// when no thread references it any more (readers and writers hold the <see cref="Table"/> object while they use it).</para>
/// <para>A slot's life: empty → claimed (an insert is writing it) → live → deleted (a tombstone) or moved (copied into a
/// grown table). It never goes back to empty, and its key never changes once it is live, so a lock-free reader that
/// probes from the key's home slot to the first empty one cannot miss a live key. A slot's sequence word holds both the
/// slot's writer lock (bit 1, taken by compare-and-swap) and a sequence lock for its value (bit 0 set while the value is
/// being stored; readers retry only then, and when the sequence moved on during their read): an update of an existing
/// key is one compare-and-swap on a line the lookup has just loaded, and a reader never waits for a writer that holds
/// the lock while it allocates the new payload, only for the store of the value itself.</para>
/// <para>Inserts hold <see cref="LockFor(uint)"/> of the key's hash (so two inserts of one key are serialized) and claim
/// an empty slot by compare-and-swap (inserts of other stripes may race for it) before the payload is allocated, so a
/// full table is found before anything is written to the heap; an insert that fails after its claim leaves a tombstone.
/// Growing takes every stripe lock (no insert), marks itself (new updates and removes wait for it on a stripe lock
/// instead of competing for the slots it copies), then locks each live slot in turn, copies it and marks it moved, and
/// publishes the new table: an update that locked the slot first is copied; one that locks it after sees it moved and
/// retries on the new table. Readers on the old table still read moved slots, whose values are those of the moment the
/// table was replaced, which is during their read: linearizable.</para>
/// </remarks>
internal sealed unsafe class ValueIndex<TKey, TValue>
    where TKey : unmanaged, IEquatable<TKey>
    where TValue : unmanaged
{
    private const int Empty = 0;
    private const int Claimed = 1;
    private const int Live = 2;
    private const int Moved = 3;

    /// <summary>The exception of a key's GetHashCode that made the last failed growth fail (user code), for the caller to
    /// tell it from a failure of its own.</summary>
    internal Exception? KeyHashFailure { get; private set; }
    private const int Deleted = 4;

    /// <summary>Sequence bit 0: the value is being stored (readers retry).</summary>
    private const int Storing = 1;

    /// <summary>Sequence bit 1: a writer holds the slot (readers ignore it).</summary>
    private const int Locked = 2;

    /// <summary>What a value store adds to the sequence (above the two flag bits).</summary>
    private const int Step = 4;

    /// <summary>The smallest table (64 KiB for a <c>long</c> key and value).</summary>
    private const long MinimumSlots = 1024;

    private const int SequenceOffset = 0;
    private const int StateOffset = 4;
    private const int PayloadOffset = 8;
    private const int UidOffset = 16;
    private const int TagOffset = 24;
    private const int KeyOffset = 32;

    private static readonly int ValueOffset = KeyOffset + ((sizeof(TKey) + 7) & ~7);

    /// <summary>The slot size: one cache line, or whole lines for wide keys and values.</summary>
    private static readonly int Stride = (ValueOffset + ((sizeof(TValue) + 7) & ~7) + 63) & ~63;

    private readonly object[] _locks;
    private readonly int _lockShift;
    private readonly bool _clearOldSlotsOnGrow;
    private readonly bool _growWithoutSlotLocks;
    private readonly bool _growWithoutRecheck;
    private readonly bool _readersWaitForSlotLock;
    private readonly bool _growthOutOfMemory;
    private Table _table;
    private long _count;

    /// <summary>1 while a growth holds every stripe lock (written under them).</summary>
    private int _growing;

    private long _growthAttempts;

    internal ValueIndex(int lockCount, int capacity, DurabilityFaults faults = DurabilityFaults.None)
    {
        _clearOldSlotsOnGrow = (faults & DurabilityFaults.ClearOldSlotsOnGrow) != 0;
        _growWithoutSlotLocks = (faults & DurabilityFaults.GrowWithoutSlotLocks) != 0;
        _growWithoutRecheck = (faults & DurabilityFaults.GrowWithoutRecheck) != 0;
        _readersWaitForSlotLock = (faults & DurabilityFaults.ReadersWaitForSlotLock) != 0;
        _growthOutOfMemory = (faults & DurabilityFaults.IndexGrowthOutOfMemory) != 0;
        _locks = new object[lockCount];
        for (int i = 0; i < lockCount; i++)
        {
            _locks[i] = new object();
        }

        _lockShift = 32 - BitOperations.Log2((uint)lockCount);
        _table = new Table(SlotsFor(Math.Max(1, capacity)));
    }

    /// <summary>How many times a growth allocated (or tried to allocate) a new table (diagnostics and tests).</summary>
    // Volatile.Read: atomicity only.
    internal long GrowthAttempts => Volatile.Read(ref _growthAttempts);

    /// <summary>How many keys the index holds (exact when no insert or remove is in flight).</summary>
    // Volatile.Read: atomicity only (64-bit on 32-bit runtimes); inserts and removes change it with Interlocked.
    internal long Count => Volatile.Read(ref _count);

    /// <summary>
    /// Test hook: how many of the next growths fail as if out of memory (read and counted down under every stripe lock);
    /// unlike <see cref="DurabilityFaults.IndexGrowthOutOfMemory"/>, which fails every one, a later growth succeeds.
    /// </summary>
    internal int FailingGrowthsForTesting { get; set; }

    /// <summary>Test hook: a growth is about to lock the live slot of this key to copy it (a test parks a remove of it there).</summary>
    internal Action<TKey>? BeforeGrowLocksSlotForTesting { get; set; }

    /// <summary>The current table's number of slots (tests: the memory an index takes per key).</summary>
    internal long Capacity => Volatile.Read(ref _table).Capacity;

    /// <summary>The key's hash: Fibonacci hashing of <see cref="object.GetHashCode"/>, whose top bits choose the lock and the home slot.</summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    internal static uint Hash(TKey key) => (uint)key.GetHashCode() * 0x9E37_79B9u;

    /// <summary>The lock an insert of a key with this hash holds (while it is held, the table is not replaced).</summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    internal object LockFor(uint hash) => _locks[(int)(hash >> _lockShift)];

    /// <summary>Reads the value of <paramref name="key"/> without a lock; never a torn value (unless <paramref name="torn"/>, a test control).</summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    internal bool TryRead(TKey key, uint hash, out TValue value, bool torn = false)
    {
        // Volatile.Read: acquire; pairs with the release in Grow, so the new table's slots are seen initialized.
        Table table = Volatile.Read(ref _table);
        byte* slot = FindReadable(table, key, hash);
        if (slot == null)
        {
            value = default;
            GC.KeepAlive(table);
            return false;
        }

        if (torn)
        {
            Unsafe.SkipInit(out value);
            CopyValue(ref value, slot + ValueOffset);
        }
        else
        {
            ReadValue(slot, out value);
        }

        GC.KeepAlive(table);
        return true;
    }

    /// <summary>
    /// Starts loading the key's home slot into the cache without waiting for it (x86; elsewhere nothing): an update
    /// calls it before the work that precedes its lookup (entering the version region), so the one cache miss of the
    /// lookup overlaps that work instead of following it.
    /// </summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    internal void Prefetch(uint hash)
    {
        if (Sse.IsSupported)
        {
            // Plain read: a hint only; a prefetch of an old table (its memory freed by its finalizer once unreferenced) does not fault.
            Table table = _table;
            Sse.Prefetch0(table.Slot(table.Home(hash)));
        }
    }

    /// <summary>
    /// Locks the live slot of <paramref name="key"/> for an update or a remove, or returns an empty lock if the key is
    /// absent. Waits for a growth in progress. Release with <see cref="SlotLock.Dispose"/>.
    /// </summary>
    internal SlotLock LockLive(TKey key, uint hash)
    {
        while (true)
        {
            // Volatile.Read: acquire; as in TryRead.
            Table table = Volatile.Read(ref _table);
            byte* slot = FindReadable(table, key, hash);
            if (slot == null)
            {
                GC.KeepAlive(table);
                return default;
            }

            // Volatile.Read: acquire; a moved or deleted slot is not locked (a compare-and-swap for nothing).
            int state = Volatile.Read(ref *(int*)(slot + StateOffset));

            // Volatile.Read: a growth in progress is not made to compete for the slots it is copying (a hot key's
            // writers could starve it while it holds every stripe lock): wait for it below, as for a moved slot.
            if (state == Live && Volatile.Read(ref _growing) != 0)
            {
                state = Moved;
            }

            if (state == Live)
            {
                Acquire(slot);

                // Plain read: removes and moves change the state under the slot lock, which this thread now holds.
                state = *(int*)(slot + StateOffset);
                if (state == Live)
                {
                    if (_readersWaitForSlotLock)
                    {
                        // The broken control: readers see a value store in progress for the whole update.
                        *(int*)(slot + SequenceOffset) |= Storing;
                    }

                    return new SlotLock(this, table, slot);
                }

                Release(slot);
            }

            // The table stays referenced until the slot is let go (it may be an old table nobody else holds).
            GC.KeepAlive(table);
            if (state == Moved)
            {
                // A growth is copying the table: wait for it (it holds every stripe lock until the new table is
                // published), then look again in the new table.
                lock (LockFor(hash))
                {
                }
            }

            // (Deleted: removed since the lookup; look again, it may have been inserted anew.)
        }
    }

    /// <summary>
    /// Claims an empty slot for a key the caller found absent (<see cref="Contains"/>) while
    /// holding <see cref="LockFor(uint)"/> of its hash, so no other insert of it can run. Returns an empty claim when the
    /// table has no room (release the lock, <see cref="Grow"/>, and try again); nothing has been written then.
    /// </summary>
    internal SlotClaim Claim(uint hash)
    {
        // Plain read: the caller holds a stripe lock, and Grow replaces the table only while holding all of them.
        Table table = _table;

        // Room for this claim and the others in flight; growth is due at half full.
        if (Volatile.Read(ref table.Used) >= table.Capacity - (table.Capacity / 4))
        {
            return default;
        }

        // At most one lap: more inserts in flight than the room check allows for (one per stripe lock) can take the
        // last empty slots; then this one finds none and the caller grows.
        for (uint i = table.Home(hash), probes = 0; probes <= table.Mask; i = (i + 1) & table.Mask, probes++)
        {
            byte* slot = table.Slot(i);

            // Interlocked.CompareExchange: claims the empty slot against inserts of other stripes.
            if (*(int*)(slot + StateOffset) == Empty && Interlocked.CompareExchange(ref *(int*)(slot + StateOffset), Claimed, Empty) == Empty)
            {
                // Interlocked.Increment: counted across stripes; atomicity only.
                Interlocked.Increment(ref table.Used);
                return new SlotClaim(this, table, slot);
            }
        }

        return default;
    }

    /// <summary>Whether <paramref name="key"/> is live, with its payload offset. Lock-free.</summary>
    internal bool Contains(TKey key, uint hash, out long offset)
    {
        // Volatile.Read: acquire; as in TryRead.
        Table table = Volatile.Read(ref _table);
        byte* slot = FindReadable(table, key, hash);
        offset = slot == null ? 0 : Volatile.Read(ref *(long*)(slot + PayloadOffset));
        GC.KeepAlive(table);
        return slot != null;
    }

    /// <summary>Grows (or rehashes away tombstones) if the table is still over its load factor. The caller holds no lock of
    /// this index, and is inside an <see cref="InterruptShield"/> scope: its waits absorb an interrupt (outside one, a wait
    /// that throws leaves the table as it was).</summary>
    [MethodImpl(MethodImplOptions.NoInlining)]
    internal void Grow()
    {
        // Volatile.Read: acquire, a racy pre-check only (decided again under every lock below): of several threads
        // that crossed the load factor together, those that find the table already grown take no lock.
        Table current = Volatile.Read(ref _table);
        if (Volatile.Read(ref current.Used) <= current.Capacity / 2)
        {
            return;
        }

        int taken = 0;
        bool marked = false;
        try
        {
            for (; taken < _locks.Length; taken++)
            {
                InterruptShield.Lock(_locks[taken]);
            }

            Table old = _table;

            // Volatile.Read: atomicity only (every insert is excluded now).
            if (Volatile.Read(ref old.Used) <= old.Capacity / 2)
            {
                return;
            }

            // Volatile.Write: new updates wait for this growth on a stripe lock instead of competing for its slots.
            // (The broken controls exclude no new writer: GrowWithoutSlotLocks none at all; GrowWithoutRecheck leaves
            // only its missing re-check between a remove and the copy, which this flag would otherwise mostly hide.)
            if (!_growWithoutSlotLocks && !_growWithoutRecheck)
            {
                Volatile.Write(ref _growing, 1);
                marked = true;
            }

            Interlocked.Increment(ref _growthAttempts);
            Table grown;
            try
            {
                if (_growthOutOfMemory || (FailingGrowthsForTesting > 0 && FailingGrowthsForTesting-- > 0))
                {
                    throw new OutOfMemoryException("Simulated (DurabilityFaults.IndexGrowthOutOfMemory): no memory to grow the map's index.");
                }

                // Sized for the live keys at a sixth to a third full: a growth at half full doubles the table (room for
                // three halves of the keys at half full; twice the keys would quadruple it, since the count is just past
                // half), and a table of tombstones is rehashed at about its size.
                long live = Volatile.Read(ref _count);
                grown = new Table(SlotsFor(live + (live / 2)));
            }
            catch (OutOfMemoryException)
            {
                // The inserts into this table stop asking for a growth at half full (the one that finds no room still
                // grows, or fails before writing anything). Marked here, on the table that could not grow: a caller
                // marking the current table afterwards could mark one another thread has grown into meanwhile.
                // Volatile.Write: a hint read by Publish; a stale read costs one more attempt at most.
                Volatile.Write(ref old.GrowthDeferred, true);
                throw;
            }

            long copied = 0;
            uint next = 0;
            try
            {
                CopyAll(old, grown, ref copied, ref next);
            }
            catch (Exception e)
            {
                KeyHashFailure = e;

                // A key's GetHashCode (user code, called to place the key in the new table) threw. The new table was
                // never published: give the old one back its moved slots (their writers wait on a stripe lock, which
                // this growth holds) so that it stays the live table, and report the failure to the caller. It used to
                // stay with those slots moved and the failing one locked: every later write of them, and the next
                // growth, spun for ever. As after a failed allocation, inserts stop asking for a growth at half full.
                for (uint i = 0; i < next; i++)
                {
                    byte* slot = old.Slot(i);
                    if (*(int*)(slot + StateOffset) == Moved)
                    {
                        *(int*)(slot + StateOffset) = Live;
                    }
                }

                Volatile.Write(ref old.GrowthDeferred, true);
                throw;
            }

            grown.Used = copied;

            // Volatile.Write: release; pairs with the acquire in TryRead and LockLive: the copies are initialized
            // before the table is seen.
            Volatile.Write(ref _table, grown);
            GC.KeepAlive(old);
        }
        finally
        {
            if (marked)
            {
                // Volatile.Write: before the stripe locks are released, so a writer that waited on one finds it clear.
                Volatile.Write(ref _growing, 0);
            }

            for (int i = taken - 1; i >= 0; i--)
            {
                Monitor.Exit(_locks[i]);
            }
        }
    }

    /// <summary>Copies every live slot of <paramref name="old"/> into <paramref name="grown"/>; <paramref name="next"/> is the slot it is at (for the undo of a failure).</summary>
    private void CopyAll(Table old, Table grown, ref long copied, ref uint next)
    {
        for (uint i = 0; i < (uint)old.Capacity; i++)
        {
            next = i + 1;
            byte* slot = old.Slot(i);
            if (*(int*)(slot + StateOffset) != Live)
            {
                continue;
            }

            // The slot lock waits out an update in progress and keeps later ones off this slot (they see it moved).
            // The broken control copies without it, and leaves the slot live: an update after the copy is lost.
            if (!_growWithoutSlotLocks)
            {
                BeforeGrowLocksSlotForTesting?.Invoke(Unsafe.Read<TKey>(slot + KeyOffset));
                Acquire(slot);
            }

            if (!_growWithoutSlotLocks && !_growWithoutRecheck && *(int*)(slot + StateOffset) != Live)
            {
                // Removed while this growth waited for the slot: a tombstone, not copied.
                Release(slot);
                continue;
            }

            try
            {
                CopyInto(grown, slot);
            }
            catch when (!_growWithoutSlotLocks)
            {
                // The key's GetHashCode threw: the slot stays live and unlocked (see Grow).
                Release(slot);
                throw;
            }

            copied++;
            if (!_growWithoutSlotLocks)
            {
                // The broken control (clearOldSlotsOnGrow) empties the slot instead: a reader still probing the old
                // table stops there and misses a present key.
                *(int*)(slot + StateOffset) = _clearOldSlotsOnGrow ? Empty : Moved;
                Release(slot);
            }
        }
    }

    /// <summary>
    /// Every live key and its value, read without locks (each value atomically, the whole table not: a key removed and
    /// inserted again during the walk may be met twice, the later value last).
    /// </summary>
    internal Dictionary<TKey, TValue> Snapshot()
    {
        // Volatile.Read: acquire; as in TryRead.
        Table table = Volatile.Read(ref _table);
        var entries = new Dictionary<TKey, TValue>();
        for (uint i = 0; i < (uint)table.Capacity; i++)
        {
            byte* slot = table.Slot(i);
            if (IsReadable(Volatile.Read(ref *(int*)(slot + StateOffset))))
            {
                // Read into the dictionary's entry through its reference: the dictionary's indexer takes the value by
                // value (a copy in each of its frames: about 2.5 values and 13 keys of stack for the largest entry).
                ReadValue(slot, out CollectionsMarshal.GetValueRefOrAddDefault(entries, Unsafe.Read<TKey>(slot + KeyOffset), out _));
            }
        }

        GC.KeepAlive(table);
        return entries;
    }

    /// <summary>Live or moved: the key and a consistent value can be read.</summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    private static bool IsReadable(int state) => (uint)(state - Live) <= Moved - Live;

    /// <summary>The slot holding <paramref name="key"/> live (or moved), or null: probes from the home slot to the first empty one.</summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    private static byte* FindReadable(Table table, TKey key, uint hash)
    {
        // At most one lap: a table with no empty slot is possible only if growth failed for lack of memory.
        for (uint i = table.Home(hash), probes = 0; probes <= table.Mask; i = (i + 1) & table.Mask, probes++)
        {
            byte* slot = table.Slot(i);

            // Volatile.Read: acquire; pairs with the release that makes a claimed slot live, so its key is seen.
            int state = Volatile.Read(ref *(int*)(slot + StateOffset));
            if (state == Empty)
            {
                return null;
            }

            // (Claimed: an insert not yet done, so not yet linearized; deleted: a tombstone. Both are passed over.)
            if (IsReadable(state) && Unsafe.Read<TKey>(slot + KeyOffset).Equals(key))
            {
                return slot;
            }
        }

        return null;
    }

    /// <summary>The value, never torn: retries while a write is in progress or one completed during the read.</summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    private static void ReadValue(byte* slot, out TValue value)
    {
        if (!TryReadValue(slot, out value))
        {
            ReadValueContended(slot, out value);
        }
    }

    [MethodImpl(MethodImplOptions.NoInlining)]
    private static void ReadValueContended(byte* slot, out TValue value)
    {
        // Runs to its end when the thread is interrupted (SpinWait sleeps at times), and requests the interrupt again
        // after: each attempt copies into the caller's location, so a read that threw there left a mix of two values in
        // it (a review); a read never throws ThreadInterruptedException now.
        var spinner = new SpinWait();
        using (InterruptShield.Enter())
        {
            do
            {
                InterruptShield.SpinOnce(ref spinner);
            }
            while (!TryReadValue(slot, out value));
        }
    }

    /// <summary>
    /// Copies a value as bytes, from a reference to it: never a copy of the value on the stack (a value type may be as
    /// large as a payload, hundreds of KiB: a copy per frame overflowed a 1 MiB thread stack). The source may be unaligned
    /// (a payload's bytes).
    /// </summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    internal static void CopyValue(byte* destination, ref readonly TValue value) =>
        Unsafe.CopyBlockUnaligned(ref *destination, ref Unsafe.As<TValue, byte>(ref Unsafe.AsRef(in value)), (uint)sizeof(TValue));

    /// <summary>Copies a value as bytes into <paramref name="value"/> (see <see cref="CopyValue(byte*, ref readonly TValue)"/>).</summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    private static void CopyValue(ref TValue value, byte* source) =>
        Unsafe.CopyBlockUnaligned(ref Unsafe.As<TValue, byte>(ref value), ref *source, (uint)sizeof(TValue));

    /// <summary>One attempt of the sequence-lock read: false if a value store overlapped it.</summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    private static bool TryReadValue(byte* slot, out TValue value)
    {
        ref int sequence = ref *(int*)(slot + SequenceOffset);

        // Volatile.Read: acquire; pairs with the writer's final release, so the value loads below see that write.
        int before = Volatile.Read(ref sequence);
        Unsafe.SkipInit(out value);
        CopyValue(ref value, slot + ValueOffset);

        // LoadLoadBarrier: the value's loads complete before the sequence is loaded again, pairing with the writer's
        // Storing store followed by its store-store barrier.
        LoadLoadBarrier();

        // Volatile.Read: the second sequence load; the same step and no store in progress at the first means no value
        // store overlapped the copy (the lock bit may have changed: locking alone does not touch the value).
        return (before & Storing) == 0 && ((Volatile.Read(ref sequence) ^ before) & ~Locked) == 0;
    }

    /// <summary>Takes the slot's writer lock (sets <see cref="Locked"/> by compare-and-swap).</summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    private static void Acquire(byte* slot)
    {
        if (!TryAcquire(slot))
        {
            AcquireContended(slot);
        }
    }

    [MethodImpl(MethodImplOptions.NoInlining)]
    private static void AcquireContended(byte* slot)
    {
        var spinner = new SpinWait();
        do
        {
            // (A growth's copy waits here inside a shield: it absorbs an interrupt; an update's lookup does not.)
            InterruptShield.SpinOnce(ref spinner);
        }
        while (!TryAcquire(slot));
    }

    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    private static bool TryAcquire(byte* slot)
    {
        ref int word = ref *(int*)(slot + SequenceOffset);
        int sequence = Volatile.Read(ref word);

        // Interlocked.CompareExchange: full fence; the lock is taken before any load or store of the slot below it.
        return (sequence & Locked) == 0 && Interlocked.CompareExchange(ref word, sequence | Locked, sequence) == sequence;
    }

    /// <summary>Releases the slot's writer lock. The caller holds it (only it changes the word meanwhile).</summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    private static void Release(byte* slot)
    {
        ref int word = ref *(int*)(slot + SequenceOffset);

        // Volatile.Write: release; the slot's stores are visible before the lock is seen free, pairing with the next
        // writer's compare-and-swap. (Storing is clear here as built; the broken control ReadersWaitForSlotLock sets it
        // for the whole update, and a remove or a failed update would otherwise leave it set.)
        Volatile.Write(ref word, word & ~(Locked | Storing));
    }

    /// <summary>Copies a live slot into a table nobody else sees yet.</summary>
    private static void CopyInto(Table table, byte* source)
    {
        TKey key = Unsafe.Read<TKey>(source + KeyOffset);
        for (uint i = table.Home(Hash(key)); ; i = (i + 1) & table.Mask)
        {
            byte* slot = table.Slot(i);
            if (*(int*)(slot + StateOffset) == Empty)
            {
                Buffer.MemoryCopy(source + PayloadOffset, slot + PayloadOffset, Stride - PayloadOffset, Stride - PayloadOffset);
                *(int*)(slot + StateOffset) = Live;
                return;
            }
        }
    }

    /// <summary>A power of two with room for <paramref name="keys"/> at half full, at least <see cref="MinimumSlots"/>.</summary>
    private static long SlotsFor(long keys) => (long)BitOperations.RoundUpToPowerOf2((ulong)Math.Clamp(keys * 2, MinimumSlots, 1L << 31));

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

    /// <summary>
    /// A locked live slot: what an update needs of the payload header, and the write of a new payload and value. Only
    /// the store of the value makes readers wait. Dispose releases it, on every path.
    /// </summary>
    internal readonly ref struct SlotLock
    {
        private readonly ValueIndex<TKey, TValue>? _index;
        private readonly Table? _table;
        private readonly byte* _slot;

        internal SlotLock(ValueIndex<TKey, TValue> index, Table table, byte* slot)
        {
            _index = index;
            _table = table;
            _slot = slot;
        }

        /// <summary>Whether a slot is held (the key was live).</summary>
        internal bool IsHeld => _slot != null;

        /// <summary>The payload's offset.</summary>
        internal long Offset => *(long*)(_slot + PayloadOffset);

        /// <summary>The payload header's uid.</summary>
        internal long Uid => *(long*)(_slot + UidOffset);

        /// <summary>The payload header's epoch tag.</summary>
        internal long Tag => *(long*)(_slot + TagOffset);

        /// <summary>The key as the index stored it (its bytes; a key Equal to it may have others).</summary>
        internal TKey Key => Unsafe.Read<TKey>(_slot + KeyOffset);

        /// <summary>Publishes a new payload and value.</summary>
        internal void Write(long offset, long uid, long tag, in TValue value)
        {
            *(long*)(_slot + PayloadOffset) = offset;
            *(long*)(_slot + UidOffset) = uid;
            *(long*)(_slot + TagOffset) = tag;
            ref int word = ref *(int*)(_slot + SequenceOffset);

            // (Without the Storing bit: the broken control ReadersWaitForSlotLock sets it when it takes the lock.)
            int sequence = word & ~Storing;

            // Volatile.Write: release (a value store is in progress); the store-store barrier after it keeps the
            // value's stores below from becoming visible before it, pairing with the reader's second sequence load.
            Volatile.Write(ref word, sequence | Storing);
            StoreStoreBarrier();
            CopyValue(_slot + ValueOffset, in value);

            // Volatile.Write: release; the value's stores are visible before the next step, pairing with the reader's
            // first (acquire) sequence load. Still locked.
            Volatile.Write(ref word, sequence + Step);
        }

        /// <summary>Marks the key removed (a tombstone): lookups pass over it from now on.</summary>
        internal void MarkDeleted()
        {
            // Volatile.Write: an atomic store; readers that already matched the key read its last value, which was
            // current during their read.
            Volatile.Write(ref *(int*)(_slot + StateOffset), Deleted);

            // Interlocked.Decrement: see SlotClaim.Publish.
            Interlocked.Decrement(ref _index!._count);
        }

        /// <summary>Releases the slot.</summary>
        public void Dispose()
        {
            if (_slot != null)
            {
                Release(_slot);
                GC.KeepAlive(_table);
            }
        }
    }

    /// <summary>
    /// A claimed empty slot (<see cref="Claim(uint)"/>): <see cref="Publish"/> fills it and makes it live; a claim that is
    /// not published (the payload's allocation failed) becomes a tombstone when disposed. Invisible to lookups until then.
    /// </summary>
    internal ref struct SlotClaim
    {
        private readonly ValueIndex<TKey, TValue>? _index;
        private readonly Table? _table;
        private byte* _slot;

        internal SlotClaim(ValueIndex<TKey, TValue> index, Table table, byte* slot)
        {
            _index = index;
            _table = table;
            _slot = slot;
        }

        /// <summary>Whether a slot was claimed (false: the table has no room; grow and try again).</summary>
        internal readonly bool IsHeld => _slot != null;

        /// <summary>Fills the slot and makes the key live.</summary>
        /// <returns>Whether the table should grow (call <see cref="Grow"/> after releasing the stripe lock).</returns>
        internal bool Publish(TKey key, long offset, long uid, long tag, in TValue value)
        {
            byte* slot = _slot;
            _slot = null;
            Unsafe.Write(slot + KeyOffset, key);
            CopyValue(slot + ValueOffset, in value);
            *(long*)(slot + PayloadOffset) = offset;
            *(long*)(slot + UidOffset) = uid;
            *(long*)(slot + TagOffset) = tag;

            // Interlocked.Increment: counted across stripes; atomicity only. Before the key is live, so a remove of it
            // never takes the count below zero.
            Interlocked.Increment(ref _index!._count);

            // Volatile.Write: release; the key and value are visible before a reader sees the slot live.
            Volatile.Write(ref *(int*)(slot + StateOffset), Live);
            bool grow = Volatile.Read(ref _table!.Used) > _table.Capacity / 2 && !Volatile.Read(ref _table.GrowthDeferred);
            GC.KeepAlive(_table);
            return grow;
        }

        /// <summary>An unpublished claim becomes a tombstone (never empty again: later inserts may have probed past it).</summary>
        public void Dispose()
        {
            if (_slot != null)
            {
                // Volatile.Write: an atomic store; lookups pass over a tombstone as over a claim.
                Volatile.Write(ref *(int*)(_slot + StateOffset), Deleted);
                _slot = null;
                GC.KeepAlive(_table);
            }
        }
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

    /// <summary>
    /// One table: native memory, cache-line aligned, zeroed (every slot empty), freed by the finalizer once no index,
    /// reader or writer references it.
    /// </summary>
    internal sealed class Table
    {
        private readonly void* _allocation;
        private readonly byte* _base;
        private readonly long _bytes;
        private readonly int _shift;

        private const long HugePage = 2L << 20;

        /// <summary>Slots claimed (live, deleted or moved); the table grows past half full.</summary>
        internal long Used;

        /// <summary>A growth of this table failed for lack of memory (see <see cref="Grow"/>): inserts into it no longer ask for one at half full.</summary>
        internal bool GrowthDeferred;

        internal Table(long slots)
        {
            Capacity = slots;
            Mask = (uint)(slots - 1);
            _shift = 32 - BitOperations.Log2((ulong)slots);
            _bytes = (slots * Stride) + 64;

            // Zeroed by the allocator (calloc: fresh pages from the kernel for a large table, not written here).
            _allocation = NativeMemory.AllocZeroed((nuint)_bytes);
            GC.AddMemoryPressure(_bytes);
            _base = (byte*)(((nuint)_allocation + 63) & ~(nuint)63);
            if (OperatingSystem.IsLinux() && _bytes >= 4 * HugePage)
            {
                // A lookup is one random access into the table: with 4 KiB pages nearly every one also misses the TLB
                // (a page walk, expensive in a virtual machine). Transparent huge pages are a hint (ignored when the
                // system disables them); the page-aligned interior of the allocation is ours to advise.
                nuint start = ((nuint)_allocation + 4095) & ~(nuint)4095;
                nuint end = ((nuint)_allocation + (nuint)_bytes) & ~(nuint)4095;
                try
                {
                    Interop.Libc.Madvise((void*)start, end - start, Interop.Libc.MadvHugePage);
                }
                catch (Exception e) when (e is DllNotFoundException or EntryPointNotFoundException)
                {
                    // Only a hint.
                }
            }
        }

        ~Table()
        {
            if (_allocation != null)
            {
                NativeMemory.Free(_allocation);
                GC.RemoveMemoryPressure(_bytes);
            }
        }

        internal long Capacity { get; }

        internal uint Mask { get; }

        /// <summary>The key's first slot: the hash's top bits.</summary>
        [MethodImpl(MethodImplOptions.AggressiveInlining)]
        internal uint Home(uint hash) => hash >> _shift;

        [MethodImpl(MethodImplOptions.AggressiveInlining)]
        internal byte* Slot(uint index) => _base + ((long)index * Stride);
    }
}
