using System;
using System.Diagnostics.CodeAnalysis;
using System.IO;
using System.IO.MemoryMappedFiles;
using System.Runtime.InteropServices;
using System.Threading;
using Microsoft.Win32.SafeHandles;

namespace Epvs.Persistence;

/// <summary>
/// A memory-mapped file made durable by the operating system: on Linux by default a private (copy-on-write) mapping
/// whose written ranges are copied into the file with <c>pwrite</c> and made durable with <c>fdatasync</c>, or a shared
/// mapping synchronized with ranged <c>msync(MS_SYNC)</c> (see <see cref="MappedFileWriteBack"/>); <c>FlushViewOfFile</c>
/// plus <c>FlushFileBuffers</c> on Windows. No native dependency beyond the C library.
/// </summary>
/// <remarks>
/// <para>Shared mapping on Unix: <see cref="PersistenceDomain.WriteBack(long, long)"/> is synchronous (msync with MS_SYNC
/// on the pages covering the range) and <see cref="PersistenceDomain.Fence"/> has nothing left to wait for. Private
/// mapping (Linux): the write-back puts the range in the page cache and the fence waits for every range written back so
/// far, by any thread, with one <c>fdatasync</c>. Windows: the write-back queues the dirty pages and the fence flushes
/// the file's buffers to the device.</para>
/// <para>Errors are fail-stop: after a failed msync, pwrite or fdatasync every later write-back and fence of the domain
/// throws. msync and fdatasync calls on one open file description are serialized, because Linux reports a write-back
/// error once per open file description to whichever call checks first: serialized, no call returns success over pages
/// that failed under it. The cost: two threads' msyncs of a shared mapping (<see cref="DurabilityMode.Strict"/>
/// operations) no longer overlap. A private mapping's fences go through two descriptions (on the file systems of
/// <see cref="SyncsTheFileThroughAnyDescription"/>), so two of them run at once (see
/// <see cref="OpenSecondDescription"/>); a fence that succeeded waits for the other description's call in flight and
/// for the write-outs in flight (<see cref="WaitForWriteOutsInFlight"/>) before it returns, and reports their failure.</para>
/// <para>On Unix the mapping reserves address space for the heap's maximum size up front, so growing is extending the
/// file (<c>posix_fallocate</c>, which fails cleanly when the disk is full instead of faulting later) and the base
/// address never moves.</para>
/// <para>An assumption, not an architectural guarantee: a private mapping's failure-atomic words (see
/// <see cref="PersistenceDomain"/>) rest on the kernel's copy loop (<c>copy_from_user</c>, <c>rep movsb</c> on current
/// x86-64 kernels) reading each aligned 8-byte word with one load, so that a word stored while its page is being copied
/// reaches the file old or new, never mixed — as a shared mapping rests on the device's reads of a page under
/// writeback. Every range this package writes back starts on an 8-byte boundary.</para>
/// </remarks>
internal sealed unsafe class MappedFilePersistenceDomain : PersistenceDomain
{
    private readonly SafeFileHandle _file;
    private readonly SafeMappingHandle? _unixMapping;
    private readonly MemoryMappedFile? _windowsMap;
    private readonly MemoryMappedViewAccessor? _windowsView;
    private readonly long _capacity;
    private readonly int _pageSize = Environment.SystemPageSize;
    private readonly bool _private;
    private bool _fileReferenced;

    /// <summary>1 once the reference on the file's handle was given back (see <see cref="ReleaseFile"/>).</summary>
    private int _fileReleased;
    private long _writeBackCalls;

    /// <summary>
    /// The process's file size limit (RLIMIT_FSIZE) as last read (see <see cref="FileSizeLimit"/>): the file never grows,
    /// nor is written, past it. A pwrite or an extension past it raises SIGXFSZ, which kills the process.
    /// </summary>
    private long _fileSizeLimit = Interop.Libc.FileSizeLimit();

    /// <summary>When <see cref="_fileSizeLimit"/> was read (<see cref="Environment.TickCount64"/>).</summary>
    private long _fileSizeLimitReadAt = Environment.TickCount64;

    /// <summary>pwrite/fdatasync/fallocate calls in progress (the write-back of a private mapping, growth, <see cref="PrepareOverwriteCore"/>): quarantine and dispose wait for them.</summary>
    private int _fileCalls;

    /// <summary>How long a quarantine or dispose waits for pwrite, fdatasync and fallocate calls in flight (tests shorten it).</summary>
    internal TimeSpan FileCallWait { get; set; } = TimeSpan.FromSeconds(30);

    /// <inheritdoc/>
    private protected override TimeSpan PublicCallWait => FileCallWait;

    /// <summary>
    /// Serializes the msync and fdatasync calls on the file's first open file description (<see cref="_file"/>, the
    /// one mapped): Linux reports a write-back error once per open file description, to whichever call on it checks
    /// first, so under the gate the call that sees it records it before any other can return.
    /// </summary>
    private readonly object _syncGate = new();

    /// <summary>
    /// A second open file description of the file (Linux, private mapping; null where it could not be opened), whose
    /// fdatasync calls <see cref="_secondSyncGate"/> serializes: a fence that finds the first description's gate taken
    /// syncs through this one instead of waiting for the other fence (see <see cref="EnterSyncLane"/>).
    /// </summary>
    private readonly SafeFileHandle? _secondDescription;

    /// <summary>Serializes the fdatasync calls on <see cref="_secondDescription"/>, as <see cref="_syncGate"/> those on the first.</summary>
    private readonly object _secondSyncGate = new();

    /// <summary>Test hook: runs in each pwrite call of this domain before it is counted in (after the range check).</summary>
    internal Action? BeforeFileCallForTesting;

    /// <summary>Test hook: runs inside each pwrite and posix_fallocate call of this domain, after it was counted in, before the system call.</summary>
    internal Action? InsideFileCallForTesting;

    /// <summary>Broken control for tests: quarantine and dispose do not wait for pwrite calls in flight.</summary>
    internal bool SkipFileCallWaitForTesting;

    /// <summary>Test hook: when not 0, every pwrite and fdatasync fails with this errno (as a failing disk makes them).</summary>
    internal int FailFileCallsForTesting;

    /// <summary>Test hook: with <see cref="FailFileCallsForTesting"/>, only pwrites at or above this offset fail (fdatasync does not).</summary>
    internal long FailFromOffsetForTesting;

    /// <summary>Broken control for tests: a failed pwrite, fdatasync or sync_file_range is ignored (as if its result were not checked).</summary>
    internal bool IgnoreFileCallErrorsForTesting;

    /// <summary>
    /// Test hook: replaces the msync (shared mapping) or fdatasync (private mapping) system call, given the open file
    /// description it goes through (0: the first, 1: the second; msync: always 0); a simulated kernel whose result (0,
    /// or -1 with errno set) is the call's. <see cref="SyncThrough"/> makes the real call.
    /// </summary>
    internal Func<int, int>? SyncCallForTesting;

    /// <summary>
    /// Broken control for tests: msync and fdatasync calls are not serialized, and all go through the first open file
    /// description (a concurrent call on it may take another's error).
    /// </summary>
    internal bool UngatedSyncForTesting;

    /// <summary>Broken control for tests: a fence that succeeded returns without waiting for the other description's call in flight (see <see cref="OpenSecondDescription"/>).</summary>
    internal bool SkipOtherLaneWaitForTesting;

    /// <summary>How many open file descriptions of the file a fence's fdatasync can go through at once: 2 for a private mapping where the second one opened, else 1.</summary>
    internal int SyncLanes => _secondDescription is null ? 1 : 2;

    /// <summary>Test hook: the descriptor of the second open file description (null: none).</summary>
    internal int? SecondDescriptorForTesting => _secondDescription is null ? null : (int)_secondDescription.DangerousGetHandle();

    /// <summary>The fdatasync call through open file description <paramref name="lane"/> (0: the first, 1: the second), under its gate; tests call it from <see cref="SyncCallForTesting"/>.</summary>
    internal int SyncThrough(int lane) => Interop.Libc.Fdatasync((int)(lane == 0 ? _file : _secondDescription!).DangerousGetHandle());

    /// <summary>Test hook: runs with the range of each private-mapping write-back whose write-out it is about to start (see <see cref="StartWriteOut"/>).</summary>
    internal Action<long, long>? StartWriteOutForTesting;

    /// <summary>Test hook: replaces the <c>sync_file_range</c> call of <see cref="StartWriteOut"/>; a simulated kernel whose result (0, or -1 with errno set) is the call's.</summary>
    internal Func<int>? SyncFileRangeCallForTesting;

    private MappedFilePersistenceDomain(byte* pointer, long length, long capacity, bool privateMapping, SafeFileHandle file, SafeMappingHandle? unixMapping, MemoryMappedFile? windowsMap, MemoryMappedViewAccessor? windowsView, bool secondDescription = false)
        : base(pointer, length)
    {
        _capacity = capacity;
        _private = privateMapping;
        _file = file;
        _secondDescription = privateMapping && secondDescription ? OpenSecondDescription(file) : null;
        _unixMapping = unixMapping;
        _windowsMap = windowsMap;
        _windowsView = windowsView;
    }

    /// <inheritdoc/>
    public override PersistenceDomainKind Kind => PersistenceDomainKind.MappedFile;

    /// <inheritdoc/>
    public override bool IsPersistentMemory => false;

    /// <inheritdoc/>
    public override long Capacity => _capacity;

    /// <summary>Whether the file is mapped copy-on-write and written back with pwrite (<see cref="MappedFileWriteBack.PrivateMapping"/>).</summary>
    internal bool IsPrivateMapping => _private;

    /// <summary>Calls to msync, pwrite or FlushViewOfFile so far (diagnostic; may undercount under concurrency).</summary>
    internal long WriteBackCalls => _writeBackCalls;

    /// <inheritdoc/>
    internal override bool WritesBackByCopy => _private;

    /// <inheritdoc/>
    // Through pwrite every byte of a run is copied and its pages become dirty: a run takes in what follows it on its
    // last page only (msync writes dirty pages only, so a run there bridges small gaps of clean pages).
    internal override long WriteBackMergeGap => _private ? 0 : base.WriteBackMergeGap;

    /// <summary>Reads the file itself (not the mapping) at <paramref name="offset"/>: what the page cache holds (tests).</summary>
    internal int ReadFile(long offset, Span<byte> buffer) => RandomAccess.Read(_file, buffer, offset);

    /// <summary>
    /// Whether <paramref name="writeBack"/> maps a heap of at most <paramref name="capacity"/> bytes privately on this
    /// system: never off Linux; <see cref="MappedFileWriteBack.Auto"/> when the heap could take at most a quarter of
    /// the memory available to the process and no pwrite of it can pass the process's file size limit (SIGXFSZ).
    /// </summary>
    internal static bool UsesPrivateMapping(MappedFileWriteBack writeBack, long capacity) => writeBack switch
    {
        MappedFileWriteBack.PrivateMapping => OperatingSystem.IsLinux(),
        MappedFileWriteBack.Auto => OperatingSystem.IsLinux() && capacity <= GC.GetGCMemoryInfo().TotalAvailableMemoryBytes / 4 && capacity <= Interop.Libc.FileSizeLimit(),
        _ => false,
    };

    /// <summary>
    /// Maps <paramref name="length"/> bytes of an open, locked file, reserving <paramref name="capacity"/> bytes of
    /// address space on Unix; privately (Linux) when <paramref name="privateMapping"/> is set.
    /// </summary>
    /// <param name="stream">The open, locked file.</param>
    /// <param name="length">The bytes to map.</param>
    /// <param name="capacity">The address space to reserve (Unix).</param>
    /// <param name="privateMapping">Map copy-on-write and write back with pwrite (Linux).</param>
    /// <param name="secondDescription">A private mapping's fences may go through a second open file description (see
    /// <see cref="OpenSecondDescription"/>); false: one only (a test's control).</param>
    internal static MappedFilePersistenceDomain Map(FileStream stream, long length, long capacity, bool privateMapping, bool secondDescription = true)
    {
        if (OperatingSystem.IsWindows())
        {
            MemoryMappedFile map = MemoryMappedFile.CreateFromFile(stream, null, length, MemoryMappedFileAccess.ReadWrite, HandleInheritability.None, leaveOpen: true);
            MemoryMappedViewAccessor view = map.CreateViewAccessor(0, length, MemoryMappedFileAccess.ReadWrite);
            byte* pointer = null;
            view.SafeMemoryMappedViewHandle.AcquirePointer(ref pointer);
            return new MappedFilePersistenceDomain(pointer + view.PointerOffset, length, length, privateMapping: false, stream.SafeFileHandle, null, map, view);
        }

        capacity = Math.Max(capacity, length);
        SafeFileHandle file = stream.SafeFileHandle;
        bool referenced = false;
        file.DangerousAddRef(ref referenced);
        try
        {
            int flags = privateMapping ? Interop.Libc.MapPrivate : Interop.Libc.MapShared;
            int? simulated = HeapFileTestHooks.SimulatedMmapError;
            void* address = simulated is null ? Interop.Libc.Mmap(null, (nuint)capacity, Interop.Libc.ProtRead | Interop.Libc.ProtWrite, flags, (int)file.DangerousGetHandle(), 0) : (void*)-1;
            if (address == (void*)-1)
            {
                ThrowMapFailed(simulated ?? Marshal.GetLastPInvokeError(), capacity, privateMapping);
            }

            var domain = new MappedFilePersistenceDomain((byte*)address, length, capacity, privateMapping, file, new SafeMappingHandle(address, (nuint)capacity, pmem: false), null, null, secondDescription);
            domain._fileReferenced = true;
            referenced = false;
            return domain;
        }
        finally
        {
            if (referenced)
            {
                file.DangerousRelease();
            }
        }
    }

    /// <summary>
    /// Opens the file behind <paramref name="file"/> once more, read-only, as a new open file description (through
    /// <c>/proc/self/fd</c>, so the same file whatever its name is now); null where that fails (no <c>/proc</c>, no
    /// descriptor left): the fences then share the first description.
    /// </summary>
    /// <remarks>
    /// Why a second description. The advancer's fence and the stocker's (a batch of formatted segments, a sweep) run
    /// on different threads; behind one gate, each fdatasync waited for the other's whole call (on a virtual disk,
    /// milliseconds each), and the cycle's fence with it. Through two descriptions the kernel runs the two calls at
    /// once: each writes out what is dirty and waits for the pages the other is writing. Linux (errseq, since 4.13)
    /// records a write-back error in the file and reports it once to each open file description that checks after
    /// it, whichever thread's pages failed: every fdatasync through either description that began after its pages
    /// were copied sees their error, and the first to see one makes the domain fail-stop (<see cref="PersistenceDomain.Failure"/>).
    /// Some errors are not recorded in the file, only returned to the call that drove the pages' write-out (ext4 gives
    /// up on pages whose blocks it cannot map, and returns that call the error): a fence whose own call succeeded
    /// while another, through the other description, was writing its pages out would miss it. So a fence that
    /// succeeded passes through the other description's gate (it waits for the call in flight there, which records
    /// its failure before it leaves) and looks at <see cref="PersistenceDomain.Failure"/> again before it returns. Two fences at once
    /// then take as long as the longer one, not the two one after the other. fdatasync needs no write access (Linux).
    /// Only on the file systems of <see cref="SyncsTheFileThroughAnyDescription"/>: elsewhere the fences share the first
    /// description.
    /// </remarks>
    private static SafeFileHandle? OpenSecondDescription(SafeFileHandle file)
    {
        if (!OperatingSystem.IsLinux())
        {
            return null;
        }

        int first = (int)file.DangerousGetHandle();
        if (Interop.Libc.FileSystemType(first) is not { } type || !SyncsTheFileThroughAnyDescription(type))
        {
            return null;
        }

        int fd = Interop.Libc.Open($"/proc/self/fd/{first}", Interop.Libc.ReadOnly | Interop.Libc.CloseOnExec, 0);
        return fd < 0 ? null : new SafeFileHandle((IntPtr)fd, ownsHandle: true);
    }

    /// <summary>
    /// Whether an fdatasync through a read-only open file description of a file on a file system of type
    /// <paramref name="fileSystemType"/> (<c>statfs</c>'s <c>f_type</c>) writes out and makes durable what was written
    /// to the file through another description: true for the local file systems whose fsync works on the file (its
    /// inode's pages and metadata), whichever description calls it, and for tmpfs (nothing to sync); false for every
    /// other, unknown ones included.
    /// </summary>
    /// <remarks>A file system that syncs per open (a network file system that flushes what a handle wrote, a FUSE
    /// daemon that syncs its own handle of the call's open) could return success for the second description's call
    /// with the first's pages not durable, and a fence would report them durable: a silent loss. So a file system not
    /// listed here gets one description (fences one after the other, as before), never a second one it was not shown
    /// to honour. Overlayfs is not listed: it passes each open's fsync to its own file in the upper layer, whose file
    /// system <c>fstatfs</c> does not tell (a container's writable layer; a volume mounted into a container is its own
    /// file system, and listed if it is one of these).</remarks>
    internal static bool SyncsTheFileThroughAnyDescription(uint fileSystemType) => fileSystemType is
        0xEF53 // ext2, ext3, ext4
        or 0x5846_5342 // XFS
        or 0x9123_683E // Btrfs
        or 0xF2F5_2010 // F2FS
        or 0x2FC1_2FC1 // ZFS
        or 0xCA45_1A4E // bcachefs
        or 0x0102_1994; // tmpfs

    /// <summary>
    /// A failed mmap of the heap file: a file system that turned read-only (after an I/O error, ext4 aborts its journal and
    /// remounts read-only, yet still opens files for writing) is <see cref="HeapFileError.ReadOnly"/>, as a read-only
    /// mount is; the advice about the commit limit is given for a lack of memory only (a writable private mapping is
    /// charged to the system's commit limit for its whole reservation); any other errno is reported as it is.
    /// </summary>
    [DoesNotReturn]
    private static void ThrowMapFailed(int errno, long capacity, bool privateMapping)
    {
        string what = $"mmap of {capacity} bytes failed: {Marshal.GetPInvokeErrorMessage(errno)} (errno {errno}).";
        if (errno == Interop.Libc.Erofs)
        {
            ThrowHelper.ThrowHeapFile(HeapFileError.ReadOnly, $"{what} The file system is read-only (a file system may turn read-only after an I/O error; look at the kernel log): remount it read-write or copy the file to a writable place.");
        }

        // Both causes of ENOMEM are named: the advice for one alone misled under an address-space limit (a probe's
        // RLIMIT_AS), where a shared mapping fails the same way.
        string advice = errno != Interop.Libc.Enomem ? string.Empty
            : privateMapping ? " Either the process's address-space limit (RLIMIT_AS, ulimit -v) is below the mapping's reservation, or the system's commit limit is: a private mapping counts its whole maximum size against the memory the system commits. Lower HeapFileOptions.MaxSize (on open too: it caps that open's reservation); for the commit limit alone, MappedFileWriteBack.SharedMapping also helps."
            : " The process's address-space limit (RLIMIT_AS, ulimit -v) is below the mapping's reservation: lower HeapFileOptions.MaxSize (on open too: it caps that open's reservation) or raise the limit.";
        ThrowHelper.ThrowIO(what + advice);
    }

    /// <inheritdoc/>
    protected override void Dispose(bool disposing)
    {
        if (!disposing)
        {
            return;
        }

        if (!WaitForFileCalls())
        {
            // A call stuck in the kernel for that long (a failing disk): leave the mapping and the descriptor to it
            // rather than unmap or close under it.
            return;
        }

        if (_windowsView is not null)
        {
            _windowsView.SafeMemoryMappedViewHandle.ReleasePointer();
            _windowsView.Dispose();
            _windowsMap!.Dispose();
        }

        _unixMapping?.Dispose();
        ReleaseFile();
    }

    /// <summary>
    /// A domain never disposed (its heap abandoned, and collected): gives back its reference on the file's handle, which
    /// then closes the descriptor (and so releases the file's lock) as it is finalized; the mapping's own handle unmaps
    /// it. Nothing else: no thread can be using an unreachable domain.
    /// </summary>
    ~MappedFilePersistenceDomain() => ReleaseFile();

    /// <summary>Gives back the reference this domain took on the file's handle, once (Dispose, quarantine or finalizer).</summary>
    private void ReleaseFile()
    {
        // Interlocked.Exchange: once, whichever comes first.
        if (_fileReferenced && Interlocked.Exchange(ref _fileReleased, 1) == 0)
        {
            _file.DangerousRelease();

            // Closed with the first one: no call goes through either any more (or, from the finalizer, none can).
            _secondDescription?.Dispose();
        }
    }

    /// <inheritdoc/>
    private protected override void ReleaseQuarantineCore() => _unixMapping?.ReleaseQuarantine();

    /// <inheritdoc/>
    internal override bool HoldsQuarantinedMemory => _unixMapping?.HoldsQuarantinedMemory ?? false;

    private protected override void QuarantineCore()
    {
        // A straggler's pwrite still copying from the mapping would copy the anonymous memory's zeros into the file
        // (or, once the file is closed, into whatever file reuses its descriptor): let those in flight finish first;
        // later ones see the domain disposed and throw (BeginFileCall).
        if (!WaitForFileCalls())
        {
            // A call stuck in the kernel for that long: the mapping stays the file's and the descriptor stays open (both
            // leak), so the call neither copies zeros nor reaches another file.
            return;
        }

        // Windows: the view is kept (never unmapped); Unix: replaced by anonymous memory.
        _unixMapping?.Quarantine();
        ReleaseFile();
    }

    private protected override void WriteBackCore(long offset, long length)
    {
        if (length == 0)
        {
            return;
        }

        _writeBackCalls++;
        ThrowIfFailedBefore();
        if (_private)
        {
            CopyToFile(offset, length);
            return;
        }

        if (_windowsView is not null)
        {
            if (!Interop.Kernel32.FlushViewOfFile(Pointer + offset, (nuint)length))
            {
                ThrowSyncFailed("FlushViewOfFile");
            }

            return;
        }

        // msync wants a page-aligned start address.
        long start = offset & ~(long)(_pageSize - 1);
        bool gated = !UngatedSyncForTesting;
        if (gated)
        {
            // msync(MS_SYNC) checks the file's write-back errors like fdatasync: the first call to look takes an error,
            // even one of another call's pages (see _syncGate). Serialized, the call whose pages failed sees it.
            InterruptShield.Lock(_syncGate);
        }

        try
        {
            ThrowIfFailedBefore();
            if ((SyncCallForTesting?.Invoke(0) ?? Interop.Libc.Msync(Pointer + start, (nuint)(offset + length - start), Interop.Libc.MsSync)) != 0)
            {
                ThrowSyncFailed("msync");
            }
        }
        finally
        {
            if (gated)
            {
                Monitor.Exit(_syncGate);
            }
        }
    }

    /// <summary>
    /// Takes the gate of an open file description for a fence's fdatasync and returns which (0: the first, 1: the
    /// second): the first description's if it is free, else the second's if that one is, else waits for one of the two
    /// (chosen by the thread, so that waiting fences spread over both). The broken controls take none: -1 (the first
    /// description, ungated: <see cref="UngatedSyncForTesting"/>), -2 (the second one, ungated, when a fence would wait
    /// for its gate: <see cref="UngatedSecondLaneForTesting"/>).
    /// </summary>
    private int EnterSyncLane()
    {
        if (UngatedSyncForTesting)
        {
            return -1;
        }

        if (_secondDescription is null)
        {
            InterruptShield.Lock(_syncGate);
            return 0;
        }

        if (InterruptShield.TryLock(_syncGate, TimeSpan.Zero))
        {
            return 0;
        }

        if (InterruptShield.TryLock(_secondSyncGate, TimeSpan.Zero))
        {
            return 1;
        }

        int lane = Environment.CurrentManagedThreadId & 1;
        WaitingForSyncLaneForTesting?.Invoke(lane);
        if (lane == 1 && UngatedSecondLaneForTesting)
        {
            return -2;
        }

        InterruptShield.Lock(lane == 0 ? _syncGate : _secondSyncGate);
        return lane;
    }

    /// <summary>Test hook: runs in a fence that found both gates taken, with the lane whose gate it is about to wait for.</summary>
    internal Action<int>? WaitingForSyncLaneForTesting;

    /// <summary>Broken control for tests: a fence that would wait for the second description's gate goes through that description ungated (a concurrent call on it may take its error), and, ungated, skips the wait for the other description's call too.</summary>
    internal bool UngatedSecondLaneForTesting;

    private protected override void FenceCore()
    {
        ThrowIfFailedBefore();
        // Private mapping: the copies are in the page cache; one fdatasync waits for all of them (every thread's: a
        // stronger fence than the contract asks). Shared mapping on Unix: msync(MS_SYNC) already waited. Windows:
        // FlushViewOfFile only queued the pages.
        if (_private)
        {
            BeginFileCall();
            try
            {
                // Under the gate of the description it goes through (see _syncGate), so no thread's fence passes over
                // another's error.
                int gate = EnterSyncLane();
                int lane = gate == -2 ? 1 : Math.Max(gate, 0);
                try
                {
                    ThrowIfFailedBefore();
                    int result = SyncCallForTesting?.Invoke(lane) ?? (FailFileCallsForTesting != 0 && FailFromOffsetForTesting == 0 ? Fail() : SyncThrough(lane));
                    if (result != 0 && !IgnoreFileCallErrorsForTesting)
                    {
                        ThrowSyncFailed("fdatasync");
                    }
                }
                finally
                {
                    if (gate >= 0)
                    {
                        Monitor.Exit(gate == 0 ? _syncGate : _secondSyncGate);
                    }
                }

                if (gate >= 0 && _secondDescription is not null && !SkipOtherLaneWaitForTesting)
                {
                    // Succeeded: the other description's call in flight (if any) may have driven this fence's pages out
                    // and been the only one told they failed (see OpenSecondDescription); it records that before it
                    // leaves its gate. (The broken control returns at once.)
                    object other = gate == 0 ? _secondSyncGate : _syncGate;
                    InterruptShield.Lock(other);
                    Monitor.Exit(other);
                }

                // So may a write-out another thread started (see WaitForWriteOutsInFlight).
                WaitForWriteOutsInFlight();
                ThrowIfFailedBefore();
            }
            finally
            {
                Interlocked.Decrement(ref _fileCalls);
            }
        }
        else if (_windowsView is not null && !Interop.Kernel32.FlushFileBuffers(_file))
        {
            ThrowSyncFailed("FlushFileBuffers");
        }
    }

    /// <summary>Zeros that <see cref="PrepareOverwriteCore"/> writes from (native, never freed: one per process).</summary>
    private static readonly byte* Zeros = (byte*)NativeMemory.AllocZeroed(ZerosLength);

    private const int ZerosLength = 64 * 1024;

    /// <summary>
    /// Unix: writes zeros over the range of the file with <c>pwrite</c>, so that its pages are in the page cache before
    /// the stores reach them; on Linux then maps them writable in one call (<see cref="Prefault"/>).
    /// </summary>
    /// <remarks>
    /// <para>Why. The file is preallocated (<c>posix_fallocate</c>): its unused pages are unwritten extents. The first
    /// store to such a page through the mapping faults the page into the page cache, and the kernel zero-fills it there
    /// (through readahead, a large folio at a time) before mapping it (and, privately, copying it). On a heap file that
    /// had not been read, that zero-filling was most of a segment's format: a perf profile of two writers on a growing
    /// heap found a third of the stocker's time under <c>zero_user_segments</c>. Written first, the pages come from the
    /// write path, which needs no zero-filling of what it overwrites: the heap's threads took 0.51–0.53 cores instead of
    /// 0.60–0.62 under two writers on a growing heap, and the writers did about an eighth more upserts (benchmark/RESULTS.md).</para>
    /// <para>Safe because the caller's range holds free segments, durably (their descriptors are free, so recovery never
    /// reads their bytes), which it overwrites and writes back whole next. In a private mapping a page already copied
    /// keeps its bytes until the caller's stores; one not copied yet reads the zeros. A failed call is not recorded: the
    /// caller writes the same range back next, where a failure is (fail-stop, as always). Nothing past the process's
    /// file size limit is written (a shared mapping of a larger file: see <see cref="UsesPrivateMapping"/>).</para>
    /// </remarks>
    private protected override void PrepareOverwriteCore(long offset, long length)
    {
        // Never past the process's file size limit (SIGXFSZ would kill it): a shared mapping of a file larger than the
        // limit stores there through the mapping, which the limit does not cover.
        // Nor after a failed write-back or fence (fail-stop): a segment whose release failed may still be formatted on
        // the file, and zeros reaching it there would read as damage.
        if (_windowsView is not null || offset + length > FileSizeLimit() || Failure is not null)
        {
            return;
        }

        // Counted in as BeginFileCall does (a quarantine or dispose waits for it), without its throw: only a hint.
        Interlocked.Increment(ref _fileCalls);
        try
        {
            if (IsDisposed)
            {
                return;
            }

            int fd = (int)_file.DangerousGetHandle();
            long start = offset;
            long end = offset + length;
            while (offset < end)
            {
                nint written = Interop.Libc.Pwrite(fd, Zeros, (nuint)Math.Min(end - offset, ZerosLength), offset);
                if (written <= 0)
                {
                    // (EINTR included: only a hint.)
                    return;
                }

                offset += written;
            }

            Prefault(start, end);
        }
        finally
        {
            Interlocked.Decrement(ref _fileCalls);
        }
    }

    /// <summary>Test hook and benchmark experiment: <see cref="PrepareOverwriteCore"/> writes its zeros but does not prefault the range (the behaviour before 2026-12-02).</summary>
    internal bool PrefaultDisabledForTesting { get; set; }

    /// <summary>Set once <c>madvise(MADV_POPULATE_WRITE)</c> was refused as unknown (Linux before 5.14): not asked again.</summary>
    private bool _noPrefault;

    /// <summary>
    /// Linux: maps every whole page of [<paramref name="start"/>, <paramref name="end"/>) writable in this process with
    /// <c>madvise(MADV_POPULATE_WRITE)</c> (Linux 5.14), one call per <see cref="PrefaultChunk"/>, in a private mapping by copying it from the page cache (the
    /// zeros just written), instead of one page fault per page at the caller's first store.
    /// </summary>
    /// <remarks>
    /// <para>Why. A page fault is a trap into the kernel and out again for each 4 KiB page, and on a virtual machine it
    /// is dear. The zeroing of a segment reads its first byte before storing (the runtime's clear probes its
    /// destination), and the kernel maps the read's neighbours read-only with it (fault-around), so that each store
    /// then took a copy-on-write of a page already mapped, which flushes the TLB of every other processor running the
    /// process (an interrupt to each). On the development machine (a 2-core VM) a stocking of fresh segments took 0.44
    /// of the time per segment populated first while another thread of the process ran, 0.71 alone (BenchmarkDotNet,
    /// <c>FreshSegmentFormatBenchmarks</c>, benchmark/RESULTS.md).</para>
    /// <para>A hint, as the rest of <see cref="PrepareOverwriteCore"/>: nothing is stored (a private page copied keeps
    /// its bytes; a shared page was just written with zeros), only pages inside the range are touched (a shared mapping
    /// dirties what it populates), and a failure is not reported: the stores fault the pages in as before. A kernel that
    /// does not know the advice is not asked again.</para>
    /// </remarks>
    private void Prefault(long start, long end)
    {
        if (!OperatingSystem.IsLinux() || _noPrefault || PrefaultDisabledForTesting)
        {
            return;
        }

        long pageMask = _pageSize - 1;
        long first = (start + pageMask) & ~pageMask;
        long last = end & ~pageMask;
        if (last <= first)
        {
            return;
        }

        // In chunks: each call holds the process's mmap_lock (for reading) while it maps, and a stocking's run of fresh
        // segments may be tens of MiB; whatever needs that lock for writing (the GC committing memory, a thread's stack,
        // another mapping's madvise) waits for one chunk at most, not for the whole run.
        for (long chunk = first; chunk < last && !IsDisposed; chunk += PrefaultChunk)
        {
            long length = Math.Min(PrefaultChunk, last - chunk);
            if (Interop.Libc.Madvise(Pointer + chunk, (nuint)length, Interop.Libc.MadvPopulateWrite) != 0 && Marshal.GetLastPInvokeError() == Interop.Libc.Einval)
            {
                // Linux before 5.14 (EINVAL for an unknown advice; the range is valid). Any other failure (ENOMEM, EFAULT
                // past the file's end, EINTR) is left to the stores.
                _noPrefault = true;
                return;
            }
        }
    }

    /// <summary>The most <see cref="Prefault"/> maps in one call: 2 MiB, 512 pages of 4 KiB.</summary>
    internal const long PrefaultChunk = 2L << 20;

    /// <summary>Copies a range of the private mapping to the same place in the file (into the page cache).</summary>
    private void CopyToFile(long offset, long length)
    {
        BeforeFileCallForTesting?.Invoke();
        if (offset + length > FileSizeLimit())
        {
            // The limit was lowered below the file's size since the heap opened: the pwrite would raise SIGXFSZ, which
            // kills the process. Fail-stop instead, as for a failed write-back: nothing more becomes durable.
            bool first = RecordFailure();
            string failure = $"the write-back of {length} bytes at offset {offset} would pass the process's file size limit ({FileSizeLimit()} bytes, RLIMIT_FSIZE, lowered since the heap file was mapped), where the kernel kills the process (SIGXFSZ)";
            if (first)
            {
                DescribeFailure(failure);
            }

            ThrowHelper.ThrowIO($"{failure}; the written-back range is not durable. Raise the limit (ulimit -f) and reopen the heap: recovery keeps every version up to the durable frontier.");
        }

        BeginFileCall();
        try
        {
            InsideFileCallForTesting?.Invoke();
            int fd = (int)_file.DangerousGetHandle();
            long start = offset;
            long total = length;
            while (length > 0)
            {
                nint written = FailFileCallsForTesting != 0 && offset >= FailFromOffsetForTesting ? Fail() : Interop.Libc.Pwrite(fd, Pointer + offset, (nuint)length, offset);
                if (written < 0 && IgnoreFileCallErrorsForTesting)
                {
                    return;
                }

                if (written > 0)
                {
                    offset += written;
                    length -= written;
                }
                else if (written == 0)
                {
                    // No progress for a non-empty range (a full disk reports ENOSPC instead); errno is not set.
                    bool first = RecordFailure();
                    string failure = $"pwrite of {length} bytes at offset {offset} wrote nothing";
                    if (first)
                    {
                        DescribeFailure(failure);
                    }

                    ThrowHelper.ThrowIO($"{failure}; the written-back range is not durable.");
                }
                else if (Marshal.GetLastPInvokeError() != Interop.Libc.Eintr)
                {
                    // (A signal before anything was copied is retried.)
                    ThrowSyncFailed("pwrite");
                }
            }

            StartWriteOut(fd, start, total);
        }
        finally
        {
            Interlocked.Decrement(ref _fileCalls);
        }
    }

    /// <summary>
    /// Linux: asks the kernel to start writing the copied range to the disk now (<c>sync_file_range</c> with
    /// <c>SYNC_FILE_RANGE_WRITE</c>), instead of when the fence's <c>fdatasync</c> finds the pages dirty.
    /// </summary>
    /// <remarks>
    /// <para>Why. A write-back is followed by a fence, but not at once: a cycle seals and copies a version in chunks
    /// (see BufferedDurableHeap.WriteBackVersion), a sweep marks and copies segment after segment. Started as each
    /// chunk is copied, the disk writes while the next is sealed and copied, and the fence waits only for what is left
    /// (benchmark/RESULTS.md).</para>
    /// <para>A hint: it makes nothing durable (the fence's <c>fdatasync</c> does, and reports the errors of the pages'
    /// write-out, this one's included), and with this flag alone it neither waits for pages nor takes the file's
    /// write-back error, so it needs no place under the fences' gate. Where the call is not available (no such entry
    /// point or system call, a file it does not apply to) the domain stops asking. Any other failure is a failed
    /// write-back (fail-stop, as a failed <c>pwrite</c>): a file system may return an error of the write-out it started
    /// here without recording it for the fence, and a write-back must never fail silently.</para>
    /// </remarks>
    private void StartWriteOut(int fd, long offset, long length)
    {
        StartWriteOutForTesting?.Invoke(offset, length);
        if (!OperatingSystem.IsLinux() || _noWriteOut)
        {
            return;
        }

        // Counted in the phase it begins in, until its failure (if any) is recorded: see WaitForWriteOutsInFlight.
        int phase = Volatile.Read(ref _writeOutPhase) & 1;
        WriteOutPhaseReadForTesting?.Invoke();
        Interlocked.Increment(ref _writeOutsInFlight[phase]);
        try
        {
            int result;
            try
            {
                result = SyncFileRangeCallForTesting?.Invoke() ?? Interop.Libc.SyncFileRange(fd, offset, length, Interop.Libc.SyncFileRangeWrite);
            }
            catch (EntryPointNotFoundException)
            {
                // A C library without it (it is in glibc since 2.6, in musl too): the fence writes everything.
                _noWriteOut = true;
                return;
            }

            if (result == 0)
            {
                _writeOutsStarted++;
                return;
            }

            switch (Marshal.GetLastPInvokeError())
            {
                case Interop.Libc.Enosys or Interop.Libc.Eperm or Interop.Libc.Einval or Interop.Libc.Espipe:
                    // Not available here (a sandbox that refuses the call, a file system or file it does not apply to).
                    _noWriteOut = true;
                    return;
                case Interop.Libc.Eintr:
                    // Interrupted before it started anything: the pages are still dirty, the fence writes them.
                    return;
                default:
                    if (!IgnoreFileCallErrorsForTesting)
                    {
                        ThrowSyncFailed("sync_file_range");
                    }

                    return;
            }
        }
        finally
        {
            // Interlocked.Decrement, then the read of the waiters: full fence; pairs with the increment of the waiters
            // before the count's read in WaitForWriteOutsInFlight (one of the two sees the other).
            if (Interlocked.Decrement(ref _writeOutsInFlight[phase]) == 0 && Volatile.Read(ref _writeOutWaiters) != 0)
            {
                WakeWriteOutWaiters();
            }
        }
    }

    /// <summary>Wakes the fence waiting for write-outs: in a shield, so an interrupt of this thread does not keep it from the lock (the fence would wait on).</summary>
    private void WakeWriteOutWaiters()
    {
        using InterruptShield.Scope shield = InterruptShield.Enter();
        using (InterruptShield.Hold(_writeOutSignal))
        {
            Monitor.PulseAll(_writeOutSignal);
        }
    }

    /// <summary>
    /// After a fence's successful fdatasync: waits for the write-outs (<see cref="StartWriteOut"/>) in flight on other
    /// threads, each of which records its failure before it is counted out, so that the caller's look at
    /// <see cref="PersistenceDomain.Failure"/> after this sees the failure of any of them.
    /// </summary>
    /// <remarks>
    /// Why. A write-out that another thread started may take this fence's pages with its own (they share a page, or its
    /// range covers them), and some errors reach only the call that drove the write-out: ext4 gives up on pages whose
    /// blocks it cannot map, drops them from the page cache and returns the error to that call, recording nothing in
    /// the file. The fence's fdatasync then finds the pages clean and returns success over data that never reached the
    /// disk. Waited for here, the failed write-out has recorded its error before the fence returns (the kernel's own
    /// background write-out giving up the same way reports to no one; nothing here can see that).
    /// Write-outs are counted in two phases (as sleepable RCU counts its readers): the fence waits for the phase about
    /// to become current, flips the phase (new write-outs count in it, so they cannot hold the fence up) and waits for
    /// the old phase's count to drop to zero. One fence waits at a time (the gate is held across the waits); the wait is
    /// as long as the longest write-out call in flight, which only starts the pages' write-out.
    /// </remarks>
    private void WaitForWriteOutsInFlight()
    {
        if (SkipWriteOutWaitForTesting)
        {
            return;
        }

        using (InterruptShield.Hold(_writeOutDrainGate))
        {
            // First the phase about to become current: a write-out may have read the phase before an earlier flip and
            // been counted in after that fence's look (or a fence interrupted in its wait left it): it may be in the
            // kernel now. Then the flip (Interlocked.Increment: full fence; new write-outs count in the phase just
            // waited for, so they cannot hold this fence up) and the old phase. A write-out that read the old phase and
            // is counted in after the look below began its call after this fence's fdatasync returned: not this
            // fence's, and the next fence's first wait covers it.
            int phase = Volatile.Read(ref _writeOutPhase);
            if (!SkipStalePhaseWaitForTesting)
            {
                WaitForNoWriteOutsIn((phase + 1) & 1);
            }

            Interlocked.Increment(ref _writeOutPhase);
            WaitForNoWriteOutsIn(phase & 1);
        }
    }

    /// <summary>Waits until no write-out counted in <paramref name="phase"/> is in flight (see <see cref="WaitForWriteOutsInFlight"/>).</summary>
    private void WaitForNoWriteOutsIn(int phase)
    {
        if (Volatile.Read(ref _writeOutsInFlight[phase]) == 0)
        {
            return;
        }

        using (InterruptShield.Hold(_writeOutSignal))
        {
            // Interlocked.Increment: full fence, then the count's read; pairs with the decrement in StartWriteOut.
            Interlocked.Increment(ref _writeOutWaiters);
            try
            {
                WaitingForWriteOutsForTesting?.Invoke();
                while (Volatile.Read(ref _writeOutsInFlight[phase]) != 0)
                {
                    InterruptShield.Wait(_writeOutSignal, Timeout.InfiniteTimeSpan);
                }
            }
            finally
            {
                Interlocked.Decrement(ref _writeOutWaiters);
            }
        }
    }

    /// <summary>Write-out calls (<see cref="StartWriteOut"/>) in flight, by the phase they began in (see <see cref="WaitForWriteOutsInFlight"/>).</summary>
    private readonly int[] _writeOutsInFlight = new int[2];

    /// <summary>The phase new write-outs are counted in (its lowest bit); a fence's wait flips it.</summary>
    private int _writeOutPhase;

    /// <summary>Fences waiting for write-outs (0 nearly always: a write-out then pulses no one).</summary>
    private int _writeOutWaiters;

    /// <summary>Held by the one fence that flips the phase and waits for the old one's write-outs.</summary>
    private readonly object _writeOutDrainGate = new();

    /// <summary>What a waiting fence waits on and the last write-out of a phase pulses.</summary>
    private readonly object _writeOutSignal = new();

    /// <summary>Broken control for tests: a fence that succeeded returns without waiting for the write-outs in flight (see <see cref="WaitForWriteOutsInFlight"/>).</summary>
    internal bool SkipWriteOutWaitForTesting;

    /// <summary>Broken control for tests: a fence waits for the old phase's write-outs only, not first for those counted late in the phase about to become current (the first version).</summary>
    internal bool SkipStalePhaseWaitForTesting;

    /// <summary>Test hook: runs in a write-out between its read of the phase and its count (a test parks it there while a fence flips the phase).</summary>
    internal Action? WriteOutPhaseReadForTesting;

    /// <summary>Test hook: runs in a fence that found write-outs in flight, before it waits for them.</summary>
    internal Action? WaitingForWriteOutsForTesting;

    /// <summary>Set once <see cref="StartWriteOut"/> found <c>sync_file_range</c> unavailable for this file: write-backs stop asking.</summary>
    private bool _noWriteOut;

    /// <summary>Write-outs <see cref="StartWriteOut"/> started (diagnostic, tests; may undercount under concurrency).</summary>
    internal long WriteOutsStarted => _writeOutsStarted;

    private long _writeOutsStarted;

    /// <summary>
    /// Counts a pwrite/fdatasync in; throws if the domain was disposed or quarantined. Interlocked.Increment: full
    /// fence, paired with the exchange that disposes (PersistenceDomain.Quarantine/Dispose): either this call sees the
    /// domain disposed, or the disposer's <see cref="WaitForFileCalls"/> sees this call.
    /// </summary>
    private void BeginFileCall()
    {
        Interlocked.Increment(ref _fileCalls);
        if (IsDisposed)
        {
            Interlocked.Decrement(ref _fileCalls);
            ThrowHelper.ThrowObjectDisposed(this);
        }
    }

    /// <summary>A failed system call for <see cref="FailFileCallsForTesting"/>: -1 with errno set.</summary>
    private int Fail()
    {
        Marshal.SetLastPInvokeError(FailFileCallsForTesting);
        return -1;
    }

    /// <summary>Waits up to <see cref="FileCallWait"/> for the calls in flight; false if some are still in the kernel.</summary>
    private bool WaitForFileCalls()
    {
        // Volatile.Read: acquire; each call's decrement follows its last access to the mapping and the descriptor.
        long deadline = Environment.TickCount64 + (long)FileCallWait.TotalMilliseconds;
        var spinner = new SpinWait();
        while (Volatile.Read(ref _fileCalls) != 0 && !SkipFileCallWaitForTesting)
        {
            if (Environment.TickCount64 > deadline)
            {
                return false;
            }

            InterruptShield.SpinOnce(ref spinner);
        }

        return true;
    }

    /// <summary>
    /// The process's file size limit, read again when a millisecond tick has passed since the last reading: a limit
    /// lowered while the heap is open (<c>setrlimit</c>, <c>prlimit --pid</c>) used to be seen never, and the next growth
    /// or write-back past it killed the process (SIGXFSZ). One <c>getrlimit</c> per tick at most. (A limit lowered while a
    /// write-back is under way can still meet that write-back: only the kernel could close that window.)
    /// </summary>
    private long FileSizeLimit(bool fresh = false)
    {
        long now = Environment.TickCount64;
        // Volatile: 64-bit fields shared by the writers' threads (growth) and the advancer (write-back); a race between
        // two readings only stores two fresh values.
        if (fresh || now != Volatile.Read(ref _fileSizeLimitReadAt))
        {
            // This reading is returned, not the field, which a racing thread may overwrite with an older one.
            long limit = Interop.Libc.FileSizeLimit();
            Volatile.Write(ref _fileSizeLimit, limit);
            Volatile.Write(ref _fileSizeLimitReadAt, now);
            return limit;
        }

        return Volatile.Read(ref _fileSizeLimit);
    }

    private protected override bool TryGrowCore(long newLength)
    {
        // Past the process's file size limit the extension (and every later pwrite there) would raise SIGXFSZ, which
        // kills the process by default: the heap is full at the limit instead. Read now: growth is rare.
        if (_windowsView is not null || newLength > FileSizeLimit(fresh: true))
        {
            return false;
        }

        // Counted in like a write-back: a quarantine must not release the descriptor under it.
        BeginFileCall();
        try
        {
            InsideFileCallForTesting?.Invoke();
            int error = Interop.Libc.PosixFallocate((int)_file.DangerousGetHandle(), Length, newLength - Length);
            return error == 0;
        }
        finally
        {
            Interlocked.Decrement(ref _fileCalls);
        }
    }

    /// <summary>Records the failure (fail-stop: see <see cref="PersistenceDomain.ThrowIfFailedBefore"/>) and throws it.</summary>
    private void ThrowSyncFailed(string call) => ThrowCallFailed(call, Marshal.GetLastPInvokeError(), "the written-back range may not be durable.");
}
