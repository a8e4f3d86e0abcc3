namespace Epvs.Persistence;

/// <summary>How to create or open a heap file.</summary>
public sealed class HeapFileOptions
{
    /// <summary>The heap's size at creation, in bytes: the superblock and the segment table, then as many whole 64 KiB
    /// segments as fit (at least one). Default 64 MiB. Ignored by open. A buffered heap that may grow keeps its file one
    /// segment longer (a spare it grows into, for its delete reserve, when the file system refuses a growth).</summary>
    public long Size { get; set; } = 64L << 20;

    /// <summary>
    /// The largest size the heap may grow to, in bytes, the superblock and the segment table included (as many whole
    /// segments as fit with their table); fixes the segment table's capacity at creation. 0 (default)
    /// means <see cref="Size"/> × 16 for a file (capped at what the table can address), and the domain's capacity for a
    /// caller-supplied domain. At most 2^24 segments of 64 KiB (about 1 TiB): a larger value is refused by create
    /// with <see cref="System.ArgumentOutOfRangeException"/>, never clamped.
    /// </summary>
    /// <remarks>
    /// <para>On open, 0 lets the heap grow to the maximum recorded at creation, and the mapping reserves address space
    /// for all of it; a smaller value caps this open's growth (never below the heap's current size) and its reservation,
    /// for a process under an address-space limit (<c>RLIMIT_AS</c>). The recorded maximum is unchanged: a later open
    /// may grow further. A value at or above the recorded maximum (however large) sets no cap; a negative value is
    /// refused.</para>
    /// <para>
    /// The libpmem domain (<see cref="PersistenceDomainKind.Pmem"/>, or <see cref="PersistenceDomainKind.Auto"/> when it
    /// picks libpmem) never grows the file: its heap stays at <see cref="Size"/>, whatever the maximum size, so size a
    /// libpmem heap by <see cref="Size"/>. The maximum size is still recorded (it is accepted, not refused, because
    /// <see cref="PersistenceDomainKind.Auto"/> picks the domain only once the file exists): a later open with
    /// <see cref="PersistenceDomainKind.MappedFile"/> can grow the heap up to it. A full heap's
    /// <see cref="System.InsufficientMemoryException"/> says which of the two applies.
    /// </para>
    /// </remarks>
    public long MaxSize { get; set; }

    /// <summary>
    /// Which persistence domain maps the file. Default <see cref="PersistenceDomainKind.Auto"/>: libpmem when it loads
    /// and maps the file as persistent memory, else the mapped file.
    /// </summary>
    public PersistenceDomainKind Domain { get; set; } = PersistenceDomainKind.Auto;

    /// <summary>
    /// How the <see cref="PersistenceDomainKind.MappedFile"/> domain maps the file and writes it back: a private mapping
    /// written back with <c>pwrite</c> (Linux; no page faults on the writers' threads, but written pages stay in process
    /// memory) or a shared one synchronized with <c>msync</c>. Default <see cref="MappedFileWriteBack.Auto"/>: private
    /// on Linux for a heap whose maximum size is at most a quarter of the available memory. Applies to open too.
    /// </summary>
    public MappedFileWriteBack MappedFileWriteBack { get; set; } = MappedFileWriteBack.Auto;

    /// <summary>
    /// The name or path libpmem is loaded by (default <c>libpmem.so.1</c>); null disables libpmem. The first libpmem
    /// loaded in a process is the one used for the rest of the process.
    /// </summary>
    public string? PmemLibraryName { get; set; } = PmemLibrary.DefaultName;
}
