using System;
using System.Buffers.Binary;
using System.IO;
using System.Runtime.CompilerServices;
using System.Runtime.InteropServices;
using System.Threading;
using System.Threading.Tasks;

namespace Epvs.Persistence;

/// <summary>
/// The heap file (DESIGN §4, layer 2): a superblock (magic, format version, size, clean-shutdown flag, epoch clock,
/// roots), a segment table and the segments, mapped through a <see cref="PersistenceDomain"/> and held under an
/// exclusive lock. The persistent layout is documented in the package README (and, in the repository, on the internal class HeapLayout).
/// </summary>
/// <remarks>
/// <para>Bad input never changes the file: every check (read-only, lock, size, magic, version, geometry) runs before
/// the file is mapped, and each failure is a <see cref="HeapFileException"/> whose <see cref="HeapFileException.Error"/>
/// says which. An existing file is never reformatted.</para>
/// <para>The first write of an open is clearing the clean-shutdown flag; <see cref="Dispose()"/> persists the heap (the
/// whole heap, except through a private mapping: see <see cref="MappedFileWriteBack.PrivateMapping"/>) and sets it
/// again, so <see cref="WasCleanShutdown"/> tells the next opener whether the previous one crashed.</para>
/// </remarks>
public sealed unsafe partial class HeapFile : IDisposable, IAsyncDisposable
{
    /// <summary>The number of root words in the superblock.</summary>
    public const int RootSlotCount = HeapLayout.RootSlotCount;

    /// <summary>The format version this library writes and the newest it reads.</summary>
    public const long FormatVersion = HeapLayout.FormatVersion;

    private readonly FileStream? _lockedFile;
    private readonly bool _ownsDomain;
    private readonly object _growGate = new();

    // Every access to the mapping through a public member runs inside protection on this epoch, so Dispose can wait
    // for the accesses in flight before it unmaps (or, if they do not finish, never unmaps under them).
    private readonly LightEpoch _operations = new();
    private int _disposed;

    /// <summary>Makes every Dispose return only once the first one has closed the file.</summary>
    private readonly DisposalGate _disposal = new();

    private readonly object _userGate = new();

    /// <summary>The heap on this file (one at a time; see <see cref="AttachHeap"/>).</summary>
    private object? _heap;

    /// <summary>Set under the gate by the public Dispose: no heap may attach any more.</summary>
    private bool _closing;

    /// <summary>A heap detached with threads still inside its operations: never unmap (quarantine instead).</summary>
    private bool _heapLeftOperations;

    /// <summary>The threads a heap left inside are in calls of this file (a raw heap's): the quarantine is freed once they have left this file's epoch.</summary>
    private bool _heapLeftOnlyFileCalls;

    /// <summary>Set when an owner knows that what it wrote was not all made durable: Dispose leaves no clean-shutdown mark.</summary>
    private volatile bool _forgoCleanShutdown;

    private HeapFile(PersistenceDomain domain, FileStream? lockedFile, bool ownsDomain, string? path, bool wasClean, object? claim = null)
    {
        Domain = domain;
        _lockedFile = lockedFile;
        _ownsDomain = ownsDomain;
        Path = path;
        WasCleanShutdown = wasClean;
        MaxSegments = (long)Word(HeapLayout.MaxSegmentsOffset);
        DataStart = (long)Word(HeapLayout.DataStartOffset);

        // Last, so that nothing after it can fail and leave the domain claimed: a domain is used by one heap file at a
        // time, and refuses its public Dispose while this one uses it. A caller's domain was claimed before it was
        // formatted or validated (claim), and the claim passes to this file.
        if (claim is null)
        {
            domain.Claim(this, Dispose);
        }
        else
        {
            domain.TransferClaim(claim, this, Dispose);
        }
    }

    /// <summary>The persistence domain that maps the file.</summary>
    public PersistenceDomain Domain { get; }

    /// <summary>
    /// How a <see cref="PersistenceDomainKind.MappedFile"/> domain writes the file back, as resolved when it opened
    /// (<see cref="MappedFileWriteBack.SharedMapping"/> or <see cref="MappedFileWriteBack.PrivateMapping"/>, never
    /// <see cref="MappedFileWriteBack.Auto"/>); null for the other domains.
    /// </summary>
    public MappedFileWriteBack? MappedFileWriteBack => Domain is MappedFilePersistenceDomain mapped
        ? mapped.IsPrivateMapping ? Persistence.MappedFileWriteBack.PrivateMapping : Persistence.MappedFileWriteBack.SharedMapping
        : null;

    /// <summary>The file's full path, or null for a heap on a caller-supplied domain.</summary>
    public string? Path { get; }

    /// <summary>Whether the previous opener closed the heap in order (always true for a heap just created).</summary>
    public bool WasCleanShutdown { get; }

    /// <summary>The number of bytes of the file the heap uses; grows as the allocator adds segments.</summary>
    /// <exception cref="ObjectDisposedException">The file was disposed.</exception>
    public long Size => SealedValue(HeapLayout.HeapSizeOffset);

    /// <summary>The number of segments in use.</summary>
    public long SegmentCount => (Size - DataStart) / HeapLayout.SegmentSize;

    /// <summary>
    /// The persisted epoch clock (buffered durability, part 2): an upper bound on the versions a
    /// <see cref="BufferedDurableHeap"/> has begun on this file — at least the version of its last transition; each cycle
    /// persists frontier v with clock v + 2, the version the next transition moves to, so it is two above
    /// <see cref="DurableFrontier"/> after a cycle (one above after an open, until the heap's first cycle; three, when a
    /// crash left the clock word of that pair durable and not the frontier word). Read-only outside the library.
    /// </summary>
    /// <remarks>
    /// Only the buffered heap's advancer and its recovery write it (internal setter: stores and persists the word,
    /// throwing <see cref="ArgumentOutOfRangeException"/> for a value that is negative or 2^42 or more). Recovery keeps
    /// the payloads tagged up to max(<see cref="DurableFrontier"/>, clock − 2), so a value set by hand would make it
    /// keep versions that were never written back, or drop durable ones, without a word.
    /// </remarks>
    /// <exception cref="ObjectDisposedException">The file was disposed.</exception>
    public long EpochClock
    {
        get => SealedValue(HeapLayout.EpochClockOffset);
        internal set => StoreAndPersist(HeapLayout.EpochClockOffset, HeapLayout.Seal(value, HeapLayout.EpochClockOffset));
    }

    /// <summary>
    /// The persisted durable frontier (buffered durability, part 2): every version up to it was written back by a
    /// <see cref="BufferedDurableHeap"/> on this file. Read-only outside the library.
    /// </summary>
    /// <remarks>
    /// Only the buffered heap's advancer and its recovery write it (internal setter: stores and persists the word,
    /// throwing <see cref="ArgumentOutOfRangeException"/> for a value that is negative or 2^42 or more); see
    /// <see cref="EpochClock"/> for why a value set by hand would lose data silently.
    /// </remarks>
    /// <exception cref="ObjectDisposedException">The file was disposed.</exception>
    public long DurableFrontier
    {
        get => SealedValue(HeapLayout.DurableFrontierOffset);
        internal set => StoreAndPersist(HeapLayout.DurableFrontierOffset, HeapLayout.Seal(value, HeapLayout.DurableFrontierOffset));
    }

    /// <summary>
    /// The version through which every block of a buffered heap is durably sealed, written back by each cycle after its
    /// seals are fenced and durable with the next fence (see <see cref="WriteBackSealedFrontier"/>): recovery compares it with <see cref="DurableFrontier"/> to tell whether a crash came between a
    /// version's frontier and its seals. Advisory (not checked at open): -1 when the word fails its check, as in a file
    /// written before it existed.
    /// </summary>
    internal long SealedFrontier
    {
        get
        {
            EnterOperation();
            try
            {
                return HeapLayout.TryUnseal(VolatileWord(HeapLayout.SealedFrontierOffset), HeapLayout.SealedFrontierOffset, out long value) ? value : -1;
            }
            finally
            {
                ExitOperation();
            }
        }

        set => StoreAndPersist(HeapLayout.SealedFrontierOffset, HeapLayout.Seal(value, HeapLayout.SealedFrontierOffset));
    }

    /// <summary>
    /// Whether the SalvagedThrough word fails its check: damage (creation writes it sealed, as 0, in every file of this
    /// format, so a zeroed word is damage too). Read as 0, it would erase the record of an earlier salvage silently.
    /// </summary>
    internal bool SalvagedThroughDamaged => !HeapLayout.TryUnseal(Word(HeapLayout.SalvagedThroughOffset), HeapLayout.SalvagedThroughOffset, out _);

    /// <summary>
    /// The last version a salvage of a buffered heap kept payloads of, persisted before it freed anything: what it left
    /// (a key's older payload live again, a queue gap) stays on the file until each structure is opened and resolves it,
    /// so the structures accept it among payloads of this version or older at any later open. 0 when the file was never
    /// salvaged, and when the word fails its check: a buffered heap refuses to open over such a word unless it salvages
    /// (<see cref="SalvagedThroughDamaged"/>), and then rewrites it.
    /// </summary>
    internal long SalvagedThrough
    {
        get
        {
            EnterOperation();
            try
            {
                return HeapLayout.TryUnseal(VolatileWord(HeapLayout.SalvagedThroughOffset), HeapLayout.SalvagedThroughOffset, out long value) ? value : 0;
            }
            finally
            {
                ExitOperation();
            }
        }

        set => StoreAndPersist(HeapLayout.SalvagedThroughOffset, HeapLayout.Seal(value, HeapLayout.SalvagedThroughOffset));
    }

    /// <summary>
    /// Stores <see cref="DurableFrontier"/> and <see cref="EpochClock"/> (adjacent words) and persists both with one
    /// write-back and one fence. Each word is failure-atomic on its own; the caller keeps every subset a crash can leave
    /// valid (see BufferedDurableHeap.PersistFrontier).
    /// </summary>
    internal void PersistFrontierAndClock(long frontier, long clock)
    {
        EnterOperation();
        try
        {
            // Volatile.Write: release, as in StoreAndPersistCore; one aligned 8-byte store each.
            Volatile.Write(ref *(ulong*)(Pointer + HeapLayout.DurableFrontierOffset), HeapLayout.Seal(frontier, HeapLayout.DurableFrontierOffset));
            Volatile.Write(ref *(ulong*)(Pointer + HeapLayout.EpochClockOffset), HeapLayout.Seal(clock, HeapLayout.EpochClockOffset));
            Domain.PersistOwned(HeapLayout.EpochClockOffset, HeapLayout.DurableFrontierOffset + sizeof(ulong) - HeapLayout.EpochClockOffset);

            // Durable in a file that can be reopened: one deleted (or replaced by a rename over it) while open keeps
            // taking writes into an inode with no name, so a Sync would return for data nothing can ever reopen.
            if (HasLostItsName())
            {
                ThrowHelper.ThrowIO($"The heap file '{Path}' was deleted or replaced (renamed over) while the heap had it open: what is written to it can never be reopened, so nothing more is made durable. Restore the file from a copy, or create a new heap.");
            }
        }
        finally
        {
            ExitOperation();
        }
    }

    /// <summary>Whether the file has no name left (Linux, <c>statx</c>: a link count of 0); false where that cannot be told.</summary>
    private bool HasLostItsName() => _lockedFile is not null && HasNoName(_lockedFile.SafeFileHandle);

    /// <summary>Whether the open file <paramref name="handle"/> has no name left (Linux, <c>statx</c>: a link count of 0); false where that cannot be told.</summary>
    private static bool HasNoName(Microsoft.Win32.SafeHandles.SafeFileHandle handle)
    {
        if (!OperatingSystem.IsLinux())
        {
            return false;
        }

        byte* result = stackalloc byte[Interop.Libc.StatxSize];
        try
        {
            if (Interop.Libc.Statx((int)handle.DangerousGetHandle(), string.Empty, Interop.Libc.AtEmptyPath, Interop.Libc.StatxNlink, result) != 0)
            {
                return false;
            }
        }
        catch (EntryPointNotFoundException)
        {
            // A C library without statx (glibc before 2.28).
            return false;
        }

        return (*(uint*)result & Interop.Libc.StatxNlink) != 0 && *(uint*)(result + 16) == 0;
    }

    /// <summary>The sweep log's epoch (see <see cref="SweepLog"/>); the setter stores and persists it.</summary>
    internal long SweepLogEpoch
    {
        get => SealedValue(HeapLayout.SweepLogEpochOffset);
        set => StoreAndPersist(HeapLayout.SweepLogEpochOffset, HeapLayout.Seal(value, HeapLayout.SweepLogEpochOffset));
    }

    /// <summary>
    /// Stores <see cref="SealedFrontier"/> and writes it back without a fence of its own: the caller fences it with the
    /// seals it vouches for, before it persists the frontier.
    /// </summary>
    internal void WriteBackSealedFrontier(long value)
    {
        EnterOperation();
        try
        {
            // Volatile.Write: release, as in StoreAndPersistCore; one aligned 8-byte store, failure-atomic.
            Volatile.Write(ref *(ulong*)(Pointer + HeapLayout.SealedFrontierOffset), HeapLayout.Seal(value, HeapLayout.SealedFrontierOffset));
            Domain.WriteBackOwned(HeapLayout.SealedFrontierOffset, sizeof(ulong));
        }
        finally
        {
            ExitOperation();
        }
    }

    internal long MaxSegments { get; }

    /// <summary>
    /// How many bytes the medium holds: the file's length (a growth extends it before the superblock's size covers the
    /// new segments, and keeps a spare segment beyond), or the domain's length without a file of this heap's own.
    /// </summary>
    internal long MediumLength => _lockedFile is not null ? RandomAccess.GetLength(_lockedFile.SafeFileHandle) : Domain.Length;

    /// <summary>How far this open lets the heap grow, in bytes, when the caller's <see cref="HeapFileOptions.MaxSize"/> capped it below the recorded maximum; 0 otherwise.</summary>
    internal long OpenMaxSize { get; private set; }

    internal long DataStart { get; }

    internal byte* Pointer => Domain.Pointer;

    /// <summary>Creates a new heap file at <paramref name="path"/>; fails if anything exists there.</summary>
    /// <remarks>On Linux the file is formatted and made durable before it gets its name (an unnamed file, then
    /// <c>linkat</c>), so a process that dies inside Create leaves nothing at the path, and a file that appears there
    /// meanwhile is never replaced. Elsewhere (or on a file system without unnamed files) it is created in place, and a
    /// crash before it is complete leaves a file that <see cref="Open(string, HeapFileOptions?)"/> refuses as not a heap
    /// file; delete it to try again.</remarks>
    /// <param name="path">Where to create the file.</param>
    /// <param name="options">Size, maximum size and persistence domain; null for the defaults.</param>
    /// <returns>The open heap file, holding its exclusive lock.</returns>
    /// <exception cref="HeapFileException">The path exists, its directory is read-only, the disk lacks space, or the requested domain is unavailable.</exception>
    /// <exception cref="DirectoryNotFoundException">The file's directory does not exist.</exception>
    /// <exception cref="IOException">The file could not be created for another reason, such as no file descriptor left (RLIMIT_NOFILE).</exception>
    /// <exception cref="ArgumentOutOfRangeException">The size is too small for one segment, or above the maximum size (a maximum size other than 0 below the size, or negative), or the size or maximum size is above what the segment table can address (2^24 segments of 64 KiB), or an option is not a value of its enum.</exception>
    public static HeapFile Create(string path, HeapFileOptions? options = null)
    {
        options ??= new HeapFileOptions();
        string fullPath = System.IO.Path.GetFullPath(path);
        CheckMaxSize(options.MaxSize, options.Size);
        long maxSize = options.MaxSize != 0 ? options.MaxSize : options.Size > long.MaxValue / 16 ? long.MaxValue : options.Size * 16;
        (long maxSegments, long dataStart, long segments) = Geometry(options.Size, maxSize, maxSizeChosen: options.MaxSize != 0);
        long heapSize = dataStart + (segments * HeapLayout.SegmentSize);

        if (File.Exists(fullPath) || Directory.Exists(fullPath))
        {
            ThrowHelper.ThrowHeapFile(HeapFileError.AlreadyExists, $"Cannot create heap file '{fullPath}': the path already exists. An existing file is never reformatted; delete it or open it with HeapFile.Open.");
        }

        string directory = System.IO.Path.GetDirectoryName(fullPath)!;
        if (!Directory.Exists(directory))
        {
            throw new DirectoryNotFoundException($"Cannot create heap file '{fullPath}': the directory '{directory}' does not exist.");
        }

        // Creating (ftruncate, posix_fallocate) past the process's file size limit raises SIGXFSZ, which kills the
        // process by default, instead of failing.
        long sizeLimit = Interop.Libc.FileSizeLimit();
        if (heapSize > sizeLimit)
        {
            ThrowHelper.ThrowHeapFile(HeapFileError.InsufficientSpace, $"Cannot create heap file '{fullPath}': it needs {heapSize} bytes but the process may write files of at most {sizeLimit} bytes (RLIMIT_FSIZE, ulimit -f). Choose a smaller HeapFileOptions.Size or raise the limit.");
        }

        // A read-only file system first: it may report less free space than the heap needs (or none), which read as
        // InsufficientSpace instead of the ReadOnly that says what to do.
        if (!OperatingSystem.IsWindows() && Interop.Libc.Access(directory, Interop.Libc.WriteOk) != 0 && Marshal.GetLastPInvokeError() == Interop.Libc.Erofs)
        {
            ThrowHelper.ThrowHeapFile(HeapFileError.ReadOnly, $"Cannot create heap file '{fullPath}': the file system is read-only.");
        }

        long available = new DriveInfo(directory).AvailableFreeSpace;
        if (available < heapSize)
        {
            ThrowHelper.ThrowHeapFile(HeapFileError.InsufficientSpace, $"Cannot create heap file '{fullPath}': it needs {heapSize} bytes but only {available} bytes are free on that file system. Choose a smaller HeapFileOptions.Size or free space.");
        }

        long capacity = dataStart + (maxSegments * HeapLayout.SegmentSize);
        if (CreateUnnamedThenLink(fullPath, directory, heapSize, capacity, maxSegments, dataStart, options) is { } created)
        {
            return created;
        }

        // Not Linux, or a file system without unnamed files: created in place (a crash before the magic is durable leaves
        // a file that Open refuses as "not a heap file", which the caller deletes).
        FileStream stream;
        try
        {
            // PreallocationSize reserves the blocks (posix_fallocate), so a full disk fails here, cleanly, instead
            // of as SIGBUS on a later store through the mapping. .NET deletes the file when that fails.
            stream = new FileStream(fullPath, new FileStreamOptions { Mode = FileMode.CreateNew, Access = FileAccess.ReadWrite, Share = FileShare.None, PreallocationSize = heapSize });
        }
        catch (UnauthorizedAccessException e)
        {
            ThrowHelper.ThrowHeapFile(HeapFileError.ReadOnly, $"Cannot create heap file '{fullPath}': the directory is not writable.", e);
            throw;
        }
        catch (IOException e) when (e.HResult == Interop.Libc.Erofs)
        {
            ThrowHelper.ThrowHeapFile(HeapFileError.ReadOnly, $"Cannot create heap file '{fullPath}': the file system is read-only.", e);
            throw;
        }
        catch (IOException e) when (e.HResult is Interop.Libc.Eexist or unchecked((int)0x80070050))
        {
            // Another creator's file (EEXIST; ERROR_FILE_EXISTS on Windows): never reformatted.
            ThrowHelper.ThrowHeapFile(HeapFileError.AlreadyExists, $"Cannot create heap file '{fullPath}': the path already exists. An existing file is never reformatted; delete it or open it with HeapFile.Open.", e);
            throw;
        }
        catch (IOException e) when (IsLockConflict(e) && File.Exists(fullPath))
        {
            // Created (O_EXCL), then an opener took the lock before ours (.NET locks in a second step): the empty file
            // is ours, and left there it read as "not a heap file" to every later Create and Open.
            File.Delete(fullPath);
            ThrowHelper.ThrowHeapFile(HeapFileError.AlreadyOpen, $"Cannot create heap file '{fullPath}': another opener locked the new file before it was formatted (it was removed). Try again.", e);
            throw;
        }
        catch (IOException e) when (!File.Exists(fullPath) && e.HResult is not (Interop.Libc.Emfile or Interop.Libc.Enfile))
        {
            // (Out of file descriptors is the IOException itself, not a full disk.)
            ThrowHelper.ThrowHeapFile(HeapFileError.InsufficientSpace, $"Cannot create heap file '{fullPath}' of {heapSize} bytes: {e.Message}", e);
            throw;
        }

        if (!LockOrRefuse(stream))
        {
            // As above: an opener locked the new file before us (both without .NET's own lock, see LockOrRefuse). Out of
            // the try: its IOException filters took this HeapFileException (an IOException) for a full disk.
            File.Delete(fullPath);
            ThrowHelper.ThrowHeapFile(HeapFileError.AlreadyOpen, $"Cannot create heap file '{fullPath}': another opener locked the new file before it was formatted (it was removed). Try again.");
        }

        PersistenceDomain? domain = null;
        try
        {
            stream.SetLength(heapSize);
            domain = MapDomain(stream, fullPath, fullPath, heapSize, capacity, options);
            HeapFileTestHooks.BeforeFormattingInPlace?.Invoke(fullPath);
            Format(domain, heapSize, maxSegments, dataStart);
            if (OperatingSystem.IsLinux())
            {
                // The new name durable too (a file system without unnamed files: NFS, some FUSE ones).
                SyncDirectory(directory, fullPath);
            }

            return new HeapFile(domain, stream, ownsDomain: true, fullPath, wasClean: true);
        }
        catch (Exception e)
        {
            // Removed while its lock is still held: an opener that takes the lock after us finds no file to open (released
            // first, the path could be opened in between and then deleted under that opener).
            Exception? removal;
            try
            {
                domain?.Dispose();
                removal = TryDelete(fullPath);
            }
            finally
            {
                stream.Dispose();
            }

            ThrowIfNotRemoved(fullPath, e, removal);
            throw;
        }
    }

    /// <summary>Opens an existing heap file and takes its exclusive lock; checks everything before changing a byte.</summary>
    /// <param name="path">The heap file.</param>
    /// <param name="options">Which persistence domain to map it with, and how far this open may grow the heap
    /// (<see cref="HeapFileOptions.MaxSize"/>; <see cref="HeapFileOptions.Size"/> is ignored); null for the defaults.</param>
    /// <returns>The open heap file.</returns>
    /// <exception cref="FileNotFoundException">There is no file at <paramref name="path"/>, or it is a symbolic link whose target does not exist or that loops (the message says which).</exception>
    /// <exception cref="HeapFileException">The file is read-only, already open, too small, truncated, not a heap file,
    /// of a newer format, damaged, sparse on a file system without the space to fill its holes, or the requested domain
    /// is unavailable. The file's contents are unchanged (a file system may keep the blocks a refused reservation of a
    /// sparse file did allocate: ext4 does).</exception>
    /// <exception cref="IOException">The file could not be opened for another reason, such as no file descriptor left
    /// (RLIMIT_NOFILE) or an I/O error. The file is unchanged.</exception>
    /// <exception cref="ArgumentOutOfRangeException">The domain cannot map a file, an option is not a value of its enum, or <see cref="HeapFileOptions.MaxSize"/> is negative.</exception>
    public static HeapFile Open(string path, HeapFileOptions? options = null) => Open(path, options, HeapLayout.KindUnclaimed);

    /// <summary>Whether the symbolic link at <paramref name="link"/> ends at a file or directory (not a missing target or a loop).</summary>
    private static bool LeadsToAnEntry(string link)
    {
        try
        {
            return File.ResolveLinkTarget(link, returnFinalTarget: true) is { Exists: true };
        }
        catch (IOException)
        {
            // Too many levels of symbolic links (a loop).
            return false;
        }
    }

    /// <summary>
    /// How far an open lets the heap grow, and so how much address space the domain reserves: the maximum recorded at
    /// creation, or less when the caller's <see cref="HeapFileOptions.MaxSize"/> asks (a process under an address-space
    /// limit could not open a heap whose recorded maximum it cannot reserve), never below the heap's size.
    /// </summary>
    private static long OpenCapacity(long recorded, long heapSize, long maxSize) =>
        maxSize == 0 ? recorded : Math.Min(recorded, Math.Max(heapSize, maxSize));

    /// <summary>Opens the file for a heap of <paramref name="kind"/>: a file another kind of heap owns is refused before anything is written.</summary>
    internal static HeapFile Open(string path, HeapFileOptions? options, long kind)
    {
        options ??= new HeapFileOptions();
        if (options.MaxSize < 0)
        {
            ThrowHelper.ThrowArgumentOutOfRange(nameof(options), $"HeapFileOptions.MaxSize is {options.MaxSize}: give 0 (grow to the maximum recorded at creation) or the most bytes this open may grow the heap to.");
        }

        string fullPath = System.IO.Path.GetFullPath(path);
        if (Directory.Exists(fullPath))
        {
            ThrowHelper.ThrowHeapFile(HeapFileError.NotAHeapFile, $"Cannot open heap file '{fullPath}': it is a directory. Give the path of the heap file itself.");
        }

        // A symbolic link whose target is missing, or that leads back to itself (ELOOP), exists as a link: opening it said
        // "Could not find file", sending the user looking for a file while the path names a link.
        if (new FileInfo(fullPath).LinkTarget is { } target && !LeadsToAnEntry(fullPath))
        {
            throw new FileNotFoundException($"Heap file '{fullPath}' is a symbolic link to '{target}', which does not exist or leads back to the link (a loop). Point the link at the heap file, or give the heap file's own path.", fullPath);
        }

        if (!File.Exists(fullPath))
        {
            throw new FileNotFoundException($"Heap file '{fullPath}' does not exist; create it with HeapFile.Create.", fullPath);
        }

        if (IsReadOnly(fullPath))
        {
            ThrowHelper.ThrowHeapFile(HeapFileError.ReadOnly, $"Cannot open heap file '{fullPath}': the file is read-only, and opening a heap writes to it (the clean-shutdown flag, recovery). Make it writable or copy it.");
        }

        FileStream stream = OpenLocked(fullPath);
        if (stream.CanSeek && HasNoName(stream.SafeFileHandle))
        {
            // Opened by name, then locked: removed in between (a failed creation removes its file before it releases the
            // lock). Locked, it would be a heap that nothing can reopen.
            stream.Dispose();
            throw new FileNotFoundException($"Heap file '{fullPath}' was removed while it was being opened (a creation that failed removes its file); create it with HeapFile.Create.", fullPath);
        }

        if (!stream.CanSeek)
        {
            // A pipe, a socket or a character device: it cannot be mapped (its Length threw NotSupportedException).
            stream.Dispose();
            ThrowHelper.ThrowHeapFile(HeapFileError.NotAHeapFile, $"Cannot open heap file '{fullPath}': it is not a regular file (a pipe, a socket or a device, which cannot be mapped).");
        }

        try
        {
            long fileLength = stream.Length;
            byte[] superblock = new byte[HeapLayout.SuperblockSize];
            if (fileLength >= HeapLayout.SuperblockSize)
            {
                RandomAccess.Read(stream.SafeFileHandle, superblock, 0);
            }

            (long heapSize, long maxSegments, long dataStart) = Validate(superblock, fileLength, fullPath, kind);
            long recorded = dataStart + (maxSegments * HeapLayout.SegmentSize);
            long capacity = OpenCapacity(recorded, heapSize, options.MaxSize);
            PersistenceDomain domain = MapDomain(stream, fullPath, fullPath, heapSize, capacity, options);
            try
            {
                // After every check and the mapping (which touches no page), before the first store: all the domain
                // maps up to the heap's recorded maximum (the libpmem domain maps the whole file, a grown heap's spare
                // segment beyond its size too, which a growth then takes without extending the file; nothing is ever
                // stored past the recorded maximum, so a longer file's tail is left as it is).
                Preallocate(stream, HeapFileTestHooks.ReserveHeapPartOnlyForTesting ? heapSize : Math.Max(heapSize, Math.Min(domain.Length, recorded)), fullPath);
            }
            catch
            {
                domain.Dispose();
                throw;
            }

            HeapFile file = Attach(domain, stream, ownsDomain: true, fullPath);
            file.OpenMaxSize = capacity < recorded ? capacity : 0;
            return file;
        }
        catch
        {
            stream.Dispose();
            throw;
        }
    }

    /// <summary>Formats a heap on a caller-supplied domain (a <see cref="SimulatedPersistenceDomain"/>, typically), using all of its current length.</summary>
    /// <param name="domain">The domain; not disposed by the heap file.</param>
    /// <param name="maxSize">The largest size the heap may grow to; 0 means the domain's capacity.</param>
    /// <returns>The heap file.</returns>
    /// <exception cref="ArgumentOutOfRangeException">The domain is too small for one segment, or <paramref name="maxSize"/> is negative, (other than 0) below the domain's length, or above what the segment table can address (2^24 segments of 64 KiB).</exception>
    /// <exception cref="InvalidOperationException">Another heap file uses the domain.</exception>
    public static HeapFile Create(PersistenceDomain domain, long maxSize = 0)
    {
        ArgumentNullException.ThrowIfNull(domain);
        CheckMaxSize(maxSize, domain.Length);

        // Claimed before the first store: a disposed domain, or one another heap file uses (or is being formatted by
        // another call), is refused instead of written.
        object claim = ClaimCallersDomain(domain);
        try
        {
            (long maxSegments, long dataStart, long segments) = Geometry(domain.Length, maxSize != 0 ? maxSize : domain.Capacity, maxSizeChosen: maxSize != 0);
            Format(domain, dataStart + (segments * HeapLayout.SegmentSize), maxSegments, dataStart);
            return new HeapFile(domain, null, ownsDomain: false, null, wasClean: true, claim);
        }
        catch
        {
            domain.Release(claim);
            throw;
        }
    }

    private static object ClaimCallersDomain(PersistenceDomain domain)
    {
        object claim = new();
        domain.Claim(claim, closeUser: null);
        return claim;
    }

    /// <summary>Opens the heap on a caller-supplied domain (for example one made from a crash image).</summary>
    /// <param name="domain">The domain; not disposed by the heap file.</param>
    /// <returns>The heap file.</returns>
    /// <exception cref="HeapFileException">The domain does not hold a valid heap; it is unchanged.</exception>
    /// <exception cref="InvalidOperationException">Another heap file uses the domain.</exception>
    public static HeapFile Open(PersistenceDomain domain)
    {
        ArgumentNullException.ThrowIfNull(domain);
        object claim = ClaimCallersDomain(domain);
        try
        {
            ReadOnlySpan<byte> superblock = domain.Length >= HeapLayout.SuperblockSize ? domain.GetSpan(0, HeapLayout.SuperblockSize) : default;
            Validate(superblock, domain.Length, $"<{domain.Kind} domain>", HeapLayout.KindUnclaimed);
            return Attach(domain, null, ownsDomain: false, null, claim);
        }
        catch
        {
            domain.Release(claim);
            throw;
        }
    }

    /// <summary>Reads root word <paramref name="slot"/>.</summary>
    /// <exception cref="ArgumentOutOfRangeException"><paramref name="slot"/> is not in [0, <see cref="RootSlotCount"/>).</exception>
    /// <exception cref="ObjectDisposedException">The file was disposed.</exception>
    public long GetRoot(int slot)
    {
        int offset = RootOffset(slot);
        EnterOperation();
        try
        {
            return (long)VolatileWord(offset);
        }
        finally
        {
            ExitOperation();
        }
    }

    /// <summary>Stores root word <paramref name="slot"/> and persists it: durable on return.</summary>
    /// <remarks>
    /// A root word is outside a <see cref="BufferedDurableHeap"/>'s versions: durable at once, while the payloads are
    /// durable by version. After a crash a root may therefore name a block that recovery dropped (a payload of a version
    /// beyond the durable frontier) or freed (a payload superseded by its copy, or deleted), and that block may since
    /// hold another payload. On a buffered heap, point a root only at a payload that a <see cref="BufferedDurableHeap.Sync()"/>
    /// has made durable and that is never replaced or deleted, or find payloads at open through
    /// <see cref="BufferedDurableHeap.TakeRecoveredPayloads"/> (by type id and uid), not by offset. On a raw
    /// <see cref="PersistentHeap"/>, persist the block before the root that names it, and clear the root before freeing it.
    /// </remarks>
    /// <exception cref="ArgumentOutOfRangeException"><paramref name="slot"/> is not in [0, <see cref="RootSlotCount"/>).</exception>
    public void SetRoot(int slot, long value) => StoreAndPersist(RootOffset(slot), (ulong)value);

    /// <summary>
    /// Persists the whole heap (through a private mapping, only what was written back reaches the file: see
    /// <see cref="MappedFileWriteBack.PrivateMapping"/>), marks the shutdown clean, unmaps and releases the lock.
    /// Returns only once that is done: a call while another Dispose runs waits for it (interruptibly: see the remarks).
    /// A call after that does nothing.
    /// </summary>
    /// <remarks>
    /// Calls that start after Dispose throw <see cref="ObjectDisposedException"/>. Dispose waits (up to 30 s) for calls
    /// already inside the file — of this type, of a <see cref="PersistentHeap"/> on it — to return before it unmaps. If
    /// they do not (a thread descheduled for that long), it does not mark the
    /// shutdown clean (the next open recovers) and, instead of unmapping under them, replaces the mapping with private
    /// anonymous memory (Linux), so the stragglers neither crash nor write to the file, and releases the lock; the
    /// address range stays reserved. Spans and addresses obtained from the heap must not be used after Dispose.
    /// A Dispose that waits for another one (on another thread) returns when that one has finished, whatever its outcome
    /// (the file is closed either way; that caller gets the exception, if any); <see cref="Thread.Interrupt"/> makes the
    /// waiting call throw <see cref="ThreadInterruptedException"/>, and the other one carries on.
    /// </remarks>
    /// <exception cref="InvalidOperationException">A heap (<see cref="PersistentHeap"/> or <see cref="BufferedDurableHeap"/>)
    /// still uses the file: dispose the heap first (it knows the calls in flight on the mapping; the file does not).
    /// Nothing is disposed. Or: called on the thread of a Dispose of this file that is still running (from a callback
    /// inside it), which cannot complete before this call returns; that Dispose completes regardless. Or: called inside
    /// a call of this file on the same thread (a <see cref="PersistentHeap.ForEachAllocated"/> visitor, say), which goes on
    /// using the mapping once its callback returns; nothing is disposed.</exception>
    /// <exception cref="ThreadInterruptedException">The call waited for another Dispose and was interrupted.</exception>
    public void Dispose()
    {
        ThrowIfDisposeInsideACall();
        bool drained;
        using (InterruptShield.Hold(_userGate))
        {
            if (_heap is not null && Volatile.Read(ref _disposed) == 0)
            {
                ThrowHelper.ThrowInvalidOperation("This heap file is still used by a heap, whose operations may be in flight on the mapping: dispose the heap first (a heap that opened the file itself disposes it too).");
            }

            _closing = true;
            drained = !_heapLeftOperations;
        }

        Dispose(operationsDrained: drained);
    }

    /// <summary>
    /// <see cref="Dispose()"/> without blocking the caller: the refusal that depends on the calling thread (inside a call of
    /// this file) is made here, on the caller's thread, and the rest of Dispose — its wait (up to 30 s) for the calls in
    /// flight, the write-back and the fence of the whole heap — runs on a thread-pool thread. Called from a callback inside
    /// a Dispose of this file, Dispose runs on the calling thread, as <see cref="Dispose()"/> does there.
    /// </summary>
    /// <returns>A task that completes once the file is closed, or faults with what <see cref="Dispose()"/> throws (a refusal
    /// included: nothing is disposed then).</returns>
    public ValueTask DisposeAsync() =>
        AsyncDisposal.Run(ThrowIfDisposeInsideACall, () => _disposal.OnTheDisposingThread, Dispose);

    /// <summary>
    /// Attaches <paramref name="heap"/>: a file holds one heap at a time (two would hand out the same blocks), and its
    /// public <see cref="Dispose()"/> refuses until the heap detaches.
    /// </summary>
    /// <exception cref="InvalidOperationException">Another heap uses the file.</exception>
    /// <exception cref="ObjectDisposedException">The file was disposed.</exception>
    internal void AttachHeap(object heap)
    {
        using (InterruptShield.Hold(_userGate))
        {
            // Volatile.Read: the flag is set outside the gate by the internal Dispose.
            if (_closing || Volatile.Read(ref _disposed) != 0)
            {
                ThrowHelper.ThrowObjectDisposed(this);
            }

            if (_heap is not null)
            {
                ThrowHelper.ThrowInvalidOperation("This heap file is already used by another heap: a file holds one heap at a time (two would hand out the same blocks and overwrite each other's payloads). Dispose that heap first.");
            }

            if (_heapLeftOperations)
            {
                ThrowHelper.ThrowInvalidOperation("The previous heap on this file was closed with threads still inside its operations, which may still allocate through it: dispose this file (its mapping is quarantined, not unmapped) and open it again.");
            }

            _heap = heap;
        }
    }

    /// <summary>
    /// Detaches <paramref name="heap"/>; <paramref name="operationsDrained"/> false makes a later Dispose quarantine the
    /// mapping instead of unmapping it (and refuses another heap). <paramref name="fileClosesNext"/>: the heap owns the
    /// file and disposes it next, so no other heap may attach in between (it would be unmapped under).
    /// <paramref name="leftInFileCalls"/>: the operations that did not drain are calls of this file (a raw heap's, inside
    /// its epoch), so a quarantine can be freed once they have left it (see <see cref="ReleaseQuarantineOnceLeft"/>).
    /// </summary>
    internal void DetachHeap(object heap, bool operationsDrained, bool fileClosesNext, bool leftInFileCalls = false)
    {
        using (InterruptShield.Hold(_userGate))
        {
            if (ReferenceEquals(_heap, heap))
            {
                _heap = null;
                if (!operationsDrained)
                {
                    // (Once: no heap attaches after one that left operations.)
                    _heapLeftOperations = true;
                    _heapLeftOnlyFileCalls = leftInFileCalls;
                }

                _closing |= fileClosesNext;
            }
        }
    }

    /// <summary>
    /// A public Dispose (this file's, or a heap's on it) called inside a call of the file on the same thread — from a
    /// <see cref="PersistentHeap.ForEachAllocated"/> visitor, say — is refused before anything changes: the call goes on
    /// using the mapping once its callback returns. It used to quarantine the mapping under the call, which then went on
    /// over anonymous memory and returned as if complete (a scan that stopped visiting blocks, silently), and to leave the
    /// file without a clean-shutdown mark.
    /// </summary>
    internal void ThrowIfDisposeInsideACall()
    {
        // Volatile.Read: a fresh look; once disposed, the epoch may be too (a later Dispose does nothing anyway).
        if (Volatile.Read(ref _disposed) == 0 && _operations.ThisInstanceProtected())
        {
            ThrowHelper.ThrowInvalidOperation("Dispose was called inside a call of this heap on the same thread (a ForEachAllocated visitor, say), which goes on using the heap's mapping once the callback returns: nothing is disposed. Dispose once that call has returned.");
        }
    }

    /// <summary>Dispose will not mark the shutdown clean: the owner could not make everything it wrote durable.</summary>
    internal void ForgoCleanShutdown() => _forgoCleanShutdown = true;

    /// <summary>The in-flight wait of <see cref="Dispose()"/>.</summary>
    internal static TimeSpan DisposeWait { get; set; } = TimeSpan.FromSeconds(30);

    /// <summary>
    /// Disposes; <paramref name="operationsDrained"/> false says an owner (a buffered heap) knows of threads still
    /// inside operations, so the mapping is quarantined, not unmapped, whatever this file's own wait finds.
    /// </summary>
    internal void Dispose(bool operationsDrained)
    {
        // Interlocked.Exchange: full fence; exactly one caller shuts down. Pairs with the re-check after Resume in
        // EnterOperation: a call either sees the flag and backs out, or is protected before WaitForOperations scans.
        if (Interlocked.Exchange(ref _disposed, 1) != 0)
        {
            // Another Dispose closes the file: return once it has (a call from inside it, on its thread, throws).
            _disposal.WaitForCompletion(nameof(HeapFile), insideOperation: _operations.ThisInstanceProtected());
            return;
        }

        _disposal.Begin();

        // All of it runs to its end if the thread is interrupted: its waits absorb the interrupt, requested again when
        // Dispose ends (an interrupt an inner shield absorbed used to be requested again inside it, and break a later wait).
        using InterruptShield.Scope shield = InterruptShield.Enter();
        try
        {
            DisposeCore(operationsDrained);
        }
        finally
        {
            _disposal.Complete();
        }
    }

    /// <summary>The test hooks of the Dispose that waits for another one.</summary>
    internal DisposalGate DisposalForTesting => _disposal;

    /// <summary>
    /// Frees the mapping a Dispose quarantined (it could not wait for the threads inside) once every thread protected now
    /// in the owner's <paramref name="operations"/> has left, and then every thread inside a call of this file (its own
    /// epoch: a scan, a header read) too: the address space of the whole reservation (the heap's maximum size) was held
    /// for the life of the process. A thread that never leaves (it exited inside) keeps it held.
    /// </summary>
    internal void ReleaseQuarantineOnceLeft(Epvs.LightEpoch operations)
    {
        if (!_ownsDomain)
        {
            return;
        }

        PersistenceDomain domain = Domain;
        Epvs.LightEpoch calls = _operations;
        if (ReferenceEquals(operations, calls))
        {
            // This file's own calls (a raw heap's Dispose): one wait covers both.
            AfterEveryoneLeft(calls, domain.ReleaseQuarantine);
            return;
        }

        AfterEveryoneLeft(operations, () => AfterEveryoneLeft(calls, domain.ReleaseQuarantine));
    }

    /// <summary>Runs <paramref name="action"/> once every thread protected in <paramref name="epoch"/> now has left (at once if it is disposed: nobody is inside).</summary>
    private static void AfterEveryoneLeft(Epvs.LightEpoch epoch, Action action)
    {
        try
        {
            _ = epoch.BumpCurrentEpoch(action);
        }
        catch (ObjectDisposedException)
        {
            action();
        }
    }

    /// <summary>Test hook: runs on Dispose before its wait for the calls in flight (which allocates); a hook that throws
    /// stands for an allocation failure there.</summary>
    internal Action? BeforeOperationWaitForTesting { get; set; }

    /// <summary>Broken control for tests: a quarantine after a raw heap's calls outlived its Dispose's wait is never freed (as before).</summary>
    internal bool ReleaseAfterRawHeapLeftCallsSkippedForTesting { get; set; }

    /// <summary>Test-only: the flag the first Dispose sets (read it with Volatile.Read).</summary>
    internal ref int DisposedFlagForTesting => ref _disposed;

    private void DisposeCore(bool operationsDrained)
    {
        // Inside the try: whatever fails in the wait (it allocates), the mapping is released below, quarantined as when the
        // calls did not drain (a failure here used to skip the unmapping and the release of the lock, for good: a later
        // Dispose does nothing). The wait absorbs an interrupt, requested again when Dispose ends.
        bool drained = false;
        try
        {
            drained = operationsDrained && (HeapFileTestHooks.SkipOperationWait || (!_operations.ThisInstanceProtected() && WaitForOperations(DisposeWait)));
            if (drained && !Domain.IsDisposed && !_forgoCleanShutdown)
            {
                // Through a shared mapping (msync writes dirty pages only) or on pmem, also whatever a caller stored and
                // never wrote back. A private mapping would copy every byte of the heap: there only what was written
                // back reaches the file (MappedFileWriteBack.PrivateMapping), which is everything this package commits.
                if (!Domain.WritesBackByCopy)
                {
                    Domain.PersistOwned(0, (long)(VolatileWord(HeapLayout.HeapSizeOffset) & HeapLayout.SealedValueMask));
                }

                StoreAndPersist(HeapLayout.CleanShutdownOffset, HeapLayout.Seal(1, HeapLayout.CleanShutdownOffset));
            }
        }
        finally
        {
            if (drained)
            {
                // A caller's domain stays claimed if calls may still be in flight, so its Dispose keeps refusing.
                Domain.Release(this);
            }

            if (_ownsDomain)
            {
                if (drained)
                {
                    Domain.Dispose();
                }
                else
                {
                    Domain.Quarantine();

                    // This file's own calls were the ones that did not drain (the owner said its operations had, or
                    // a raw heap's calls, which are this file's, outlived its wait): the quarantined memory is freed once
                    // they have left. (Otherwise the owner knows when: see ReleaseQuarantineOnceLeft.)
                    if (operationsDrained || (!ReleaseAfterRawHeapLeftCallsSkippedForTesting && _heapLeftOnlyFileCalls))
                    {
                        ReleaseQuarantineOnceLeft(_operations);
                    }
                }
            }

            bool removeAfterUnlock = HeapFileTestHooks.RemoveFailedCreateAfterUnlockForTesting;
            if (RemoveIfDisposedForFailedCreate && !removeAfterUnlock)
            {
                // While the lock is still held (see RemoveIfDisposedForFailedCreate).
                RemoveFailedCreate();
            }

            ReleaseLock(_lockedFile);
            if (RemoveIfDisposedForFailedCreate && removeAfterUnlock)
            {
                RemoveFailedCreate();
            }

            if (drained)
            {
                _operations.Dispose();
            }
        }
    }

    /// <summary>
    /// Releases the file's exclusive lock, then closes its descriptor. On Unix the lock (flock) belongs to the open file
    /// description, which a child process forked meanwhile shares until it execs (every spawn, for an instant) or for its
    /// whole life (a fork without exec): closing our descriptor alone left the lock held by the child's copy, and an
    /// immediate reopen of the file failed with AlreadyOpen. LOCK_UN releases it for every copy.
    /// </summary>
    private static void ReleaseLock(FileStream? locked)
    {
        if (locked is null)
        {
            return;
        }

        if (!OperatingSystem.IsWindows() && !HeapFileTestHooks.KeepLockUntilCloseForTesting)
        {
            _ = Interop.Libc.Flock((int)locked.SafeFileHandle.DangerousGetHandle(), Interop.Libc.LockUnlock);
        }

        locked.Dispose();
    }

    /// <summary>
    /// Set by a heap's Create while it sets the new file up: if the file is disposed meanwhile (the heap failed to open),
    /// its path is removed before its lock is released. Removed after the release, the path could be opened by another
    /// opener in between and then deleted under it.
    /// </summary>
    internal bool RemoveIfDisposedForFailedCreate { get; set; }

    private void RemoveFailedCreate()
    {
        if (Path is not { } path)
        {
            return;
        }

        try
        {
            File.Delete(path);
        }
        catch (Exception e) when (e is IOException or UnauthorizedAccessException)
        {
            // Left behind: it opens as an empty heap (a retry of Create then finds the path taken).
        }
    }

    /// <summary>The descriptor that holds the file's lock (tests: a child process inherits a copy of it).</summary>
    internal Microsoft.Win32.SafeHandles.SafeFileHandle? LockedHandleForTesting => _lockedFile?.SafeFileHandle;

    /// <summary>Enters a call that touches the mapping; throws if the file is disposed.</summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    internal void EnterOperation()
    {
        // Volatile.Read: acquire; pairs with the exchange in Dispose. (Checked first so that a disposed file throws
        // its own ObjectDisposedException rather than the epoch's.)
        if (Volatile.Read(ref _disposed) != 0)
        {
            ThrowHelper.ThrowObjectDisposed(this);
        }

        // Resume announces with a full fence before the re-check below: store-load ordered against Dispose's
        // exchange-then-scan, so Dispose cannot miss a call that missed the flag.
        _operations.Resume();
        if (Volatile.Read(ref _disposed) != 0)
        {
            _operations.Suspend();
            ThrowHelper.ThrowObjectDisposed(this);
        }
    }

    /// <summary>Leaves a call entered with <see cref="EnterOperation"/>.</summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    internal void ExitOperation() => _operations.Suspend();

    /// <summary>
    /// Enters a call on a helper thread of a call already inside the file (a parallel scan's workers): no disposed check,
    /// because the caller's own protection, older than any Dispose that began meanwhile, keeps the mapping until the
    /// helpers are done (the caller waits for them), as it did before they entered. Leave with <see cref="ExitOperation"/>.
    /// </summary>
    internal void EnterHelperOfACall() => _operations.Resume();

    /// <summary>
    /// For the Dispose of a heap on a caller's file (the file stays open): waits up to <see cref="DisposeWait"/> until no
    /// call that entered the file before is still inside it. The heap set its own disposed flag first (with a full fence),
    /// and its calls check it after entering (see PersistentHeap.EnterCall), so none enters unseen meanwhile.
    /// </summary>
    /// <returns>Whether the calls drained (false: one stayed inside longer). A failure of the wait itself (it allocates)
    /// is thrown: the heap's Dispose then closes it as one with calls in flight, and reports the failure.</returns>
    internal bool WaitForCallsOfAHeap() =>
        HeapFileTestHooks.SkipOperationWait || (!_operations.ThisInstanceProtected() && WaitForOperations(DisposeWait));

    private bool WaitForOperations(TimeSpan timeout)
    {
        // The action runs once every thread protected before the bump has left: then no call is inside the mapping.
        try
        {
            BeforeOperationWaitForTesting?.Invoke();
            Task left = _operations.BumpCurrentEpochAsync(static () => { });
            return InterruptShield.WaitFor(left, timeout);
        }
        catch (AggregateException)
        {
            return false;
        }
    }

    /// <summary>
    /// Whether a heap of <paramref name="segmentCount"/> segments could grow by one: the segment table has room
    /// (<see cref="MaxSegments"/>), the domain can reach the length (<see cref="PersistenceDomain.Capacity"/>; the
    /// libpmem domain never grows), and the medium has not refused a growth since this open (<see cref="GrowthRefused"/>).
    /// </summary>
    internal bool CanGrowBeyond(long segmentCount) =>
        !GrowthRefused && segmentCount < MaxSegments && DataStart + ((segmentCount + 1) * HeapLayout.SegmentSize) <= Domain.Capacity;

    /// <summary>
    /// Whether the medium refused the last extension of the file (a full file system, the process's file size limit):
    /// a growth, or the spare segment beyond the heap that every growth keeps (<see cref="TryGrow"/>,
    /// <see cref="EnsureGrowthSpare"/>). The heap then counts as unable to grow, so that it keeps its delete reserve,
    /// until a growth and its spare succeed again (growth is still tried when an allocation finds no room).
    /// </summary>
    // Volatile.Read: acquire; pairs with the release in RefuseGrowth and TryGrow.
    internal bool GrowthRefused => Volatile.Read(ref _growthRefused);

    private bool _growthRefused;

    /// <summary>Records that the medium refused a growth (see <see cref="GrowthRefused"/>).</summary>
    internal void RefuseGrowth() => Volatile.Write(ref _growthRefused, true);

    /// <summary>
    /// After recovery (which validates and writes first), for a heap that keeps a delete reserve: makes sure the medium
    /// holds the spare segment beyond the heap that a growth refused later grows into (a heap that never grew, a file
    /// written before the spare existed, or one whose spare a crash lost); if the medium refuses it, the heap counts as
    /// unable to grow from the start (<see cref="GrowthRefused"/>), so its last free segment is kept for deletes.
    /// </summary>
    internal void EnsureGrowthSpare()
    {
        using (InterruptShield.Hold(_growGate))
        {
            long segments = SegmentCount;
            long spare = Size + HeapLayout.SegmentSize;
            if (NoGrowthSpareForTesting || !CanGrowBeyond(segments) || Domain.Length >= spare)
            {
                return;
            }

            if (!Domain.TryGrowOwned(spare))
            {
                RefuseGrowth();
            }
        }
    }

    /// <summary>Test hook (broken control): a growth does not extend the medium by a spare segment beyond the heap.</summary>
    internal static bool NoGrowthSpareForTesting { get; set; }

    /// <summary>Extends the heap to <paramref name="segmentCount"/> segments if the domain can grow; the new segments are free.</summary>
    internal bool TryGrow(long segmentCount)
    {
        using (InterruptShield.Hold(_growGate))
        {
            if (segmentCount <= SegmentCount)
            {
                return true;
            }

            if (segmentCount > MaxSegments)
            {
                return false;
            }

            long newSize = DataStart + (segmentCount * HeapLayout.SegmentSize);
            if (!Domain.TryGrowOwned(newSize))
            {
                return false;
            }

            // The new segments' descriptors (free, checked: a zero descriptor inside the heap is damage) are durable
            // before the heap size covers them; a crash in between leaves them outside the heap, rewritten by the
            // next growth.
            long current = SegmentCount;
            ulong* table = (ulong*)(Pointer + HeapLayout.SuperblockSize);
            for (long s = current; s < segmentCount; s++)
            {
                table[s] = HeapLayout.InitialDescriptor(s);
            }

            Domain.PersistOwned(HeapLayout.SuperblockSize + (current * sizeof(ulong)), (segmentCount - current) * sizeof(ulong));

            // The file is longer before the superblock says so: a crash in between leaves unused tail bytes, never
            // a superblock claiming bytes the file lacks.
            StoreAndPersist(HeapLayout.HeapSizeOffset, HeapLayout.Seal(newSize, HeapLayout.HeapSizeOffset));

            // A spare segment of medium beyond the heap (tail bytes, as above): when a later growth is refused (the file
            // system full, the file size limit reached), the heap can still grow by one segment into it, which becomes
            // its delete reserve; without it, a heap full because its file could not grow refused every delete (a delete
            // needs a block for its anti-payload), after Syncs and reopens too. If even the spare is refused now, the
            // heap counts as unable to grow from here on, while the segments it just gained are free.
            long spare = newSize + HeapLayout.SegmentSize;
            if (!NoGrowthSpareForTesting && segmentCount < MaxSegments && spare <= Domain.Capacity)
            {
                // Volatile.Write: release; read by allocating threads under the segment gate (GrowthRefused).
                Volatile.Write(ref _growthRefused, !Domain.TryGrowOwned(spare));
            }

            return true;
        }
    }

    internal ulong Word(int offset) => *(ulong*)(Pointer + offset);

    /// <summary>
    /// Records which kind of heap owns the file (the first opener claims it) or fails if another kind does: a file of a
    /// raw <see cref="PersistentHeap"/> opened as a <see cref="BufferedDurableHeap"/> would otherwise lose every block.
    /// </summary>
    /// <returns>Whether this call claimed it (the file's first open).</returns>
    internal bool ClaimKind(long kind)
    {
        long owner = SealedValue(HeapLayout.HeapKindOffset);
        if (owner == kind)
        {
            return false;
        }

        if (owner != HeapLayout.KindUnclaimed)
        {
            ThrowKindMismatch(Path ?? $"<{Domain.Kind} domain>", owner, kind);
        }

        StoreAndPersist(HeapLayout.HeapKindOffset, HeapLayout.Seal(kind, HeapLayout.HeapKindOffset));
        return true;
    }

    private long SealedValue(int offset)
    {
        EnterOperation();
        try
        {
            return (long)(VolatileWord(offset) & HeapLayout.SealedValueMask);
        }
        finally
        {
            ExitOperation();
        }
    }

    private ulong VolatileWord(int offset) =>
        // Volatile.Read: acquire; pairs with the release in StoreAndPersist.
        Volatile.Read(ref *(ulong*)(Pointer + offset));

    private void StoreAndPersist(int offset, ulong value)
    {
        if (offset == HeapLayout.CleanShutdownOffset)
        {
            // Only Dispose writes it, after the wait for calls in flight.
            StoreAndPersistCore(offset, value);
            return;
        }

        EnterOperation();
        try
        {
            StoreAndPersistCore(offset, value);
        }
        finally
        {
            ExitOperation();
        }
    }

    private void StoreAndPersistCore(int offset, ulong value)
    {
        // Volatile.Write: release; a reader of the word also sees what was written before it. One aligned 8-byte
        // store, so failure-atomic.
        Volatile.Write(ref *(ulong*)(Pointer + offset), value);
        Domain.PersistOwned(offset, sizeof(ulong));
    }

    private static int RootOffset(int slot)
    {
        if ((uint)slot >= RootSlotCount)
        {
            ThrowHelper.ThrowArgumentOutOfRange(nameof(slot), $"Root slot {slot} is not in [0, {RootSlotCount}).");
        }

        return HeapLayout.RootsOffset + (slot * sizeof(long));
    }

    private static HeapFile Attach(PersistenceDomain domain, FileStream? stream, bool ownsDomain, string? path, object? claim = null)
    {
        ulong* clean = (ulong*)(domain.Pointer + HeapLayout.CleanShutdownOffset);
        bool wasClean = HeapLayout.TryUnseal(*clean, HeapLayout.CleanShutdownOffset, out long flag) && flag == 1;

        // The first write of an open. Volatile.Write: release (plain data before it is not reordered after it).
        Volatile.Write(ref *clean, HeapLayout.Seal(0, HeapLayout.CleanShutdownOffset));
        domain.PersistOwned(HeapLayout.CleanShutdownOffset, sizeof(ulong));
        return new HeapFile(domain, stream, ownsDomain, path, wasClean, claim);
    }

    /// <summary>A maximum size is 0 (the default) or at least the size: never clamped silently.</summary>
    private static void CheckMaxSize(long maxSize, long size)
    {
        if (maxSize < 0 || (maxSize != 0 && maxSize < size))
        {
            ThrowHelper.ThrowArgumentOutOfRange(nameof(HeapFileOptions.MaxSize), $"The maximum size ({maxSize} bytes) must be 0 (the default) or at least the size ({size} bytes).");
        }
    }

    /// <summary>The most segments the segment table can address (<see cref="HeapLayout"/>: 24 bits of segment index).</summary>
    internal const long MaxAddressableSegments = 1L << 24;

    /// <summary>The largest maximum size a caller may ask for: one byte more would need a segment the table cannot address.</summary>
    internal static readonly long MaxAddressableSize = HeapLayout.MaxDataStart(MaxAddressableSegments + 1) + ((MaxAddressableSegments + 1) * HeapLayout.SegmentSize) - 1;

    /// <summary>
    /// The heap's geometry for <paramref name="size"/> bytes growing up to <paramref name="maxSize"/>. A maximum the
    /// caller chose (<paramref name="maxSizeChosen"/>) above what the segment table can address is refused, never
    /// clamped silently; a default one (16 × the size, or a domain's capacity) is capped at it.
    /// </summary>
    private static (long MaxSegments, long DataStart, long Segments) Geometry(long size, long maxSize, bool maxSizeChosen)
    {
        if (maxSizeChosen && maxSize > MaxAddressableSize)
        {
            ThrowHelper.ThrowArgumentOutOfRange(nameof(HeapFileOptions.MaxSize), $"The maximum size ({maxSize} bytes) is above what the segment table can address: at most {MaxAddressableSegments} segments of {HeapLayout.SegmentSize} bytes, a maximum size of at most {MaxAddressableSize} bytes. Choose a smaller HeapFileOptions.MaxSize (or 0 for the default).");
        }

        if (size > MaxAddressableSize)
        {
            ThrowHelper.ThrowArgumentOutOfRange(nameof(HeapFileOptions.Size), $"The size ({size} bytes) is above what the segment table can address: at most {MaxAddressableSegments} segments of {HeapLayout.SegmentSize} bytes, a size of at most {MaxAddressableSize} bytes.");
        }

        maxSize = Math.Max(maxSize, size);
        long maxSegments = Math.Min(SegmentsWithin(maxSize), MaxAddressableSegments);
        long dataStart = HeapLayout.DataStart(maxSegments, size);
        long segments = (size - dataStart) / HeapLayout.SegmentSize;
        if (segments < 1)
        {
            ThrowHelper.ThrowArgumentOutOfRange(nameof(size), $"A heap of {size} bytes (maximum {maxSize}) has no room for a segment: it needs at least {dataStart + HeapLayout.SegmentSize} bytes (the segment table for that maximum size and the sweep log alone take {dataStart - HeapLayout.SuperblockSize} bytes). Choose a larger size or a smaller maximum size.");
        }

        return (maxSegments, dataStart, Math.Min(segments, maxSegments));
    }

    /// <summary>
    /// The most segments a heap of at most <paramref name="maxSize"/> bytes holds, its segment table included (a
    /// maximum size bounds the file, the superblock and the table with the segments; at least one segment, which a
    /// size too small for it then refuses).
    /// </summary>
    private static long SegmentsWithin(long maxSize)
    {
        // Each segment takes its 64 KiB and a descriptor word of the table, which is rounded up to whole pages: start
        // from the count without the rounding and step down past it (one segment at most).
        long segments = (maxSize - HeapLayout.SuperblockSize) / (HeapLayout.SegmentSize + sizeof(long));
        while (segments > 1 && HeapLayout.MaxDataStart(segments) + (segments * HeapLayout.SegmentSize) > maxSize)
        {
            segments--;
        }

        return Math.Max(1, segments);
    }

    private static void Format(PersistenceDomain domain, long heapSize, long maxSegments, long dataStart)
    {
        byte* p = domain.Pointer;
        new Span<byte>(p, HeapLayout.SuperblockSize).Clear();
        new Span<byte>(p + HeapLayout.SuperblockSize, checked((int)HeapLayout.TableBytes(maxSegments))).Clear();
        long segments = (heapSize - dataStart) / HeapLayout.SegmentSize;
        ulong* table = (ulong*)(p + HeapLayout.SuperblockSize);
        for (long s = 0; s < segments; s++)
        {
            table[s] = HeapLayout.InitialDescriptor(s);
        }

        *(ulong*)(p + HeapLayout.FormatVersionOffset) = (ulong)HeapLayout.FormatVersion;
        *(ulong*)(p + HeapLayout.HeapSizeOffset) = HeapLayout.Seal(heapSize, HeapLayout.HeapSizeOffset);
        foreach (int sealedZero in new[] { HeapLayout.CleanShutdownOffset, HeapLayout.EpochClockOffset, HeapLayout.DurableFrontierOffset, HeapLayout.HeapKindOffset, HeapLayout.SealedFrontierOffset, HeapLayout.SalvagedThroughOffset })
        {
            *(ulong*)(p + sealedZero) = HeapLayout.Seal(0, sealedZero);
        }

        // The sweep log's halves (lap 1 and lap 0) and its first epoch.
        SweepLog.Format(p, HeapLayout.SweepLogStart(maxSegments), dataStart);

        *(ulong*)(p + HeapLayout.SegmentSizeOffset) = HeapLayout.SegmentSize;
        *(ulong*)(p + HeapLayout.MaxSegmentsOffset) = (ulong)maxSegments;
        *(ulong*)(p + HeapLayout.DataStartOffset) = (ulong)dataStart;
        *(ulong*)(p + HeapLayout.GeometryCheckOffset) = HeapLayout.GeometryCheck(HeapLayout.Magic, (ulong)HeapLayout.FormatVersion, HeapLayout.SegmentSize, (ulong)maxSegments, (ulong)dataStart);
        domain.PersistOwned(0, dataStart);

        // Magic last, alone: until it is durable the file is not a heap file.
        // Volatile.Write: release; every superblock store above precedes the magic in program order.
        Volatile.Write(ref *(ulong*)(p + HeapLayout.MagicOffset), HeapLayout.Magic);
        domain.PersistOwned(HeapLayout.MagicOffset, sizeof(ulong));
    }

    private static (long HeapSize, long MaxSegments, long DataStart) Validate(ReadOnlySpan<byte> superblock, long fileLength, string name, long kind)
    {
        if (fileLength < HeapLayout.SuperblockSize)
        {
            ThrowHelper.ThrowHeapFile(HeapFileError.SmallerThanSuperblock, $"Cannot open heap file '{name}': it is {fileLength} bytes, smaller than the {HeapLayout.SuperblockSize}-byte superblock. It is not a heap file, or it was cut short.");
        }

        ulong magic = BinaryPrimitives.ReadUInt64LittleEndian(superblock);
        if (magic != HeapLayout.Magic)
        {
            ThrowHelper.ThrowHeapFile(HeapFileError.NotAHeapFile, $"Cannot open heap file '{name}': it does not start with the EPVS heap magic (found 0x{magic:X16}, expected 0x{HeapLayout.Magic:X16}). It is not a heap file, or its creation did not complete.");
        }

        ulong version = Read(superblock, HeapLayout.FormatVersionOffset);
        if (version is > 0 and < (ulong)HeapLayout.FormatVersion)
        {
            ThrowHelper.ThrowHeapFile(HeapFileError.OlderFormatVersion, $"Cannot open heap file '{name}': it has format version {version}, which this library no longer reads (it reads version {HeapLayout.FormatVersion}, which checks the superblock, every segment descriptor and every block header word). Open it with the Epvs.Persistence that wrote it and copy the data out.");
        }

        if (version > (ulong)HeapLayout.FormatVersion)
        {
            ThrowHelper.ThrowHeapFile(HeapFileError.NewerFormatVersion, $"Cannot open heap file '{name}': it has format version {version}, and this library reads versions up to {HeapLayout.FormatVersion}. Open it with a newer Epvs.Persistence.");
        }

        ulong segmentSize = Read(superblock, HeapLayout.SegmentSizeOffset);
        ulong maxSegments = Read(superblock, HeapLayout.MaxSegmentsOffset);
        ulong dataStart = Read(superblock, HeapLayout.DataStartOffset);
        if (!HeapLayout.TryUnseal(Read(superblock, HeapLayout.HeapSizeOffset), HeapLayout.HeapSizeOffset, out long sealedSize))
        {
            ThrowHelper.ThrowHeapFile(HeapFileError.Corrupt, $"Cannot open heap file '{name}': its superblock is damaged (the heap size word fails its check).");
        }

        foreach ((int offset, string what) in new[] { (HeapLayout.CleanShutdownOffset, "clean-shutdown flag"), (HeapLayout.EpochClockOffset, "epoch clock"), (HeapLayout.DurableFrontierOffset, "durable frontier"), (HeapLayout.HeapKindOffset, "heap kind"), (HeapLayout.SweepLogEpochOffset, "sweep log's epoch") })
        {
            if (!HeapLayout.TryUnseal(Read(superblock, offset), offset, out _))
            {
                ThrowHelper.ThrowHeapFile(HeapFileError.Corrupt, $"Cannot open heap file '{name}': its superblock is damaged (the {what} word fails its check).");
            }
        }

        HeapLayout.TryUnseal(Read(superblock, HeapLayout.HeapKindOffset), HeapLayout.HeapKindOffset, out long owner);
        if (kind != HeapLayout.KindUnclaimed && owner != HeapLayout.KindUnclaimed && owner != kind)
        {
            ThrowKindMismatch(name, owner, kind);
        }

        ulong heapSize = (ulong)sealedSize;
        bool consistent = version == (ulong)HeapLayout.FormatVersion
            && Read(superblock, HeapLayout.GeometryCheckOffset) == HeapLayout.GeometryCheck(magic, version, segmentSize, maxSegments, dataStart)
            && segmentSize == HeapLayout.SegmentSize
            && maxSegments is >= 1 and <= 1UL << 24
            && HeapLayout.IsValidDataStart((long)dataStart, (long)maxSegments)
            && heapSize > dataStart
            && (heapSize - dataStart) % segmentSize == 0
            && (heapSize - dataStart) / segmentSize <= maxSegments;
        if (!consistent)
        {
            ThrowHelper.ThrowHeapFile(HeapFileError.Corrupt, $"Cannot open heap file '{name}': its superblock is damaged (version {version}, segment size {segmentSize}, {maxSegments} segments maximum, data at {dataStart}, size {heapSize}).");
        }

        if ((ulong)fileLength < heapSize)
        {
            ThrowHelper.ThrowHeapFile(HeapFileError.Truncated, $"Cannot open heap file '{name}': it is truncated — the superblock records {heapSize} bytes but the file has {fileLength}. Restore it from a copy.");
        }

        return ((long)heapSize, (long)maxSegments, (long)dataStart);
    }

    [System.Diagnostics.CodeAnalysis.DoesNotReturn]
    private static void ThrowKindMismatch(string name, long owner, long kind)
    {
        static string Name(long k) => k == HeapLayout.KindRaw ? "a PersistentHeap" : k == HeapLayout.KindBufferedDurable ? "a BufferedDurableHeap" : $"an unknown heap kind ({k})";
        ThrowHelper.ThrowHeapFile(HeapFileError.WrongHeapKind, $"Cannot open heap file '{name}' as {Name(kind)}: it belongs to {Name(owner)}, whose blocks the other kind would not recognize (and would free). Open it with {Name(owner)[2..]}.Open.");
    }

    /// <summary>
    /// Reserves the file's blocks before mapping it (posix_fallocate): a sparse file (a copy made with holes, a file
    /// system that ran full) would otherwise fail on a later store through the mapping with SIGBUS, killing the process.
    /// </summary>
    private static void Preallocate(FileStream stream, long length, string name)
    {
        if (OperatingSystem.IsWindows() || HeapFileTestHooks.SkipPreallocation)
        {
            return;
        }

        int error;
        do
        {
            error = HeapFileTestHooks.SimulatedFallocateError ?? Interop.Libc.PosixFallocate((int)stream.SafeFileHandle.DangerousGetHandle(), 0, length);
        }
        while (error == Interop.Libc.Eintr && HeapFileTestHooks.SimulatedFallocateError is null);

        if (Interop.Libc.IsOutOfSpace(error))
        {
            ThrowHelper.ThrowHeapFile(HeapFileError.InsufficientSpace, $"Cannot open heap file '{name}': its {length} bytes are not all allocated on disk (a sparse file) and the file system has no space left to allocate them ({Marshal.GetPInvokeErrorMessage(error)}). Mapping it would crash the process on the first store into a hole. Free space, or copy the file without holes.");
        }

        // Other errors (EOPNOTSUPP, EINVAL on file systems without fallocate) leave the file as it is, like before.
        // (EINTR, a signal during a long reservation, is asked again above.)
    }

    private static ulong Read(ReadOnlySpan<byte> superblock, int offset) => BinaryPrimitives.ReadUInt64LittleEndian(superblock[offset..]);

    private static bool IsReadOnly(string path)
    {
        if (OperatingSystem.IsWindows())
        {
            return (File.GetAttributes(path) & FileAttributes.ReadOnly) != 0;
        }

        // Checked explicitly: root may open a file without write permission, and we want the same answer for every user.
        return (File.GetUnixFileMode(path) & UnixFileMode.UserWrite) == 0;
    }

    private static FileStream OpenLocked(string path)
    {
        try
        {
            // FileShare.None takes an exclusive advisory lock (flock on Unix, a share mode on Windows) that a second
            // opener, in this process or another, fails to get; on Unix taken again here (see LockOrRefuse).
            FileStream stream = new FileStream(path, FileMode.Open, FileAccess.ReadWrite, FileShare.None);
            if (!LockOrRefuse(stream))
            {
                ThrowHelper.ThrowHeapFile(HeapFileError.AlreadyOpen, $"Cannot open heap file '{path}': another opener holds its exclusive lock (a heap file is opened by one HeapFile at a time). Dispose the other one first.");
            }

            return stream;
        }
        catch (UnauthorizedAccessException e)
        {
            ThrowHelper.ThrowHeapFile(HeapFileError.ReadOnly, $"Cannot open heap file '{path}' for writing: access denied.", e);
            throw;
        }
        catch (IOException e) when (e.HResult == Interop.Libc.Erofs)
        {
            ThrowHelper.ThrowHeapFile(HeapFileError.ReadOnly, $"Cannot open heap file '{path}' for writing: it is on a read-only file system. Remount it read-write or copy the file to a writable place.", e);
            throw;
        }
        catch (IOException e) when (IsLockConflict(e))
        {
            ThrowHelper.ThrowHeapFile(HeapFileError.AlreadyOpen, $"Cannot open heap file '{path}': another opener holds its exclusive lock (a heap file is opened by one HeapFile at a time). Dispose the other one first.", e);
            throw;
        }

        // Any other failure to open (no file descriptor left, RLIMIT_NOFILE; an I/O error) is the IOException itself:
        // reported as AlreadyOpen, it sent the operator looking for another process.
    }

    /// <summary>
    /// On Unix, takes the file's exclusive lock (<c>flock</c>) itself, as <see cref="FileShare.None"/> does — unless the
    /// runtime's switch <c>System.IO.DisableFileLocking</c> (<c>DOTNET_SYSTEM_IO_DISABLEFILELOCKING=1</c>, or the
    /// runtimeconfig property) is set, which turns <see cref="FileShare.None"/> into no lock at all. With the switch, one
    /// heap file opened twice (in one process or two), both heaps wrote and synced, and the file kept one heap's writes
    /// and lost the other's without a word. A no-op where the stream holds the lock already (flock on the same open file).
    /// </summary>
    /// <returns>False, with the stream disposed, when another opener holds the lock; true otherwise (a file system
    /// without locks included, as <see cref="FileShare.None"/> treats it).</returns>
    private static bool LockOrRefuse(FileStream stream)
    {
        if (OperatingSystem.IsWindows())
        {
            return true;
        }

        if (Interop.Libc.Flock((int)stream.SafeFileHandle.DangerousGetHandle(), Interop.Libc.LockExclusive | Interop.Libc.LockNonBlocking) == 0
            || Marshal.GetLastPInvokeError() != (OperatingSystem.IsLinux() ? EWOULDBLOCKLinux : EWOULDBLOCKBsd)
            || HeapFileTestHooks.IgnoreLockConflictsForTesting)
        {
            return true;
        }

        stream.Dispose();
        return false;
    }

    /// <summary>
    /// Whether opening failed because another opener holds the file's lock: on Unix the failed flock (EWOULDBLOCK,
    /// which .NET reports as an IOException whose HResult is the errno), on Windows a sharing or lock violation.
    /// </summary>
    private static bool IsLockConflict(IOException e) => OperatingSystem.IsWindows()
        ? e.HResult is unchecked((int)0x80070020) or unchecked((int)0x80070021)
        : e.HResult == (OperatingSystem.IsLinux() ? EWOULDBLOCKLinux : EWOULDBLOCKBsd);

    private const int EWOULDBLOCKLinux = 11;
    private const int EWOULDBLOCKBsd = 35;

    /// <param name="stream">The open file.</param>
    /// <param name="path">The file's name, for messages.</param>
    /// <param name="mapPath">A path that opens the same file, for libpmem (which maps by path): <paramref name="path"/>, or
    /// the <c>/proc/self/fd</c> link of an unnamed file.</param>
    /// <param name="length">The file's length.</param>
    /// <param name="capacity">How far the heap may grow.</param>
    /// <param name="options">The domain to map with.</param>
    private static PersistenceDomain MapDomain(FileStream stream, string path, string mapPath, long length, long capacity, HeapFileOptions options)
    {
        if (options.MappedFileWriteBack is not (Persistence.MappedFileWriteBack.Auto or Persistence.MappedFileWriteBack.SharedMapping or Persistence.MappedFileWriteBack.PrivateMapping))
        {
            ThrowHelper.ThrowArgumentOutOfRange(nameof(options), $"HeapFileOptions.MappedFileWriteBack {options.MappedFileWriteBack} is not a MappedFileWriteBack value.");
        }

        if (options.MappedFileWriteBack == Persistence.MappedFileWriteBack.PrivateMapping && !OperatingSystem.IsLinux())
        {
            ThrowHelper.ThrowHeapFile(HeapFileError.DomainUnavailable, $"Cannot map heap file '{path}' privately: MappedFileWriteBack.PrivateMapping needs Linux (pwrite into the page cache of a copy-on-write mapping). Use Auto or SharedMapping.");
        }

        string? failure = null;
        switch (options.Domain)
        {
            case PersistenceDomainKind.Auto:
            case PersistenceDomainKind.Pmem:
                // (A library that loads but refuses the mapping, or a file system that refuses libpmem's shared mapping:
                // Auto falls back, Pmem says so, as for a library that does not load.)
                if (options.PmemLibraryName is not null && PmemLibrary.TryLoad(options.PmemLibraryName, out failure)
                    && PmemPersistenceDomain.TryMap(mapPath, out failure) is { } pmem)
                {
                    // Auto on a file that is not persistent memory: libpmem would only msync it (and cannot grow it);
                    // the mapped-file domain does that job better.
                    if (options.Domain == PersistenceDomainKind.Pmem || pmem.IsPersistentMemory)
                    {
                        return pmem;
                    }

                    pmem.Dispose();
                }

                if (options.Domain == PersistenceDomainKind.Pmem)
                {
                    ThrowHelper.ThrowHeapFile(HeapFileError.DomainUnavailable, $"Cannot map heap file '{path}' with libpmem: {failure ?? "HeapFileOptions.PmemLibraryName is null."} Use PersistenceDomainKind.Auto or MappedFile to fall back to the mapped-file domain (pwrite or msync, and fdatasync).");
                }

                return MapFile(stream, path, length, capacity, options);
            case PersistenceDomainKind.MappedFile:
                return MapFile(stream, path, length, capacity, options);
            case PersistenceDomainKind.Simulated:
                ThrowHelper.ThrowArgumentOutOfRange(nameof(options), $"Domain {options.Domain} cannot map a file; create a SimulatedPersistenceDomain and use HeapFile.Create(PersistenceDomain).");
                return null;
            default:
                ThrowHelper.ThrowArgumentOutOfRange(nameof(options), $"HeapFileOptions.Domain {options.Domain} is not a PersistenceDomainKind value.");
                return null;
        }
    }

    private static MappedFilePersistenceDomain MapFile(FileStream stream, string path, long length, long capacity, HeapFileOptions options)
    {
        bool privateMapping = MappedFilePersistenceDomain.UsesPrivateMapping(options.MappedFileWriteBack, capacity);
        long sizeLimit = Interop.Libc.FileSizeLimit();
        if (privateMapping && length > sizeLimit)
        {
            // Its write-backs are pwrites, and one past the limit raises SIGXFSZ (a shared mapping's msync does not).
            ThrowHelper.ThrowHeapFile(HeapFileError.DomainUnavailable, $"Cannot map heap file '{path}' privately: it has {length} bytes but the process may write files of at most {sizeLimit} bytes (RLIMIT_FSIZE, ulimit -f), and a private mapping writes back with pwrite. Raise the limit, or use MappedFileWriteBack.Auto or SharedMapping.");
        }

        return MappedFilePersistenceDomain.Map(stream, length, capacity, privateMapping);
    }
}
