using System;
using System.Collections.Generic;
using System.Runtime.CompilerServices;
using System.Runtime.InteropServices;
using System.Runtime.Intrinsics.X86;
using System.Threading;
using System.Threading.Tasks;

namespace Epvs.Persistence;

/// <summary>
/// A recoverable allocator of payload blocks in a <see cref="HeapFile"/> (DESIGN §4, layer 3), in the style of
/// Ralloc: size classes in 64 KiB segments plus large blocks of whole segments; every free list and other piece of
/// metadata is transient and rebuilt when the heap opens by scanning the segment table and the block headers, so
/// allocation and free only store into the block's header; what the allocator writes back and fences itself is its own
/// bookkeeping (formatted segments, descriptors, and frees made durable, in batches, before their blocks are handed out
/// again). Persistent data refers to blocks by <see cref="PayloadRef"/>
/// offsets. The header layout and the order of its failure-atomic stores are documented in the repository, on the internal class HeapLayout.
/// </summary>
/// <remarks>
/// <para>Thread safety: every member may be called from any thread. Each thread allocates from and frees to its own
/// cache of blocks per size class; caches exchange batches of 32 blocks with a shared list per class under a lock,
/// and new segments are formatted under another lock. A block freed by one thread may be reused by another, once its
/// free is durable (see <see cref="Free(PayloadRef)"/>).</para>
/// <para>Durability: <see cref="Allocate(int, int, long, PayloadKind, long)"/> and <see cref="Free(PayloadRef)"/>
/// only store into the block's header (a free's block is handed out again only once the free is durable, which the
/// heap ensures in batches: see <see cref="Free(PayloadRef)"/>). A block is durable, with its payload, once <see cref="Persist(PayloadRef)"/> (or
/// <see cref="WriteBack(PayloadRef)"/> and then <see cref="Fence"/> on the same thread) returns; a free is durable once
/// <see cref="WriteBackHeader(PayloadRef)"/> and <see cref="Fence"/> return. After a crash, a block is either a
/// complete allocation (all four header words of one <c>Allocate</c>) or free; payload bytes of a block whose
/// persist had not completed may be partial — part 2's epoch tags decide which of those recovery keeps.</para>
/// <para>Limits of this version: a small-block segment keeps its size class while any of its blocks is allocated or
/// sits in another thread's cache; once the heap has no free segment left and cannot grow, segments whose blocks are
/// all free in the shared pool become free segments again (durably) for other sizes. The free blocks left in the cache
/// of a thread that has exited go back to the shared pools when a buffered heap's advancer runs, or when the heap has
/// no free segment left.</para>
/// </remarks>
public sealed unsafe partial class PersistentHeap : IDisposable, IAsyncDisposable
{
    private const int BatchSize = 32;
    private const int CacheCapacity = 2 * BatchSize;
    private const int UidBatch = 1024;

    private readonly HeapFile _file;
    private readonly bool _ownsFile;
    private readonly byte* _base;
    private readonly ulong* _table;
    private readonly long _dataStart;
    private readonly HeapFaults _faults;

    /// <summary>Whether formatting, frees and recovery's scrub write a block's empty mark into its Epoch word (always, but for the broken control <see cref="HeapFaults.LeaveEpochWordsUnmarked"/>).</summary>
    private readonly bool _marksEmptyEpochs;

    /// <summary>A buffered heap's sweep log (format 10; set by recovery): where its sweeps make their frees durable.</summary>
    private SweepLog? _sweepLog;

    /// <summary>The sweep log (a buffered heap's; null for a raw heap), for tests and the benchmark's counters.</summary>
    internal SweepLog? SweepLogForTesting => _sweepLog;

    /// <summary>See <see cref="PersistentHeapOptions.InFlightVersion"/>: the version recovery takes torn seals of for torn writes.</summary>
    private readonly long _inFlightVersion;

    /// <summary>Which heap kind uses this allocator: a <see cref="BufferedDurableHeap"/>'s refuses the public Dispose.</summary>
    private readonly long _ownerKind;
    private readonly ClassPool[] _pools;
    private readonly ThreadLocal<ThreadCache> _caches;

    /// <summary>Guards the changes of <see cref="_cacheList"/>.</summary>
    private readonly object _cachesGate = new();

    /// <summary>The cache of every thread that has allocated or freed here and not been found exited (copy-on-write under <see cref="_cachesGate"/>).</summary>
    private ThreadCache[] _cacheList = [];

    /// <summary>The live blocks and bytes counted by the caches of exited threads, forgotten since (see <see cref="ReleaseExitedThreadCaches"/>).</summary>
    private long _exitedLiveBlocks;
    private long _exitedLiveBytes;
    private long _nextUid;
    private int _disposed;

    /// <summary>
    /// 1 once Dispose has waited for the calls in flight (or, for a buffered heap's allocator, whose owner drained its
    /// operations first, once Dispose began): a block lookup after that throws (<see cref="Locate"/>). Unlike
    /// <see cref="_disposed"/>, set when Dispose begins and checked as a call enters, it lets a call that entered before
    /// Dispose complete.
    /// </summary>
    private int _closed;

    /// <summary>Makes every Dispose return only once the first one has closed the heap.</summary>
    private readonly DisposalGate _disposal = new();

    /// <summary>Opens the allocator on a heap file, rebuilding its free lists by a (parallel) scan of the blocks.</summary>
    /// <param name="file">The heap file; not disposed with the heap.</param>
    /// <param name="options">Recovery options; null for the defaults.</param>
    /// <exception cref="ArgumentOutOfRangeException">An option is out of range (<see cref="PersistentHeapOptions.RecoveryParallelism"/> below 1).</exception>
    public PersistentHeap(HeapFile file, PersistentHeapOptions? options = null)
        : this(file, PersistentHeapOptions.Validated(options), ownsFile: false)
    {
    }

    private PersistentHeap(HeapFile file, PersistentHeapOptions? options, bool ownsFile)
    {
        ArgumentNullException.ThrowIfNull(file);
        options ??= new PersistentHeapOptions();
        _file = file;
        _ownsFile = ownsFile;
        _base = file.Pointer;
        _table = (ulong*)(_base + HeapLayout.SuperblockSize);
        _dataStart = file.DataStart;
        _faults = options.Faults;
        _marksEmptyEpochs = (_faults & HeapFaults.LeaveEpochWordsUnmarked) == 0;
        _inFlightVersion = options.InFlightVersion;
        _ownerKind = options.OwnerKind;
        _keepsDeleteReserve = options.KeepsDeleteReserve;
        _pools = new ClassPool[SizeClasses.Count];
        for (int i = 0; i < _pools.Length; i++)
        {
            _pools[i] = new ClassPool();
        }

        // Not trackAllValues: a ThreadLocal keeps every tracked value of an exited thread for ever (about 16 KiB each, with
        // the free blocks in it); the heap keeps its own list and forgets the exited threads' caches.
        _caches = new ThreadLocal<ThreadCache>(CreateCache);
        _segmentFree = new bool[file.SegmentCount];

        // One heap per file (two would hand out the same blocks); the file's public Dispose refuses until this one's.
        file.AttachHeap(this);
        try
        {
            // Before recovery writes anything: a file of the other heap kind is refused, a new one is claimed.
            _firstOpen = file.ClaimKind(options.OwnerKind);
            RecoveryStatistics = Recover(options);

            // A buffered heap's recovery frees superseded and cancelled payloads after this constructor: it designates
            // the reserve itself once they are free (the former reserve's anti-payloads among them).
            if (_ownerKind != HeapLayout.KindBufferedDurable)
            {
                DesignateReserveAfterRecovery();
            }
        }
        catch
        {
            // A refused or failed recovery closes nothing in order, whoever owns the file: its Dispose must not mark the
            // shutdown clean (a crashed file refused as damaged used to read as cleanly closed once a caller that opened
            // it disposed it).
            file.ForgoCleanShutdown();
            file.DetachHeap(this, operationsDrained: true, fileClosesNext: false);
            _caches.Dispose();
            throw;
        }
    }

    /// <summary>The heap file underneath: superblock words (roots, epoch clock) and the persistence domain.</summary>
    public HeapFile File => _file;

    /// <summary>The accounting found by the recovery scan when the heap opened.</summary>
    public HeapStatistics RecoveryStatistics { get; }

    /// <summary>
    /// The largest payload a block can hold: an upper bound. A payload that large needs the whole heap's segments; on a
    /// buffered heap (Buffered or Strict mode) that cannot grow (at its maximum size, or the libpmem domain) one segment
    /// is held back for deletes' anti-payloads, so the largest that fits there is a segment's worth less.
    /// </summary>
    public int MaxPayloadSize => (int)Math.Min(int.MaxValue - HeapLayout.SegmentSize, (_file.MaxSegments * HeapLayout.SegmentSize) - HeapLayout.HeaderSize);

    /// <summary>Creates a heap file and opens the allocator on it; disposing the heap disposes the file.</summary>
    /// <param name="path">Where to create the file (it must not exist).</param>
    /// <param name="options">Size and domain; null for the defaults.</param>
    /// <returns>The empty heap.</returns>
    /// <exception cref="HeapFileException">See <see cref="HeapFile.Create(string, HeapFileOptions?)"/>.</exception>
    public static PersistentHeap Create(string path, HeapFileOptions? options = null)
    {
        HeapFile file = HeapFile.Create(path, options);
        return OwnFile(file, null);
    }

    /// <summary>Opens an existing heap file and recovers the allocator; disposing the heap disposes the file.</summary>
    /// <param name="path">The heap file.</param>
    /// <param name="options">Which domain to map it with; null for the defaults.</param>
    /// <param name="heapOptions">Recovery options; null for the defaults.</param>
    /// <returns>The recovered heap.</returns>
    /// <exception cref="System.IO.FileNotFoundException">There is no file at <paramref name="path"/> (see <see cref="HeapFile.Open(string, HeapFileOptions?)"/>).</exception>
    /// <exception cref="HeapFileException">See <see cref="HeapFile.Open(string, HeapFileOptions?)"/>.</exception>
    /// <exception cref="System.IO.IOException">The file could not be opened for another reason (see <see cref="HeapFile.Open(string, HeapFileOptions?)"/>).</exception>
    /// <exception cref="ArgumentOutOfRangeException">A recovery option is out of range (<see cref="PersistentHeapOptions.RecoveryParallelism"/> below 1); the file is not opened.</exception>
    public static PersistentHeap Open(string path, HeapFileOptions? options = null, PersistentHeapOptions? heapOptions = null)
    {
        PersistentHeapOptions.Validated(heapOptions);
        HeapFile file = HeapFile.Open(path, options, HeapLayout.KindRaw);
        return OwnFile(file, heapOptions);
    }

    /// <summary>
    /// Allocates a block for a payload of <paramref name="size"/> bytes and writes its header (no write-back, no fence).
    /// The payload bytes are not cleared.
    /// </summary>
    /// <param name="size">Payload size in bytes, 0 to <see cref="MaxPayloadSize"/>.</param>
    /// <param name="typeId">An application-defined type id stored in the header.</param>
    /// <param name="epochTag">The EPVS version the payload belongs to (0 when not using epochs).</param>
    /// <param name="kind">Alloc, update or delete (anti-payload).</param>
    /// <param name="uid">The payload's logical identity; 0 draws a new one (see <see cref="NewUid"/>). Otherwise a uid
    /// <see cref="NewUid"/> returned, or one of a block of this heap (an update of it): a uid made up by the caller may
    /// equal one that <see cref="NewUid"/> hands out later. Negative uids are refused.</param>
    /// <returns>The block.</returns>
    /// <exception cref="InsufficientMemoryException">No free block fits and the heap cannot grow.</exception>
    /// <exception cref="ArgumentOutOfRangeException"><paramref name="size"/>, <paramref name="kind"/> or <paramref name="uid"/> (negative) is out of range.</exception>
    /// <exception cref="InvalidOperationException">This is a <see cref="BufferedDurableHeap"/>'s allocator: allocate through <see cref="BufferedDurableHeap.BeginOperation"/>. Or <paramref name="uid"/> is 0 and the uids are exhausted (see <see cref="NewUid"/>).</exception>
    public PayloadRef Allocate(int size, int typeId, long epochTag = 0, PayloadKind kind = PayloadKind.Alloc, long uid = 0)
    {
        ThrowIfBufferedHeapsAllocator(nameof(Allocate));
        return AllocateForOwner(size, typeId, epochTag, kind, uid);
    }

    /// <summary><see cref="Allocate(int, int, long, PayloadKind, long)"/> for the <see cref="BufferedDurableHeap"/> that owns this allocator (its operations track the block).</summary>
    internal PayloadRef AllocateForOwner(int size, int typeId, long epochTag, PayloadKind kind, long uid)
    {
        if (!TryAllocateChecked(size, typeId, out PayloadRef block, epochTag, kind, uid))
        {
            ThrowHeapFull(size, kind);
        }

        return block;
    }

    /// <summary>
    /// Throws the heap-full error for a payload of <paramref name="size"/> bytes of <paramref name="kind"/>, with the
    /// advice that can help this heap: a larger maximum size where the domain could grow to it, a larger size at
    /// creation where the domain cannot grow (libpmem), and for an anti-payload, a Sync that reclaims the deletes that hold
    /// the delete reserve.
    /// </summary>
    [System.Diagnostics.CodeAnalysis.DoesNotReturn]
    private void ThrowHeapFull(int size, PayloadKind kind)
    {
        long segments = _file.SegmentCount;
        long maxBytes = _file.DataStart + (_file.MaxSegments * HeapLayout.SegmentSize);
        PersistenceDomain domain = _file.Domain;
        string why;
        long needed = (HeapLayout.HeaderSize + (long)size + HeapLayout.SegmentSize - 1) / HeapLayout.SegmentSize;
        if (_file.OpenMaxSize != 0 && domain.Kind != PersistenceDomainKind.Pmem && _file.DataStart + ((segments + (needed > 1 ? needed : 1)) * HeapLayout.SegmentSize) > _file.OpenMaxSize && segments < _file.MaxSegments)
        {
            why = $"it is at the size this open allows ({_file.OpenMaxSize} bytes: the HeapFileOptions.MaxSize it was opened with, or the heap's size if that was smaller; the file's maximum is {maxBytes} bytes); free blocks, or reopen it with a larger HeapFileOptions.MaxSize (0 for the file's maximum)";
        }
        else if (domain.Kind == PersistenceDomainKind.Pmem || domain.Capacity < Math.Min(maxBytes, _file.DataStart + ((segments + 1) * HeapLayout.SegmentSize)))
        {
            why = $"its persistence domain ({domain.Kind}) cannot grow the file beyond {domain.Length} bytes (the libpmem domain never grows a heap file, whatever its maximum size); free blocks, or create the heap with a larger HeapFileOptions.Size";
            if (segments < _file.MaxSegments)
            {
                why += $", or open it with PersistenceDomainKind.MappedFile, which grows it up to the maximum size fixed at its creation ({maxBytes} bytes)";
            }
        }
        else if (segments >= _file.MaxSegments)
        {
            why = $"it is at its maximum size ({maxBytes} bytes); free blocks, or create the heap with a larger HeapFileOptions.MaxSize";
        }
        else
        {
            why = "the file could not grow (the file system may be out of space, or the file size limit reached); free blocks, or free space on the file system";
        }

        long span = (HeapLayout.HeaderSize + (long)size + HeapLayout.SegmentSize - 1) / HeapLayout.SegmentSize;
        if (span > 1)
        {
            // A large payload needs contiguous segments: say so when enough are free in total, or "free blocks" misleads.
            long free = 0, longest = 0;
            using (InterruptShield.Hold(_segmentGate))
            {
                for (long s = 0, run = 0; s < _segmentFree.Length; s++)
                {
                    run = _segmentFree[s] ? run + 1 : 0;
                    free += _segmentFree[s] ? 1 : 0;
                    longest = Math.Max(longest, run);
                }
            }

            if (free >= span)
            {
                why = $"it needs {span} contiguous free segments of {HeapLayout.SegmentSize} bytes, and {free} are free but at most {longest} of them contiguous (the free space is fragmented); " + why;
            }
        }

        bool reserveApplies;
        using (InterruptShield.Hold(_segmentGate))
        {
            // Only a reserve that exists: a designated segment, or a free segment that ordinary allocations leave.
            reserveApplies = _reserveSegment >= 0 || (ReservedSegmentsLocked(antiPayload: false) != 0 && _freeSegmentCount > 0);
        }

        string reserve = !reserveApplies
            ? string.Empty
            : kind == PayloadKind.Delete && (uint)size <= (uint)SizeClasses.BlockSizes[AntiPayloadClass] - HeapLayout.HeaderSize
                ? " Deletes' anti-payloads have a reserve of their own (a segment's worth, which other allocations leave free), and it is taken by deletes not reclaimed yet: they are reclaimed two versions after the delete (a Sync, or the advancer's next cycles), which refills it."
                : " (The heap's last free segment is kept for deletes' anti-payloads, so that deleting still makes room.)";
        ThrowHelper.ThrowHeapFull(size, why, reserve);
    }

    /// <summary>
    /// A buffered heap's allocator refuses the public allocation and free: a block allocated here is in no operation, so
    /// no cycle writes it back and recovery drops it (it has no version); a block freed here may be one a structure
    /// holds, which the next operation would hand out again under another key.
    /// </summary>
    private void ThrowIfBufferedHeapsAllocator(string call)
    {
        if (_ownerKind == HeapLayout.KindBufferedDurable)
        {
            ThrowHelper.ThrowInvalidOperation($"PersistentHeap.{call} on a BufferedDurableHeap's allocator: its blocks belong to the buffered heap's operations (a block allocated here would never be written back and recovery would drop it; a block freed here may be one a structure still holds). Use BufferedDurableHeap.BeginOperation and DurableOperation.Allocate, Replace and Delete.");
        }
    }

    /// <summary>Like <see cref="Allocate(int, int, long, PayloadKind, long)"/>, but returns <see langword="false"/> instead of throwing when the heap is full.</summary>
    /// <param name="size">Payload size in bytes, 0 to <see cref="MaxPayloadSize"/>.</param>
    /// <param name="typeId">An application-defined type id stored in the header.</param>
    /// <param name="block">The block, or null when the heap is full.</param>
    /// <param name="epochTag">The EPVS version the payload belongs to.</param>
    /// <param name="kind">Alloc, update or delete (anti-payload).</param>
    /// <param name="uid">The payload's logical identity; 0 draws a new one (see the same parameter of <see cref="Allocate(int, int, long, PayloadKind, long)"/>).</param>
    /// <returns>Whether a block was allocated.</returns>
    /// <exception cref="ArgumentOutOfRangeException"><paramref name="size"/>, <paramref name="kind"/> or <paramref name="uid"/> (negative) is out of range.</exception>
    /// <exception cref="InvalidOperationException">This is a <see cref="BufferedDurableHeap"/>'s allocator: allocate through <see cref="BufferedDurableHeap.BeginOperation"/>. Or <paramref name="uid"/> is 0 and the uids are exhausted (see <see cref="NewUid"/>).</exception>
    public bool TryAllocate(int size, int typeId, out PayloadRef block, long epochTag = 0, PayloadKind kind = PayloadKind.Alloc, long uid = 0)
    {
        ThrowIfBufferedHeapsAllocator(nameof(TryAllocate));
        return TryAllocateChecked(size, typeId, out block, epochTag, kind, uid);
    }

    private bool TryAllocateChecked(int size, int typeId, out PayloadRef block, long epochTag, PayloadKind kind, long uid)
    {
        if ((uint)(kind - PayloadKind.Alloc) > PayloadKind.Delete - PayloadKind.Alloc)
        {
            ThrowHelper.ThrowArgumentOutOfRange(nameof(kind), $"{kind} is not a payload kind.");
        }

        if (uid < 0)
        {
            // A negative uid persisted, and recovery resumes drawing uids above the largest one it finds.
            ThrowHelper.ThrowArgumentOutOfRange(nameof(uid), $"A uid is 0 (draw a new one) or positive, not {uid}.");
        }

        EnterCall();
        try
        {
            return TryAllocateCore(_caches.Value!, size, typeId, out block, epochTag, kind, uid);
        }
        finally
        {
            _file.ExitOperation();
        }
    }

    /// <summary>
    /// <see cref="Allocate(int, int, long, PayloadKind, long)"/> for a <see cref="BufferedDurableHeap"/> operation
    /// (internal callers pass a valid kind): no file epoch entry, because the operation's EPVS region already keeps
    /// the mapping alive (<see cref="BufferedDurableHeap.Dispose"/> waits for every operation before it disposes the
    /// allocator and the file), and no thread-local lookup: <paramref name="cache"/> is the calling thread's
    /// (<see cref="CurrentThreadCache"/>, kept by the caller).
    /// </summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    internal PayloadRef AllocateInOperation(ThreadCache cache, int size, int typeId, long epochTag, PayloadKind kind, long uid)
    {
        if (!TryAllocateCore(cache, size, typeId, out PayloadRef block, epochTag, kind, uid))
        {
            ThrowHeapFull(size, kind);
        }

        return block;
    }

    /// <summary>The calling thread's allocation cache (for <see cref="AllocateInOperation"/>; use it on this thread only).</summary>
    internal ThreadCache CurrentThreadCache => _caches.Value!;

    private bool TryAllocateCore(ThreadCache cache, int size, int typeId, out PayloadRef block, long epochTag, PayloadKind kind, long uid)
    {
        if (uid == 0)
        {
            uid = cache.NextUid(ref _nextUid);
        }

        if ((uint)size > SizeClasses.MaxSmallPayload)
        {
            return TryAllocateLarge(size, typeId, epochTag, kind, uid, cache, out block);
        }

        int cls = SizeClasses.ForPayload(size);
        bool antiPayload = IsAntiPayload(kind, cls);
        long offset;
        while (true)
        {
            if (cache.Counts[cls] == 0 && !TryRefill(cache, cls, antiPayload))
            {
                block = default;
                return false;
            }

            offset = cache.Blocks[cls][--cache.Counts[cls]];

            // A block of the delete reserve's segment is for anti-payloads only: any other allocation sets it aside
            // and takes the next (see PersistentHeap.DeleteReserve.cs). One compare for every other class.
            if (cls != AntiPayloadClass || antiPayload || !InReserve(offset))
            {
                break;
            }

            SetAside(offset);
        }
        WriteHeader(offset, uid, epochTag, HeapLayout.Shape(size, typeId), kind);
        cache.LiveBlocks++;
        cache.LiveBytes += SizeClasses.BlockSizes[cls];
        block = new PayloadRef(offset);
        return true;
    }

    /// <summary>
    /// Frees a block: one store of the header's commit word, durable once <see cref="WriteBackHeader(PayloadRef)"/> and
    /// <see cref="Fence"/> return (or once the heap makes it durable itself, below; a crash before that may undo the free).
    /// A small block is handed out again only once its free is durable: the thread holds it until its next
    /// <see cref="Fence"/> (which writes the held frees back first), or until it has held 64, or needs a block of the
    /// class (the heap then writes them back and fences itself).
    /// </summary>
    /// <remarks>
    /// Handed out at once, the block's next allocation could reach the medium before the free: after a crash, recovery
    /// read the freed payload's durable header over the next payload's bytes, a block whose persist had completed,
    /// with bytes it never had (the raw heap checks headers, not payloads). A large block's free is durable at once
    /// (its segments' descriptors are persisted).
    /// </remarks>
    /// <param name="block">A block returned by <c>Allocate</c> and not freed since.</param>
    /// <exception cref="InvalidOperationException">The block is not allocated (double free, or not a block of this heap);
    /// or this is a <see cref="BufferedDurableHeap"/>'s allocator (delete through <see cref="DurableOperation.Delete(PayloadRef)"/>).</exception>
    /// <exception cref="System.IO.IOException">Making the held frees durable failed (the 64th free held: a write-back or
    /// fence error; the persistence domain then fails every later write-back). The block is freed: do not free it again.</exception>
    /// <exception cref="ObjectDisposedException">The heap was disposed (before the block was freed, or while the held frees
    /// were made durable).</exception>
    public void Free(PayloadRef block)
    {
        ThrowIfBufferedHeapsAllocator(nameof(Free));
        EnterCall();
        try
        {
            (long segment, ulong descriptor) = MarkFreeCore(block);
            if (HeapLayout.DescriptorRole(descriptor) == HeapLayout.RoleLargeStart || (_faults & HeapFaults.ReuseRawFreesAtOnce) != 0)
            {
                ReleaseCore(block, segment, descriptor);
                return;
            }

            ThreadCache cache = _caches.Value!;
            int cls = (int)HeapLayout.DescriptorPayload(descriptor);
            cache.LiveBlocks--;
            cache.LiveBytes -= SizeClasses.BlockSizes[cls];
            cache.Held.Add(block.Offset);
            cache.HeldBytes += SizeClasses.BlockSizes[cls];
            if (cache.Held.Count >= HeldFreesLimit)
            {
                ReleaseHeldFrees(cache);
            }
        }
        finally
        {
            _file.ExitOperation();
        }
    }

    /// <summary>How many small blocks a thread holds after <see cref="Free(PayloadRef)"/> before the heap makes their frees durable itself.</summary>
    private const int HeldFreesLimit = 64;

    /// <summary>
    /// Makes the frees <paramref name="cache"/> holds durable (their headers written back, one fence) and hands the
    /// blocks out: into the thread's cache, or the shared pools.
    /// </summary>
    private void ReleaseHeldFrees(ThreadCache cache)
    {
        if (cache.Held.Count == 0)
        {
            return;
        }

        // The frees are marked: an interrupt between the fence and the hand-out would lose the blocks until the next open.
        using InterruptShield.Scope shield = InterruptShield.Enter();
        WriteBackRuns.WriteBackHeadersAndFence(_file.Domain, CollectionsMarshal.AsSpan(cache.Held));
        foreach (long offset in cache.Held)
        {
            (_, ulong descriptor) = Locate(new PayloadRef(offset));
            HandOut(cache, (int)HeapLayout.DescriptorPayload(descriptor), offset);
        }

        cache.Held.Clear();
        cache.HeldBytes = 0;
    }

    /// <summary><see cref="Free(PayloadRef)"/> for the <see cref="BufferedDurableHeap"/> that owns this allocator (reclamation, recovery, an undone copy).</summary>
    internal void FreeForOwner(PayloadRef block)
    {
        _file.EnterOperation();
        try
        {
            FreeCore(block);
        }
        finally
        {
            _file.ExitOperation();
        }
    }

    private void FreeCore(PayloadRef block)
    {
        (long segment, ulong descriptor) = MarkFreeCore(block);
        ReleaseCore(block, segment, descriptor);
    }

    /// <summary>
    /// The first half of a free: the commit word becomes free (one store, not written back); the block is not handed
    /// out until <see cref="ReleaseFreed(PayloadRef)"/>. A caller that writes the free back and fences in between
    /// guarantees that no reuse of the block can reach the file before its free does — what a sealed block needs, or a
    /// crash could leave its old seal over new bytes, which recovery would report as damage.
    /// </summary>
    internal void MarkFree(PayloadRef block)
    {
        _file.EnterOperation();
        try
        {
            MarkFreeCore(block);
        }
        finally
        {
            _file.ExitOperation();
        }
    }

    /// <summary>The second half of a free (see <see cref="MarkFree(PayloadRef)"/>): hands the block out again.</summary>
    internal void ReleaseFreed(PayloadRef block)
    {
        _file.EnterOperation();
        try
        {
            (long segment, ulong descriptor) = Locate(block);
            ReleaseCore(block, segment, descriptor);
        }
        finally
        {
            _file.ExitOperation();
        }
    }

    private (long Segment, ulong Descriptor) MarkFreeCore(PayloadRef block) => MarkFreeCore(block, out _);

    /// <summary>Marks <paramref name="block"/> free in the working image; <paramref name="commit"/> receives the commit word it replaced.</summary>
    private (long Segment, ulong Descriptor) MarkFreeCore(PayloadRef block, out ulong commit)
    {
        (long segment, ulong descriptor) = Locate(block);
        ulong* commitWord = (ulong*)(_base + block.Offset + HeapLayout.CommitOffset);
        // Volatile.Read: acquire; pairs with the release store of the commit word in WriteHeader.
        commit = Volatile.Read(ref *commitWord);
        if (!HeapLayout.InUse(commit))
        {
            ThrowHelper.ThrowInvalidPayloadRef(block, "it is already free (double free?)");
        }

        // The free word is checked too (offset and generation, the same kind of hash as an allocation's).
        // Interlocked.CompareExchange: full fence; of two threads freeing the same block exactly one succeeds, so a
        // double free is reported instead of putting the block on two free lists.
        if (Interlocked.CompareExchange(ref *commitWord, HeapLayout.FreeWord(block.Offset, HeapLayout.DescriptorGeneration(descriptor)), commit) != commit)
        {
            ThrowHelper.ThrowInvalidPayloadRef(block, "another thread freed it concurrently (double free)");
        }

        // After the free word (a failed double free leaves a live block alone).
        MarkEpochWordEmpty(block.Offset);
        return (segment, descriptor);
    }

    /// <summary>
    /// The second store of a free: the block's empty mark into its Epoch word, in the same header as the free word just
    /// stored, so the free's own write-back makes both durable before the block is handed out again, in either order — a
    /// crash can leave the mark without the free word, which recovery takes for a free it interrupted (see
    /// <see cref="HeapLayout"/>, sealing). The broken control leaves the word as it was.
    /// </summary>
    private void MarkEpochWordEmpty(long offset)
    {
        if (_marksEmptyEpochs)
        {
            *(ulong*)(_base + offset + HeapLayout.EpochOffset) = HeapLayout.EmptyEpoch(offset);
        }
    }

    /// <summary>The Epoch word a formatted block gets: its empty mark (0, format 6's, with the broken control).</summary>
    private ulong FormattedEpochWord(long offset) => _marksEmptyEpochs ? HeapLayout.EmptyEpoch(offset) : 0;

    private void ReleaseCore(PayloadRef block, long segment, ulong descriptor)
    {
        ThreadCache cache = _caches.Value!;
        if (HeapLayout.DescriptorRole(descriptor) == HeapLayout.RoleLargeStart)
        {
            FreeLarge(segment, descriptor, cache);
            return;
        }

        int cls = (int)HeapLayout.DescriptorPayload(descriptor);
        cache.LiveBlocks--;
        cache.LiveBytes -= SizeClasses.BlockSizes[cls];
        HandOut(cache, cls, block.Offset);
    }

    /// <summary>Puts a free small block of class <paramref name="cls"/> into <paramref name="cache"/> (spilling a batch to the pool when full).</summary>
    private void HandOut(ThreadCache cache, int cls, long offset)
    {
        if (cache.Counts[cls] == CacheCapacity)
        {
            Spill(cache, cls);
        }

        cache.Blocks[cls][cache.Counts[cls]++] = offset;
    }

    /// <summary>
    /// Seals each block of <paramref name="offsets"/> that is an allocated (unsealed) block of
    /// <paramref name="version"/>: its commit word gets a check over header and payload (not written back: the caller
    /// writes the commit words back). Call only once no thread writes the version's blocks any more (after the version's
    /// quiescent cut).
    /// </summary>
    /// <remarks>
    /// In batches, two passes each: the first reads and checks every block of the batch and computes its sealed commit
    /// word, with no fence between blocks and the blocks a few places ahead prefetched, so the cache misses of many
    /// blocks overlap; the second installs the words with plain (release) stores, each only over the word the first
    /// pass read (on lines now cached). A compare-and-swap per block (a locked instruction, which waits for the line's
    /// ownership and drains the stores before it) took a quarter more of the seal's time and guarded against nothing:
    /// no other thread writes a version's commit words after its cut.
    /// </remarks>
    internal void Seal(ReadOnlySpan<long> offsets, long version)
    {
        const int SealBatch = 64;
        Span<ulong> expected = stackalloc ulong[SealBatch];
        Span<ulong> sealedCommits = stackalloc ulong[SealBatch];
        for (int start = 0; start < offsets.Length; start += SealBatch)
        {
            int count = Math.Min(SealBatch, offsets.Length - start);
            for (int i = 0; i < count; i++)
            {
                if (start + i + PrefetchDistance < offsets.Length)
                {
                    Prefetch(_base + offsets[start + i + PrefetchDistance]);
                }

                sealedCommits[i] = SealedCommitOf(offsets[start + i], version, out expected[i]);
            }

            for (int i = 0; i < count; i++)
            {
                if (sealedCommits[i] != 0)
                {
                    ulong* h = (ulong*)(_base + offsets[start + i]);

                    // Volatile.Write: a release store, a plain move on x64 (no locked instruction: the stores of a
                    // batch overlap their misses; the caller's write-back and fence order them before the frontier),
                    // and whole where a ulong store could tear (readers on other threads read the word with
                    // Volatile.Read). Only over the commit word the first pass read. Nothing else writes it now: a
                    // version's blocks are sealed in its own cycle, before any cycle can park or free them (the sweeps
                    // that mark blocks free run after the parking, which follows).
                    if (h[3] == expected[i])
                    {
                        Volatile.Write(ref h[3], sealedCommits[i]);
                    }
                }
            }
        }
    }

    /// <summary>
    /// A buffered heap's cycle, in its fence (the caller fences): writes back the sweep log's mark, where its batches
    /// end now, so that recovery after a crash tells damage to them from their end (see <see cref="SweepLog.WriteBackMark"/>).
    /// </summary>
    internal void WriteBackSweepLogMark()
    {
        if ((_faults & HeapFaults.SweepLogWithoutMarks) == 0)
        {
            _sweepLog?.WriteBackMark();
        }
    }

    /// <summary>
    /// Recovery of a buffered heap: seals each block of <paramref name="offsets"/> that is still allocated and unsealed,
    /// with its own epoch tag, then writes back and fences the commit words. For blocks the durable frontier covers and
    /// the scan checked: their bytes are the file's, so the seal covers what is durable. May reorder <paramref name="offsets"/>.
    /// </summary>
    /// <returns>How many blocks it sealed.</returns>
    internal int SealRecovered(Span<long> offsets)
    {
        int sealedCount = 0;
        foreach (long offset in offsets)
        {
            ulong* h = (ulong*)(_base + offset);
            ulong sealedCommit = SealedCommitOf(offset, (long)h[1], out ulong commit);
            if (sealedCommit != 0)
            {
                // Interlocked.CompareExchange: no other thread runs during recovery; the compare keeps Seal's invariant.
                if (Interlocked.CompareExchange(ref h[3], sealedCommit, commit) == commit)
                {
                    sealedCount++;
                }
            }
        }

        WriteBackRuns.WriteBackHeadersAndFence(_file.Domain, offsets);
        return sealedCount;
    }

    /// <summary>The sealed commit word of the block at <paramref name="offset"/>, or 0 when it is not an allocated, unsealed block of <paramref name="version"/>.</summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    private ulong SealedCommitOf(long offset, long version, out ulong commit)
    {
        ulong* h = (ulong*)(_base + offset);
        // Volatile.Read: acquire; pairs with the release store of the commit word in WriteHeader, so the epoch word read
        // next is the one of this allocation (a block freed and reused by a later version is recognised and skipped).
        commit = Volatile.Read(ref h[3]);
        if (!HeapLayout.InUse(commit) || HeapLayout.CommitState(commit) != HeapLayout.StateAllocated || (long)h[1] != version)
        {
            return 0;
        }

        uint generation = HeapLayout.DescriptorGeneration(_table[SegmentOf(offset)]);
        var payload = new ReadOnlySpan<byte>(h + 4, HeapLayout.ShapeSize(h[2]));
        return HeapLayout.SealedCommit(h[0], h[1], h[2], offset, generation, HeapLayout.CommitKind(commit), payload);
    }

    /// <summary>How many blocks ahead a pass over many blocks prefetches: enough for several misses to overlap.</summary>
    private const int PrefetchDistance = 8;

    /// <summary>A hint to bring the line at <paramref name="address"/> into the cache (x86; nothing elsewhere). Never faults.</summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    private static void Prefetch(byte* address)
    {
        if (Sse.IsSupported)
        {
            Sse.Prefetch0(address);
        }
    }

    /// <summary>Reads a block's header.</summary>
    /// <exception cref="InvalidOperationException">The block is not allocated.</exception>
    public PayloadHeader GetHeader(PayloadRef block)
    {
        EnterCall();
        try
        {
            return GetHeaderCore(block);
        }
        finally
        {
            _file.ExitOperation();
        }
    }

    /// <summary>Whether <paramref name="block"/>'s header is a valid allocation (as <see cref="GetHeader"/> checks) of a payload tagged <paramref name="tag"/>, without throwing.</summary>
    internal bool HoldsPayloadTagged(PayloadRef block, long tag)
    {
        (_, ulong descriptor) = Locate(block);
        ulong* h = (ulong*)(_base + block.Offset);
        // Volatile.Read: acquire, as in GetHeaderCore.
        ulong commit = Volatile.Read(ref h[3]);
        return HeapLayout.IsValidAllocated(h[0], h[1], h[2], commit, block.Offset, HeapLayout.DescriptorGeneration(descriptor)) && (long)h[1] == tag;
    }

    private PayloadHeader GetHeaderCore(PayloadRef block)
    {
        (_, ulong descriptor) = Locate(block);
        ulong* h = (ulong*)(_base + block.Offset);
        // Volatile.Read: acquire; pairs with the release store of the commit word in WriteHeader.
        ulong commit = Volatile.Read(ref h[3]);
        if (!HeapLayout.IsValidAllocated(h[0], h[1], h[2], commit, block.Offset, HeapLayout.DescriptorGeneration(descriptor)))
        {
            ThrowHelper.ThrowInvalidPayloadRef(block, "its header is not a valid allocation");
        }

        return new PayloadHeader((long)h[0], (long)h[1], HeapLayout.CommitKind(commit), HeapLayout.ShapeSize(h[2]), HeapLayout.ShapeTypeId(h[2]));
    }

    /// <summary>
    /// The block's payload bytes (as many as the size given to <c>Allocate</c>). Valid until the block is freed, and while
    /// the heap is open and reachable: a span does not keep the heap alive, and a heap never disposed that becomes garbage
    /// is unmapped when it is collected (keep a reference to it, or <see cref="GC.KeepAlive(object)"/>, while you use the span).
    /// </summary>
    /// <exception cref="InvalidOperationException">The block is not allocated.</exception>
    public Span<byte> GetPayload(PayloadRef block) => new(PayloadPointer(block, out int size), size);

    /// <summary>The address of the block's payload, for unsafe code. Valid until the block is freed, and while the heap is open and reachable (see <see cref="GetPayload"/>).</summary>
    /// <exception cref="InvalidOperationException">The block is not allocated.</exception>
    public IntPtr GetPayloadAddress(PayloadRef block) => (IntPtr)PayloadPointer(block, out _);

    /// <summary>Writes back the block's header and payload (not durable until <see cref="Fence"/>).</summary>
    /// <exception cref="InvalidOperationException">The block is not allocated.</exception>
    public void WriteBack(PayloadRef block)
    {
        EnterCall();
        try
        {
            PayloadPointerCore(block, out int size);
            _file.Domain.WriteBackOwned(block.Offset, HeapLayout.HeaderSize + (long)size);
        }
        finally
        {
            _file.ExitOperation();
        }
    }

    /// <summary>
    /// Writes back only the block's 32-byte header (not durable until <see cref="Fence"/>), typically after
    /// <see cref="Free(PayloadRef)"/>, so it accepts blocks that are no longer allocated. (Freeing a large block is
    /// durable already: its segment descriptors are persisted.)
    /// </summary>
    /// <exception cref="InvalidOperationException">The reference is outside the heap's segments, not 16-byte aligned (every block size is a multiple of 16), or too close to its segment's end for a header.</exception>
    public void WriteBackHeader(PayloadRef block)
    {
        ThrowIfDisposed();
        long relative = block.Offset - _dataStart;

        // Volatile.Read: acquire; pairs with the release in TryGrowLocked.
        // (Within a segment of 48-byte blocks the last 16 bytes hold no block: a header there would end past the segment,
        // past the mapping for the last one.)
        if (relative < 0 || relative % SizeClasses.Alignment != 0 || relative % HeapLayout.SegmentSize > HeapLayout.SegmentSize - HeapLayout.HeaderSize || relative / HeapLayout.SegmentSize >= Volatile.Read(ref _segmentCount))
        {
            ThrowHelper.ThrowInvalidPayloadRef(block, "the offset is not a block position of this heap");
        }

        EnterCall();
        try
        {
            _file.Domain.WriteBackOwned(block.Offset, HeapLayout.HeaderSize);
        }
        finally
        {
            _file.ExitOperation();
        }
    }

    /// <summary>Waits until everything the calling thread wrote back is durable.</summary>
    /// <exception cref="ObjectDisposedException">The heap file was disposed.</exception>
    /// <exception cref="System.Threading.ThreadInterruptedException">The calling thread was interrupted while the fence waited
    /// for another thread's (through the page cache, fences take turns): nothing is lost, what it covers is not known to
    /// be durable yet; call it again.</exception>
    public void Fence()
    {
        EnterCall();
        try
        {
            // The frees this thread holds (see Free) are written back under the same fence, then handed out.
            ThreadCache? cache = _caches.IsValueCreated ? _caches.Value : null;
            if (cache is not null && cache.Held.Count != 0)
            {
                ReleaseHeldFrees(cache);
                return;
            }

            _file.Domain.FenceOwned();
        }
        finally
        {
            _file.ExitOperation();
        }
    }

    /// <summary>Writes back the block's header and payload and fences: on return the block and its payload are durable.</summary>
    /// <exception cref="InvalidOperationException">The block is not allocated.</exception>
    /// <exception cref="System.Threading.ThreadInterruptedException">As for <see cref="Fence"/>: the block is not known to be durable yet; persist it again.</exception>
    public void Persist(PayloadRef block)
    {
        EnterCall();
        try
        {
            PayloadPointerCore(block, out int size);
            _file.Domain.PersistOwned(block.Offset, HeapLayout.HeaderSize + (long)size);
        }
        finally
        {
            _file.ExitOperation();
        }
    }

    /// <summary>
    /// Draws a new payload uid: unique among the uids this method returns and those of the blocks recovery found (it
    /// resumes above the largest); a uid a caller made up for <see cref="Allocate(int, int, long, PayloadKind, long)"/>
    /// in this session may come back. Each thread reserves uids in batches, so uids are unique but not ordered across
    /// threads. Only the blocks record uids: one drawn here that no durable block carries may be drawn again by the next
    /// heap on the file (after a reopen, or another heap attached to a caller's file), which resumes above the largest
    /// uid its recovery finds.
    /// </summary>
    /// <returns>A positive uid.</returns>
    /// <exception cref="ObjectDisposedException">The heap was disposed.</exception>
    /// <exception cref="InvalidOperationException">The uids are exhausted: a block carries a caller's uid within 1,024 of
    /// <see cref="long.MaxValue"/> (uids never wrap to negative or repeat).</exception>
    public long NewUid()
    {
        // Inside a call, as the allocations are: Dispose waits for it.
        EnterCall();
        try
        {
            return _caches.Value!.NextUid(ref _nextUid);
        }
        finally
        {
            _file.ExitOperation();
        }
    }

    /// <summary>
    /// Enters a public call (leave with <c>_file.ExitOperation()</c>): the file's call, which a Dispose waits for, then
    /// this heap's disposed flag, checked again inside. Dispose sets the flag with a full fence before it waits for the
    /// file's calls, and entering the file announces the call with a full fence before this check: either Dispose sees the
    /// call and waits until it has left, or the call sees the flag and backs out. Without the check a call on a caller's
    /// file (whose Dispose comes later, if at all) went on after this heap's Dispose had returned: into the per-thread
    /// caches that Dispose used to dispose (a <see cref="NullReferenceException"/> where the runtime's disposal of them
    /// raced the read), handing out blocks that a heap attached to the file since could hand out too.
    /// </summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    private void EnterCall()
    {
        // (First too: a call after the heap's Dispose names the heap, not the file its Dispose closed.)
        ThrowIfDisposed();
        _file.EnterOperation();

        // Volatile.Read: after EnterOperation's full fence (see above).
        if (Volatile.Read(ref _disposed) != 0)
        {
            _file.ExitOperation();
            ThrowHelper.ThrowObjectDisposed(this);
        }

        if (InsideCallForTesting is { } hook)
        {
            try
            {
                hook();
            }
            catch
            {
                _file.ExitOperation();
                throw;
            }
        }
    }

    /// <summary>Test hook: runs inside each public call, once it has entered (a test parks a call there).</summary>
    internal Action? InsideCallForTesting { get; set; }

    /// <summary>
    /// Throws once this heap is disposed. Needed where the heap file's own check does not reach: a heap that does not own
    /// its file (another heap may use the file since) answered these calls with that heap's blocks and accounting.
    /// </summary>
    private void ThrowIfDisposed()
    {
        // Volatile.Read: a fresh look (the per-thread cache, disposed with the heap, would report itself instead).
        if (Volatile.Read(ref _disposed) != 0)
        {
            ThrowHelper.ThrowObjectDisposed(this);
        }
    }

    /// <summary>
    /// Calls <paramref name="visitor"/> for every allocated block, by scanning the segment table and block headers as
    /// recovery does. The heap must be quiescent (no concurrent allocate or free) during the scan.
    /// </summary>
    /// <param name="visitor">Called once per block; from several threads at once when <paramref name="degreeOfParallelism"/> is above 1.</param>
    /// <param name="degreeOfParallelism">How many threads scan, at least 1.</param>
    /// <exception cref="ArgumentOutOfRangeException"><paramref name="degreeOfParallelism"/> is below 1.</exception>
    public void ForEachAllocated(Action<PayloadRef, PayloadHeader> visitor, int degreeOfParallelism = 1)
    {
        ArgumentNullException.ThrowIfNull(visitor);
        if (degreeOfParallelism < 1)
        {
            // Refused, as PersistentHeapOptions.RecoveryParallelism refuses it (0 and below used to scan on one thread).
            ThrowHelper.ThrowArgumentOutOfRange(nameof(degreeOfParallelism), $"The number of scanning threads must be at least 1; {degreeOfParallelism} is not.");
        }

        EnterCall();
        try
        {
            Scan(visitor, degreeOfParallelism);
        }
        finally
        {
            _file.ExitOperation();
        }
    }

    /// <summary>
    /// The current accounting: live blocks and bytes, free bytes (thread caches, shared lists, free segments) and
    /// overhead. Exact when the heap is quiescent; approximate while other threads allocate.
    /// </summary>
    /// <returns>The statistics.</returns>
    public HeapStatistics GetStatistics()
    {
        ThrowIfDisposed();
        long liveBlocks, liveBytes, freeBytes = 0;

        // Under the caches' gate, which a release of exited threads' caches holds from taking them out of the list to
        // handing their blocks to the pools: their counts are seen exactly once. (Not the segment gate below: a release
        // may run under it.)
        using (InterruptShield.Hold(_cachesGate))
        {
            // Interlocked.Read: atomic 64-bit loads of the exited threads' counts (added with Interlocked.Add).
            liveBlocks = _recoveredLiveBlocks + Interlocked.Read(ref _exitedLiveBlocks);
            liveBytes = _recoveredLiveBytes + Interlocked.Read(ref _exitedLiveBytes);
            foreach (ThreadCache cache in Caches)
            {
                // Volatile.Read: acquire; the owner writes these with plain stores, so a concurrent read is approximate
                // (exact once the owner is quiescent and its stores are visible, e.g. after joining it).
                liveBlocks += Volatile.Read(ref cache.LiveBlocks);
                liveBytes += Volatile.Read(ref cache.LiveBytes);
                freeBytes += Volatile.Read(ref cache.HeldBytes);
                for (int cls = 0; cls < SizeClasses.Count; cls++)
                {
                    freeBytes += (long)Volatile.Read(ref cache.Counts[cls]) * SizeClasses.BlockSizes[cls];
                }
            }

            for (int cls = 0; cls < _pools.Length; cls++)
            {
                using (InterruptShield.Hold(_pools[cls]))
                {
                    freeBytes += (long)_pools[cls].BlockCount * SizeClasses.BlockSizes[cls];
                }
            }
        }

        long freeSegments, overhead, segments;
        using (InterruptShield.Hold(_segmentGate))
        {
            freeSegments = _freeSegmentCount;
            overhead = _overheadBytes;
            segments = _segmentFree.Length;
        }

        freeBytes += (freeSegments * HeapLayout.SegmentSize) + ReserveFreeBytes();
        using (InterruptShield.Hold(_pendingGate))
        {
            freeBytes += _pendingBytes;
        }

        return new HeapStatistics(segments * HeapLayout.SegmentSize, liveBlocks, liveBytes, freeBytes, overhead, freeSegments);
    }

    /// <summary>
    /// Closes the allocator (and the heap file, when the heap created or opened it, with the wait for calls in flight
    /// described on <see cref="HeapFile.Dispose()"/>). On a caller's file, which stays open, it waits the same way (up to
    /// 30 s) for this heap's calls in flight on other threads; if one is still inside after that, the heap is closed all
    /// the same, and the file is then quarantined at its Dispose and takes no other heap (the call may still hand out
    /// its blocks). Later calls throw <see cref="ObjectDisposedException"/>; payload
    /// spans and addresses must not be used after it. Returns only once that is done: a call while another Dispose runs
    /// (this heap's, or its owner's) waits for it and returns when it has finished, whatever its outcome (that caller
    /// gets the exception, if any); a call after that does nothing.
    /// </summary>
    /// <remarks>The wait for another Dispose is interruptible: <see cref="Thread.Interrupt"/> makes the waiting call throw
    /// <see cref="ThreadInterruptedException"/>, and the other one carries on.</remarks>
    /// <exception cref="InvalidOperationException">This is the allocator of a <see cref="BufferedDurableHeap"/>
    /// (<see cref="BufferedDurableHeap.Heap"/>): dispose that heap instead, which disposes the allocator after its last
    /// advance. Nothing is disposed. Or: called on the thread of a Dispose of this heap that is still running (from a
    /// callback inside it), which cannot complete before this call returns; that Dispose completes regardless. Or: called
    /// inside a call of this heap on the same thread (a <see cref="ForEachAllocated"/> visitor, say), which goes on using
    /// the mapping once its callback returns; nothing is disposed.</exception>
    /// <exception cref="ThreadInterruptedException">The call waited for another Dispose and was interrupted.</exception>
    public void Dispose()
    {
        RefuseDisposeOnThisThread();
        Dispose(operationsDrained: true);
    }

    /// <summary>
    /// <see cref="Dispose()"/> without blocking the caller: the refusals are made here, on the caller's thread (one of them
    /// depends on it: inside a call of this heap), and the rest of Dispose — with a heap that opened its file, the file's
    /// wait (up to 30 s) for the calls in flight, its write-back and fence — runs on a thread-pool thread. Called from a
    /// callback inside a Dispose of this heap, Dispose runs on the calling thread, as <see cref="Dispose()"/> does there.
    /// </summary>
    /// <returns>A task that completes once the heap is closed, or faults with what <see cref="Dispose()"/> throws (a refusal
    /// included: nothing is disposed then).</returns>
    public ValueTask DisposeAsync() =>
        AsyncDisposal.Run(RefuseDisposeAsyncOnThisThread, () => DisposeAsyncOnTheCallerForTesting || _disposal.OnTheDisposingThread, Dispose);

    private void RefuseDisposeAsyncOnThisThread()
    {
        // (The broken control leaves the refusals to the pool's thread.)
        if (!DisposeAsyncRefusesOnThePoolForTesting)
        {
            RefuseDisposeOnThisThread();
        }
    }

    /// <summary>Broken control for tests: <see cref="DisposeAsync"/> runs all of Dispose on the caller's thread, which then waits as Dispose does.</summary>
    internal bool DisposeAsyncOnTheCallerForTesting { get; set; }

    /// <summary>Broken control for tests: <see cref="DisposeAsync"/> leaves its refusals to the pool's thread, which is inside none of the caller's calls.</summary>
    internal bool DisposeAsyncRefusesOnThePoolForTesting { get; set; }

    /// <summary>The refusals of <see cref="Dispose()"/>, made before anything changes.</summary>
    private void RefuseDisposeOnThisThread()
    {
        // Volatile.Read: a fresh look (a second call after the owner disposed this one does nothing, as documented).
        if (_ownerKind == HeapLayout.KindBufferedDurable && Volatile.Read(ref _disposed) == 0)
        {
            ThrowHelper.ThrowInvalidOperation("This PersistentHeap is the allocator of a BufferedDurableHeap, whose operations and advancer use it: dispose the BufferedDurableHeap instead (it disposes the allocator after its last advance).");
        }

        _file.ThrowIfDisposeInsideACall();
    }

    internal void Dispose(bool operationsDrained) => Dispose(operationsDrained, fileClosesNext: _ownsFile);

    /// <summary>Disposes; <paramref name="fileClosesNext"/>: the caller (this heap, or its owner) disposes the file right after.</summary>
    internal void Dispose(bool operationsDrained, bool fileClosesNext)
    {
        // Interlocked.Exchange: full fence; exactly one caller disposes.
        if (Interlocked.Exchange(ref _disposed, 1) != 0)
        {
            // Another Dispose closes the heap: return once it has (a call from inside it, on its thread, throws).
            _disposal.WaitForCompletion(nameof(PersistentHeap));
            return;
        }

        _disposal.Begin();

        // All of it runs to its end if the thread is interrupted: its waits absorb the interrupt, requested again when
        // Dispose ends (an interrupt an inner shield absorbed used to be requested again inside it, and break a later wait).
        using InterruptShield.Scope shield = InterruptShield.Enter();
        try
        {
            DisposeCore(operationsDrained, fileClosesNext);
        }
        finally
        {
            _disposal.Complete();
        }
    }

    /// <summary>The test hooks of the Dispose that waits for another one.</summary>
    internal DisposalGate DisposalForTesting => _disposal;

    private void DisposeCore(bool operationsDrained, bool fileClosesNext)
    {
        if (_ownerKind == HeapLayout.KindBufferedDurable)
        {
            Volatile.Write(ref _closed, 1);
        }

        try
        {
            CloseCore(operationsDrained, fileClosesNext);
        }
        finally
        {
            Volatile.Write(ref _closed, 1);
        }

        // The per-thread caches (_caches) are not disposed: the runtime's ThreadLocal may return null, instead of
        // throwing, to a thread that reads its value while it is disposed, and threads may still be inside calls here —
        // one that outlived the wait for calls, or one on a buffered heap's allocator, whose NewUid and Fence are public
        // and whose owner drains only its own operations. The caches stay referenced by the heap's own list anyway, and
        // the ThreadLocal's finalizer releases its slots once the heap is unreachable. (The broken control disposes them.)
        if ((_faults & HeapFaults.DisposeThreadCaches) != 0 && operationsDrained)
        {
            _caches.Dispose();
        }
    }

    private void CloseCore(bool operationsDrained, bool fileClosesNext)
    {
        try
        {
            // A raw heap on a caller's file: the file stays open, so nothing else waits for this heap's calls in flight,
            // which use the per-thread caches and hand out blocks of the file (a heap attached to it next would hand them
            // out too). Wait for them here (the disposed flag is set: no call enters meanwhile, see EnterCall). If
            // one stays inside past the wait, or the wait fails, the heap is closed as one with calls in flight: the file
            // is quarantined at its Dispose and takes no other heap. (A buffered heap drains its own operations before it
            // disposes its allocator.)
            if (operationsDrained && !_ownsFile && _ownerKind != HeapLayout.KindBufferedDurable && (_faults & HeapFaults.DisposeWithoutWaitingForCalls) == 0)
            {
                operationsDrained = false;
                operationsDrained = _file.WaitForCallsOfAHeap();
            }

            // The frees threads still hold (see Free) made durable before another heap may attach to a caller's file and
            // hand their blocks out (its recovery reads them free from the mapping). A file the heap owns is persisted
            // whole by its clean close.
            if (operationsDrained && !_ownsFile)
            {
                using (InterruptShield.Hold(_cachesGate))
                {
                    foreach (ThreadCache cache in Caches)
                    {
                        if (cache.Held.Count != 0)
                        {
                            WriteBackRuns.WriteBackHeadersAndFence(_file.Domain, CollectionsMarshal.AsSpan(cache.Held));
                        }
                    }
                }
            }
        }
        finally
        {
            // The file first: it waits for the calls in flight, which use the caches. A caller's file may then be disposed
            // (or host another heap); with operations still in flight, its Dispose only quarantines the mapping.
            // A raw heap's calls are the file's (EnterCall): if they outlived the wait, the file's quarantine is freed once they leave.
            _file.DetachHeap(this, operationsDrained, fileClosesNext, leftInFileCalls: _ownerKind != HeapLayout.KindBufferedDurable);
        }

        if (_ownsFile)
        {
            _file.Dispose(operationsDrained);
        }
    }

    private static PersistentHeap OwnFile(HeapFile file, PersistentHeapOptions? options)
    {
        try
        {
            return new PersistentHeap(file, options, ownsFile: true);
        }
        catch
        {
            // A failed open closed nothing in order (see BufferedDurableHeap.Own): no clean-shutdown mark.
            file.ForgoCleanShutdown();
            file.Dispose();
            throw;
        }
    }

    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    private void WriteHeader(long offset, long uid, long epochTag, ulong shape, PayloadKind kind)
    {
        ulong* h = (ulong*)(_base + offset);
        uint generation = HeapLayout.DescriptorGeneration(_table[SegmentOf(offset)]);
        if ((_faults & HeapFaults.SkipUidStore) == 0)
        {
            h[0] = (ulong)uid;
        }

        h[1] = (ulong)epochTag;
        h[2] = shape;

        // Volatile.Write: release; the Uid, Epoch and Shape stores above are ordered before the commit word, so on
        // TSO hardware an eviction of the header's line never exposes a commit without its fields. Recovery does not
        // rely on that order (a crash may persist any subset of words): it checks the commit's hash of the fields.
        Volatile.Write(ref h[3], HeapLayout.AllocatedCommit((ulong)uid, (ulong)epochTag, shape, offset, generation, kind));
    }

    /// <summary>Checks that <paramref name="block"/> is at a block boundary of a small or large segment; returns the segment and its descriptor.</summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    private (long Segment, ulong Descriptor) Locate(PayloadRef block)
    {
        // (A plain read: a call inside sees its own Dispose's flag late at worst, and the flag only ends calls that come
        // after the wait for them.)
        if (_closed != 0)
        {
            ThrowHelper.ThrowObjectDisposed(this);
        }

        long relative = block.Offset - _dataStart;
        long segment = relative / HeapLayout.SegmentSize;

        // Volatile.Read: acquire; pairs with the release in TryGrowLocked.
        if (relative < 0 || (ulong)segment >= (ulong)Volatile.Read(ref _segmentCount))
        {
            ThrowHelper.ThrowInvalidPayloadRef(block, "the offset is outside the heap's segments");
        }

        ulong descriptor = _table[segment];
        long within = relative - (segment * HeapLayout.SegmentSize);
        ulong role = HeapLayout.DescriptorRole(descriptor);
        bool boundary;
        if (role == HeapLayout.RoleSmall)
        {
            int cls = (int)HeapLayout.DescriptorPayload(descriptor);
            uint index = SizeClasses.BlockIndex((uint)within, cls);
            boundary = index * (uint)SizeClasses.BlockSizes[cls] == (uint)within && index < (uint)SizeClasses.BlocksPerSegment[cls];
        }
        else
        {
            boundary = role == HeapLayout.RoleLargeStart && within == 0;
        }

        if (!boundary)
        {
            ThrowHelper.ThrowInvalidPayloadRef(block, "the offset is not the start of a block");
        }

        return (segment, descriptor);
    }

    private byte* PayloadPointer(PayloadRef block, out int size)
    {
        EnterCall();
        try
        {
            return PayloadPointerCore(block, out size);
        }
        finally
        {
            _file.ExitOperation();
        }
    }

    private byte* PayloadPointerCore(PayloadRef block, out int size)
    {
        Locate(block);
        ulong* h = (ulong*)(_base + block.Offset);

        // Volatile.Read: acquire; pairs with the release store of the commit word in WriteHeader, so the shape read
        // below is the one this commit covers when the block was allocated by another thread.
        ulong commit = Volatile.Read(ref h[3]);
        if (!HeapLayout.InUse(commit))
        {
            ThrowHelper.ThrowInvalidPayloadRef(block, "it is free");
        }

        size = HeapLayout.ShapeSize(h[2]);
        return (byte*)(h + 4);
    }

    /// <summary>Refills the empty class <paramref name="cls"/> of <paramref name="cache"/>; <paramref name="antiPayload"/>: for an anti-payload, which may take the delete reserve.</summary>
    private bool TryRefill(ThreadCache cache, int cls, bool antiPayload)
    {
        // The frees this thread holds first (a raw heap's: see Free), made durable now.
        if (cache.Held.Count != 0)
        {
            ReleaseHeldFrees(cache);
            if (cache.Counts[cls] != 0)
            {
                return true;
            }
        }

        if (TryTakeBatch(cache, cls, out bool low))
        {
            if (low)
            {
                SignalRunningLow(cls);
            }

            return true;
        }

        // The pool is empty: the stocker (if any) is woken, and this thread formats a free segment (fresh and dense) or
        // sweeps parked frees of this class for itself (a write-back and a fence on this thread), or waits for a sweep in
        // flight that holds blocks of this class, before the heap-full path below; it runs to its end even if the thread
        // is interrupted (see InterruptShield).
        using InterruptShield.Scope shield = InterruptShield.Enter();
        SignalRunningLow(cls);

        // An anti-payload takes a block set aside for it before a free segment: those are reserved for it anyway.
        if ((antiPayload && TryTakeReserveBlock(cache)) || TryFormatSmallSegment(cache, cls, allowGrowth: false, antiPayload) || TrySweepForRefill(cache, cls))
        {
            return true;
        }

        // Once more before growing the file: the segment gate (taken above) may have waited for the advancer's stocking,
        // which filled the pool meanwhile.
        if (TryTakeBatch(cache, cls))
        {
            return true;
        }

        Interlocked.Increment(ref _heapFullRefills);
        if (TryFormatSmallSegment(cache, cls, allowGrowth: true, antiPayload))
        {
            return true;
        }

        // No block ready and no segment left: make every deferred free durable and look once more (the advancer's
        // sweep normally keeps the pools stocked, so this is the heap-almost-full path). Even with nothing pending: the
        // flush waits for a sweep in flight on another thread, whose blocks are neither pending nor in a pool until it
        // hands them out (without the wait, this thread would report the heap full while they are; the broken control,
        // HeapFaults.FlushWithoutWaitingForSweepsInFlight: the growth's flush above, when it gives pooled segments back, waits the same way).
        // (An allocation reaches these flushes beside a sweep in flight of its class only with the refill's own wait for
        // it broken too, HeapFaults.RefillSweepsOnce: otherwise TrySweepForRefill waited for that sweep already.)
        FlushPendingFrees();
        return TryTakeBatch(cache, cls) || (antiPayload && TryTakeReserveBlock(cache));
    }

    private bool TryTakeBatch(ThreadCache cache, int cls) => TryTakeBatch(cache, cls, out _);

    /// <summary>Takes a batch of class <paramref name="cls"/> from its pool into the thread's cache, if the pool has one.</summary>
    /// <param name="cache">The thread's cache, whose class <paramref name="cls"/> is empty.</param>
    /// <param name="cls">The size class.</param>
    /// <param name="runningLow">Whether the pool is below its low-water mark afterwards (see <see cref="PoolRunningLow"/>).</param>
    private bool TryTakeBatch(ThreadCache cache, int cls, out bool runningLow)
    {
        ClassPool pool = _pools[cls];
        using (InterruptShield.Hold(pool))
        {
            if (pool.Batches.Count == 0)
            {
                runningLow = false;
                return false;
            }

            long[] batch = (_faults & HeapFaults.ShareRefillBatch) != 0 ? pool.Batches.Peek() : pool.Batches.Pop();
            if ((_faults & HeapFaults.ShareRefillBatch) == 0)
            {
                pool.BlockCount -= batch.Length;
            }

            batch.CopyTo(cache.Blocks[cls], 0);
            cache.Counts[cls] = batch.Length;
            CountTaken(cls, batch.Length);
            runningLow = IsRunningLow(cls, pool.BlockCount);
            return true;
        }
    }

    private void Spill(ThreadCache cache, int cls)
    {
        // A free's block is marked free before it is handed out here: an interrupt at the pool's lock would lose it until
        // the next open (see InterruptShield).
        using InterruptShield.Scope shield = InterruptShield.Enter();
        var batch = new long[BatchSize];
        int count = cache.Counts[cls] - BatchSize;
        Array.Copy(cache.Blocks[cls], count, batch, 0, BatchSize);
        cache.Counts[cls] = count;
        ClassPool pool = _pools[cls];
        using (InterruptShield.Hold(pool))
        {
            pool.Batches.Push(batch);
            pool.BlockCount += BatchSize;
            Interlocked.Increment(ref _poolPushes);
        }
    }

    /// <summary>Shared free blocks of one size class, in batches. Guarded by locking the instance.</summary>
    private sealed class ClassPool
    {
        internal System.Collections.Generic.Stack<long[]> Batches { get; } = new();

        internal long BlockCount { get; set; }
    }

    /// <summary>Every thread's cache (a snapshot: a thread may add its own meanwhile).</summary>
    // Volatile.Read: acquire; pairs with the release in CreateCache and ReleaseExitedThreadCaches.
    private ThreadCache[] Caches => Volatile.Read(ref _cacheList);

    private ThreadCache CreateCache()
    {
        var cache = new ThreadCache(Thread.CurrentThread);
        using (InterruptShield.Hold(_cachesGate))
        {
            // Released: a reader of the array sees the initialized cache.
            CopyOnWriteArray.Append(ref _cacheList, cache);
        }

        return cache;
    }

    /// <summary>Whether the sweep log has nothing a cycle's mark would add (see <see cref="SweepLog.MarkIsCurrent"/>); true without a log.</summary>
    internal bool SweepLogMarkIsCurrent => _sweepLog?.MarkIsCurrent ?? true;

    /// <summary>Whether a thread that has exited still has an allocation cache here, which <see cref="ReleaseExitedThreadCaches"/> would hand back.</summary>
    internal bool HasExitedThreadCaches
    {
        get
        {
            foreach (ThreadCache cache in Caches)
            {
                if (!cache.Owner.IsAlive)
                {
                    return true;
                }
            }

            return false;
        }
    }

    /// <summary>
    /// Gives the free blocks in the caches of threads that have exited back to the shared pools and forgets those caches
    /// (their live counts move to the heap's). Without it a heap used by short-lived threads kept up to 64 free blocks
    /// per class and thread for ever, and grew its file for each new thread instead of reusing them.
    /// </summary>
    internal void ReleaseExitedThreadCaches()
    {
        if ((_faults & HeapFaults.KeepExitedThreadCaches) != 0)
        {
            return;
        }

        using (InterruptShield.Hold(_cachesGate))
        {
            // Under the gate: a cache is taken out of the list, and its blocks handed back, by one caller only.
            // Join(0): true once the thread has terminated, and a synchronization with its end, so its last plain stores
            // to the cache are visible here. Nobody else touches an exited thread's cache. (Volatile.Write inside:
            // release; pairs with the acquire in Caches.)
            Thread current = Thread.CurrentThread;
            List<ThreadCache>? exited = CopyOnWriteArray.RemoveAll(ref _cacheList, cache => cache.Owner != current && !cache.Owner.IsAlive && cache.Owner.Join(0));
            if (exited is null)
            {
                return;
            }

            // Still under the gate, so that GetStatistics sees each count once: in a cache or moved. (Lock order: the
            // caches' gate, then a pool's.)
            foreach (ThreadCache cache in exited)
            {
                // Interlocked.Add: the statistics read these atomically.
                Interlocked.Add(ref _exitedLiveBlocks, cache.LiveBlocks);
                Interlocked.Add(ref _exitedLiveBytes, cache.LiveBytes);

                // Its held frees made durable first, as their thread would have (see Free).
                ReleaseHeldFrees(cache);
                for (int cls = 0; cls < SizeClasses.Count; cls++)
                {
                    if (cache.Counts[cls] != 0)
                    {
                        PushFree(cls, cache.Blocks[cls], cache.Counts[cls]);
                        cache.Counts[cls] = 0;
                    }
                }
            }
        }
    }

    /// <summary>The deliberately broken behaviours the heap was opened with (tests).</summary>
    internal HeapFaults Faults => _faults;

    /// <summary>How many thread caches the heap keeps (tests: exited threads' are forgotten).</summary>
    internal int CacheCountForTesting => Caches.Length;

    /// <summary>One thread's blocks per size class and its share of the accounting. Touched by its owner only (statistics read it racily).</summary>
    internal sealed class ThreadCache
    {
        internal readonly long[][] Blocks;
        internal readonly int[] Counts = new int[SizeClasses.Count];
        internal long LiveBlocks;
        internal long LiveBytes;

        /// <summary>Small blocks a raw <see cref="Free(PayloadRef)"/> marked free, held until their frees are durable.</summary>
        internal readonly List<long> Held = new();

        /// <summary>The bytes of <see cref="Held"/>'s blocks (free in the statistics).</summary>
        internal long HeldBytes;
        private long _uidNext;
        private long _uidEnd;

        /// <summary>The thread whose cache this is.</summary>
        internal Thread Owner { get; }

        internal ThreadCache(Thread owner)
        {
            Owner = owner;
            Blocks = new long[SizeClasses.Count][];
            for (int i = 0; i < Blocks.Length; i++)
            {
                Blocks[i] = new long[CacheCapacity];
            }
        }

        internal long NextUid(ref long shared)
        {
            if (_uidNext == _uidEnd)
            {
                // Interlocked.Add: atomic reservation of a range; no ordering needed beyond uniqueness.
                long end = Interlocked.Add(ref shared, UidBatch) + 1;
                if (end <= UidBatch)
                {
                    // Wrapped past long.MaxValue (a caller's uid near it resumed the count there): never a negative or
                    // reused uid.
                    ThrowHelper.ThrowInvalidOperation("The heap's uids are exhausted: a block carries a uid within a batch of long.MaxValue (a caller's own uid, see Allocate), and uids are never reused.");
                }

                _uidEnd = end;
                _uidNext = _uidEnd - UidBatch;
            }

            return _uidNext++;
        }
    }
}
