namespace Epvs.Persistence;

/// <summary>Why a heap file could not be created or opened.</summary>
public enum HeapFileError
{
    /// <summary>The file does not start with the EPVS heap magic: it is not a heap file, or its creation never completed.</summary>
    NotAHeapFile = 1,

    /// <summary>The file was written by a newer format version than this library reads.</summary>
    NewerFormatVersion = 2,

    /// <summary>The file is shorter than the heap size its superblock records.</summary>
    Truncated = 3,

    /// <summary>The file is smaller than the superblock.</summary>
    SmallerThanSuperblock = 4,

    /// <summary>Another opener holds the file's exclusive lock.</summary>
    AlreadyOpen = 5,

    /// <summary>The file or its directory is read-only.</summary>
    ReadOnly = 6,

    /// <summary>The disk does not have room for a heap of the requested size.</summary>
    InsufficientSpace = 7,

    /// <summary>Creation was asked for a path that already exists (an existing file is never reformatted).</summary>
    AlreadyExists = 8,

    /// <summary>The superblock's fields are inconsistent or damaged.</summary>
    Corrupt = 9,

    /// <summary>The requested persistence domain is not available (for example libpmem is not installed).</summary>
    DomainUnavailable = 10,

    /// <summary>The file has a format version older than this library reads (every version before the current one: the
    /// checks of the older formats do not cover what this one relies on).</summary>
    OlderFormatVersion = 11,

    /// <summary>The file belongs to the other kind of heap (a <see cref="PersistentHeap"/> file opened as a <see cref="BufferedDurableHeap"/>, or the reverse).</summary>
    WrongHeapKind = 12,

    /// <summary>A buffered heap's versions are used up: every open begins a new version, and the file stores versions
    /// in 42 bits. A heap stops writing 2^20 versions before that (its operations are refused, its data stays readable),
    /// so a file reaches this only after that many opens past the limit.</summary>
    VersionSpaceExhausted = 13,
}
