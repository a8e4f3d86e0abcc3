namespace Epvs.Persistence;

/// <summary>How bytes written to a heap become durable.</summary>
public enum PersistenceDomainKind
{
    /// <summary>
    /// Choose when opening: <see cref="Pmem"/> when libpmem loads and maps the file as persistent memory, otherwise
    /// <see cref="MappedFile"/> (libpmem on an ordinary file would only msync it).
    /// </summary>
    Auto = 0,

    /// <summary>PMDK's libpmem: cache-line flushes and a drain on persistent memory, <c>pmem_msync</c> elsewhere.</summary>
    Pmem = 1,

    /// <summary>
    /// A memory-mapped file made durable through the page cache: <c>pwrite</c> and <c>fdatasync</c> from a private
    /// mapping or <c>msync</c> of a shared one (Unix, see <see cref="MappedFileWriteBack"/>), <c>FlushViewOfFile</c>
    /// (Windows); no native dependency.
    /// </summary>
    MappedFile = 2,

    /// <summary>An in-memory model with a working and a durable image, for crash testing.</summary>
    Simulated = 3,
}
