using System;
using System.Runtime.CompilerServices;
using System.Runtime.InteropServices;
using System.Threading;

namespace Epvs;

public sealed unsafe partial class LightEpoch
{
    /// <summary>
    /// What one thread knows about its protection by one <see cref="LightEpoch"/>: how deeply it is nested and which
    /// slot it announced in. Only the owning thread reads or writes a record.
    /// </summary>
    /// <remarks>
    /// Records live in a pinned array per thread, reached through a pointer-typed thread-static: on .NET a primitive
    /// thread-static is one load from the thread's TLS block, while a reference-typed one costs three dependent loads.
    /// <see cref="Slot"/> points into a pinned table segment, which never moves and lives as long as its epoch; a
    /// record whose <see cref="Token"/> is stale (its epoch is gone) is never dereferenced.
    /// </remarks>
    private struct ThreadRecord
    {
        /// <summary>The <see cref="token"/> of the epoch this record belongs to.</summary>
        public long Token;

        /// <summary>The slot last used: the thread's slot while protected, and a hint while not, so the next
        /// outermost Resume usually claims the same, uncontended cache line. Null before first use.</summary>
        public EpochSlot* Slot;

        /// <summary>Nesting depth; 0 when not protected.</summary>
        public int Depth;

        /// <summary>While a drain of this thread runs deferred actions: the depth it was at (the thread's own levels,
        /// which no action may leave); 0 otherwise, and when the drain ran unprotected.</summary>
        public int ActionFloor;

        /// <summary>Where the slow path starts probing for a free slot.</summary>
        public int ProbeStart;

        /// <summary>The owner's managed thread id, written into the slot it claims (diagnostics).</summary>
        public int ThreadId;

        /// <summary>The largest epoch of an action this thread registered while it held the action back itself and
        /// whose second look (<see cref="LightEpoch.SecondLook"/>) it owes when it stops holding it; 0 if none.</summary>
        public long OwedLook;

        /// <summary>With <see cref="checkAsyncFlow"/>: the marker of the async flow that entered the open region (written at
        /// each outermost entry, and also into that flow's <see cref="flow"/>), checked by the outermost Suspend and by
        /// ProtectAndDrain. 0 when the instance does not check.</summary>
        public long Flow;
    }

    /// <summary>A pinned array of records for one thread; kept alive by <see cref="t_recordStorage"/>.</summary>
    private sealed class PinnedRecords
    {
        public readonly ThreadRecord[] Records;
        public readonly ThreadRecord* Pointer;
#if !NET5_0_OR_GREATER
        private GCHandle handle;
#endif

        public PinnedRecords(int length)
        {
#if NET5_0_OR_GREATER
            Records = GC.AllocateArray<ThreadRecord>(length, pinned: true);
            Pointer = (ThreadRecord*)Unsafe.AsPointer(ref MemoryMarshal.GetArrayDataReference(Records));
#else
            Records = new ThreadRecord[length];
            handle = GCHandle.Alloc(Records, GCHandleType.Pinned);
            Pointer = (ThreadRecord*)handle.AddrOfPinnedObject();
#endif
        }

#if !NET5_0_OR_GREATER
        // Also runs when the constructor threw before the array was pinned (out of memory): freeing a handle never
        // allocated would throw on the finalizer thread and end the process.
        ~PinnedRecords()
        {
            if (handle.IsAllocated)
                handle.Free();
        }
#endif
    }

    /// <summary>This thread's records, indexed by <see cref="id"/> (primitive thread-statics: the fast path).</summary>
    [ThreadStatic] private static ThreadRecord* t_records;
    [ThreadStatic] private static int t_recordCount;

    /// <summary>Keeps <see cref="t_records"/> alive; dies with the thread.</summary>
    [ThreadStatic] private static PinnedRecords? t_recordStorage;

    private static long s_nextToken;
    /// <summary>Guards the pool of instance ids: <see cref="s_freeIds"/> (a stack, <see cref="s_freeCount"/> deep) and
    /// <see cref="s_nextId"/>.</summary>
    private static readonly object s_idLock = new();

    /// <summary>Ids given back by disposed instances. Always at least <see cref="s_nextId"/> long (grown when an id is
    /// taken, where the constructor may fail), so that giving an id back never allocates.</summary>
    private static int[] s_freeIds = new int[16];
    private static int s_freeCount;
    private static int s_nextId;

    private static int AllocateId()
    {
        lock (s_idLock)
        {
            if (s_freeCount > 0)
                return s_freeIds[--s_freeCount];
            if (s_nextId == s_freeIds.Length)
                Array.Resize(ref s_freeIds, s_freeIds.Length * 2); // room for this id's return
            return s_nextId++;
        }
    }

    /// <summary>
    /// Gives <paramref name="id"/> back to the pool. Never throws: Dispose calls it after the epoch has closed, and a
    /// failure there would leak the id (the finalizer sees the epoch closed) and fail a Dispose that did its work. Taking a
    /// contended lock is interruptible, so an interrupt is absorbed and requested again afterwards (it surfaces at the
    /// thread's next wait), and the push never allocates (see <see cref="s_freeIds"/>).
    /// </summary>
    private static void ReleaseId(int id)
    {
        bool taken = false, interrupted = false;
        while (!taken)
        {
            try
            {
                Monitor.Enter(s_idLock, ref taken);
            }
            catch (ThreadInterruptedException)
            {
                interrupted = true;
            }
        }
        s_freeIds[s_freeCount++] = id;
        Monitor.Exit(s_idLock);
        if (interrupted)
            Thread.CurrentThread.Interrupt();
    }

    /// <summary>This thread's record for this epoch, created (or reset, if stale) on first use.</summary>
    [MethodImpl(MethodImplOptions.NoInlining)]
    private ThreadRecord* GetOrCreateRecord()
    {
        if (t_recordCount <= id)
        {
            PinnedRecords? old = t_recordStorage;
            var grown = new PinnedRecords(Math.Max(id + 1, Math.Max(4, t_recordCount * 2)));
            old?.Records.AsSpan().CopyTo(grown.Records);
            t_recordStorage = grown;
            t_records = grown.Pointer;
            t_recordCount = grown.Records.Length;
        }

        // Before the record exists, where a failure is a Resume that entered nothing: later drains on this thread (its
        // Suspend's, its Resume's after a raised announcement) find the array long enough and allocate nothing.
        if (!LazyDrainNestingForTesting)
            GrowDrainNesting(SharedDrainDepthForTesting ? 0 : id);

        ThreadRecord* r = t_records + id;
        if (r->Token != token)
            *r = new ThreadRecord { Token = token, ProbeStart = Environment.CurrentManagedThreadId, ThreadId = Environment.CurrentManagedThreadId };
        return r;
    }

    /// <summary>
    /// Shared, read-only, all-zero record returned when a thread has none: depth 0 and no slot, so callers need no
    /// separate null test (never written: every write to a record happens after a depth or slot check fails on it).
    /// </summary>
    private static readonly ThreadRecord* s_noRecord = AllocateNoRecord();

    private static ThreadRecord* AllocateNoRecord()
    {
        // Lives for the whole process, like the type's other statics.
        var p = (ThreadRecord*)Marshal.AllocHGlobal(sizeof(ThreadRecord));
        *p = default;
        return p;
    }

    /// <summary>This thread's record for this epoch, or <see cref="s_noRecord"/> (depth 0, no slot).</summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    private ThreadRecord* FindRecord()
    {
        if ((uint)id < (uint)t_recordCount)
        {
            ThreadRecord* r = t_records + id;
            if (r->Token == token)
                return r;
        }
        return s_noRecord;
    }
}
