namespace Epvs.Persistence;

/// <summary>
/// One thread's per-version buffers (Montage's per-thread write-back buffers): payloads to write back, payloads to
/// reclaim and anti-payloads to reclaim, indexed by version modulo <see cref="Slots"/>.
/// </summary>
/// <remarks>
/// Ownership moves with the version: the owner appends to slot v only inside protected regions of version v, and the
/// advancer drains slot v only after the transition out of v has completed (a quiescent cut: every region of v has
/// left), and before version v + <see cref="Slots"/> begins. The transitions' full fences order the two, so the
/// fields need no atomics.
/// </remarks>
internal sealed class ThreadBuffers
{
    internal const int Slots = 4;

    /// <summary>Created on the thread whose buffers these are (the heap's thread-local factory).</summary>
    internal ThreadBuffers(int managedThreadId)
    {
        ManagedThreadId = managedThreadId;
        AcrossHeaps = t_thread ??= new ThreadOperations();
        for (int i = 0; i < Slots; i++)
        {
            WriteBack[i] = new OffsetList();
            Retired[i] = new OffsetList();
            AntiPayloads[i] = new OffsetList();
        }
    }

    internal int ManagedThreadId { get; }

    /// <summary>The owner thread (created on it): once it has exited and the buffers are drained, the heap forgets them.</summary>
    internal System.Threading.Thread Owner { get; } = System.Threading.Thread.CurrentThread;

    /// <summary>Whether the owner has an operation open. Owner only (or once the owner has exited).</summary>
    internal bool HasOpenOperations => _openCount != 0;

    /// <summary>What this thread's buffers of every heap share (read through them: no thread-static lookup per operation).</summary>
    internal ThreadOperations AcrossHeaps { get; }

    [System.ThreadStatic]
    private static ThreadOperations? t_thread;

    /// <summary>Whether every per-version list is empty: nothing left to write back or reclaim. Under the cycle gate.</summary>
    internal bool IsDrained
    {
        get
        {
            for (int slot = 0; slot < Slots; slot++)
            {
                if (WriteBack[slot].Count != 0 || Retired[slot].Count != 0 || AntiPayloads[slot].Count != 0)
                {
                    return false;
                }
            }

            return true;
        }
    }

    /// <summary>The owner's allocation cache in the <see cref="PersistentHeap"/> (set on the owner's first allocation), so an allocation needs no thread-local lookup.</summary>
    internal PersistentHeap.ThreadCache? AllocatorCache;

    internal OffsetList[] WriteBack { get; } = new OffsetList[Slots];

    internal OffsetList[] Retired { get; } = new OffsetList[Slots];

    internal OffsetList[] AntiPayloads { get; } = new OffsetList[Slots];

    /// <summary>Bytes this thread has retired (replaced or deleted payloads, anti-payloads) so far. Written by the owner only, with single (volatile) stores: other threads read it.</summary>
    internal long RetiredBytes;

    /// <summary>Bytes of this thread's retired blocks the advancer has freed so far. Written by the advancer (under the cycle gate) only.</summary>
    internal long ReclaimedBytes;

    /// <summary>The owner's next look at the global backlog (in <see cref="RetiredBytes"/>). Written by the owner only.</summary>
    internal long NextBacklogCheck;

    /// <summary>Operations this thread begins before its next look at the current version's age (see <see cref="BufferedDurableHeap"/>'s back-pressure). Written by the owner only.</summary>
    internal int OperationsUntilCheck;

    /// <summary>Strict mode: the payloads of the operation in progress, written back and fenced when it ends.</summary>
    internal OffsetList StrictPending { get; } = new();

    /// <summary>
    /// The serial numbers of the operations this thread has open on the heap (operations nest); the first
    /// <see cref="_openCount"/> are in use. A <see cref="DurableOperation"/> remembers its serial, so a copy that
    /// outlived its Dispose is told apart from the operations open now. Owner only.
    /// </summary>
    private long[] _openSerials = new long[4];
    private long _lastSerial;

    /// <summary>How many operations this thread has open on the heap. Owner only.</summary>
    private int _openCount;

    internal static int Slot(long version) => (int)(version & (Slots - 1));

    /// <summary>
    /// The version of the outermost operation this thread has open, <see cref="long.MaxValue"/> when none. Written by
    /// the owner, read by the advance cycles (see <see cref="BufferedDurableHeap"/>'s check that no operation outlives its
    /// version's cut).
    /// </summary>
    internal long OpenVersion = long.MaxValue;

    /// <summary>Whether recording one more open operation needs <see cref="GrowOpenRecord"/> first.</summary>
    internal bool OpenRecordFull => _openCount == _openSerials.Length;

    /// <summary>
    /// Makes room for one more open operation: called before the operation enters its region, so that recording it
    /// (<see cref="OpenOperation"/>) cannot fail for lack of memory inside the region, leaving the thread protected.
    /// </summary>
    internal void GrowOpenRecord() => System.Array.Resize(ref _openSerials, _openSerials.Length * 2);

    /// <summary>Records a new open operation of <paramref name="version"/> (with room made first: allocates nothing).</summary>
    /// <returns>Its serial number, never reused on this thread.</returns>
    internal long OpenOperation(long version)
    {
        int count = _openCount;
        if (count == 0)
        {
            AcrossHeaps.OpenIn = this;

            // Volatile.Write: release. Written inside the operation's region, before anything the caller does in it
            // (a Refresh of the region included), so a cycle that ran after the region ended sees it (the region's end
            // is a release store of the epoch slot that the transition's scan reads with acquire).
            System.Threading.Volatile.Write(ref OpenVersion, version);
        }

        long serial = ++_lastSerial;
        _openSerials[count] = serial;
        _openCount = count + 1;
        return serial;
    }

    /// <summary>Whether the operation of <paramref name="serial"/> is still open (the innermost is looked at first).</summary>
    internal bool IsOpen(long serial)
    {
        for (int i = _openCount - 1; i >= 0; i--)
        {
            if (_openSerials[i] == serial)
            {
                return true;
            }
        }

        return false;
    }

    /// <summary>Forgets the open operation of <paramref name="serial"/> (nested operations may end in any order).</summary>
    /// <returns>False if it was not open (a stale copy).</returns>
    internal bool CloseOperation(long serial)
    {
        for (int i = _openCount - 1; i >= 0; i--)
        {
            if (_openSerials[i] == serial)
            {
                System.Array.Copy(_openSerials, i + 1, _openSerials, i, _openCount - i - 1);
                if (--_openCount == 0)
                {
                    if (AcrossHeaps.OpenIn == this)
                    {
                        AcrossHeaps.OpenIn = null;
                    }

                    // Volatile.Write: release; before the region's end (the caller leaves after this), as above.
                    System.Threading.Volatile.Write(ref OpenVersion, long.MaxValue);
                }

                return true;
            }
        }

        return false;
    }

    /// <summary>
    /// Before an operation allocates a block: room in every list one step of it appends to (at most a copy and an
    /// anti-payload written back, one retired block and one retired anti-payload), so that no append after the
    /// allocation can run out of memory. One did (a list's growth under memory pressure): the block stayed allocated,
    /// tracked by no list and never written, and recovery took it for a live payload of zeros, which made the structure
    /// unopenable (two payloads of one key, two queue elements with one sequence number).
    /// </summary>
    [System.Runtime.CompilerServices.MethodImpl(System.Runtime.CompilerServices.MethodImplOptions.AggressiveInlining)]
    internal void EnsureRoom(int slot)
    {
        WriteBack[slot].EnsureRoom(2);
        Retired[slot].EnsureRoom(1);
        AntiPayloads[slot].EnsureRoom(1);
        StrictPending.EnsureRoom(2);
    }

    /// <summary>Retires a replaced or deleted payload's block of <paramref name="bytes"/> (header included) in <paramref name="slot"/>.</summary>
    internal void Retire(int slot, long offset, long bytes)
    {
        Retired[slot].Add(offset, bytes);

        // Volatile.Write: one 64-bit store, also on a 32-bit runtime (other threads read the counter, see ReclaimBacklog).
        System.Threading.Volatile.Write(ref RetiredBytes, RetiredBytes + bytes);
    }

    /// <summary>Retires an anti-payload's block (a header only) in <paramref name="slot"/>.</summary>
    internal void RetireAntiPayload(int slot, long offset)
    {
        AntiPayloads[slot].Add(offset, HeapLayout.HeaderSize);
        System.Threading.Volatile.Write(ref RetiredBytes, RetiredBytes + HeapLayout.HeaderSize);
    }

    /// <summary>Whether the heap of these buffers was disposed (an operation left open in it then holds nothing back).</summary>
    internal bool IsHeapDisposed => System.Threading.Volatile.Read(ref _heapDisposed);

    private bool _heapDisposed;

    /// <summary>The heap of these buffers is closed (its Dispose, on any thread).</summary>
    internal void MarkHeapDisposed() => System.Threading.Volatile.Write(ref _heapDisposed, true);

    /// <summary>
    /// One thread's state across heaps: the buffers of the heap it has operations open in, if any (see
    /// <see cref="BufferedDurableHeap"/>'s Begin; operations of two heaps do not nest, so there is at most one). Written
    /// by that thread only.
    /// </summary>
    internal sealed class ThreadOperations
    {
        internal ThreadBuffers? OpenIn;
    }

    /// <summary>The calling thread's heap with operations open, if any and not disposed (a Sync of another heap there would wait on it).</summary>
    internal static bool InsideAnOperationOfALiveHeap(ThreadBuffers? except) =>
        t_thread?.OpenIn is { } open && open != except && !open.IsHeapDisposed;
}
