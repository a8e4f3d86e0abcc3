namespace Epvs.Persistence;

/// <summary>How a heap in the <see cref="PersistenceDomainKind.MappedFile"/> domain maps its file and makes written ranges durable.</summary>
/// <remarks>
/// Through a shared mapping the kernel tracks dirty pages itself: every <c>msync</c> cleans the pages it writes and
/// write-protects them again, so the next store to each takes a page fault, and changing the protection interrupts
/// the other cores that run the process (a TLB shootdown). Under a writer that updates random keys that is a fault per
/// page per advance cycle, on the writers' threads. A private mapping has no such faults after a page's first store;
/// the write-back copies the written ranges into the file instead.
/// </remarks>
public enum MappedFileWriteBack
{
    /// <summary>
    /// <see cref="PrivateMapping"/> on Linux when the heap's maximum size (<see cref="HeapFileOptions.MaxSize"/>, by
    /// default 16 times <see cref="HeapFileOptions.Size"/>) is at most a quarter of the memory available to the process
    /// (<see cref="System.GCMemoryInfo.TotalAvailableMemoryBytes"/>: physical memory or the container's limit), so its
    /// private copies cannot crowd out the rest, and at most the process's file size limit (<c>RLIMIT_FSIZE</c>, which a
    /// <c>pwrite</c> past it answers with SIGXFSZ); <see cref="SharedMapping"/> otherwise and on other systems. Each heap
    /// decides alone: several private heaps may together exceed that quarter.
    /// </summary>
    Auto = 0,

    /// <summary>
    /// The file is mapped shared and a write-back is <c>msync(MS_SYNC)</c> of the pages covering the range
    /// (<c>FlushViewOfFile</c> then <c>FlushFileBuffers</c> at the fence on Windows). Written pages are the page cache's,
    /// which the kernel may evict once they are clean, so a heap larger than memory works; each write-back makes the next
    /// store to its pages fault.
    /// </summary>
    SharedMapping = 1,

    /// <summary>
    /// Linux only. The file is mapped copy-on-write; a write-back copies the range into the file with <c>pwrite</c> and a
    /// fence is <c>fdatasync</c>. Stores fault once per page (its first store since the heap opened), never after a
    /// write-back. Every page written since the heap opened is then private memory of the process — up to the heap's
    /// size, not evictable without swap — besides its copy in the page cache, and the whole reservation (the maximum
    /// size) counts against the system's commit limit. Only ranges written back reach the file, as the durability
    /// contract of <see cref="PersistenceDomain"/> says: closing the heap does not write back the rest (with a shared
    /// mapping, a clean close also persists stores that were never written back). Every structure of this package
    /// writes back what it commits; a caller of the raw <see cref="PersistentHeap"/> must persist its payloads
    /// (<see cref="PersistentHeap.Persist(PayloadRef)"/>) and its frees (<see cref="PersistentHeap.WriteBackHeader(PayloadRef)"/>
    /// then <see cref="PersistentHeap.Fence"/>), and anything it stores through the domain itself. A heap file larger than
    /// the process's file size limit (<c>RLIMIT_FSIZE</c>) is refused (its <c>pwrite</c>s past the limit would raise
    /// SIGXFSZ), and the heap grows up to that limit only.
    /// </summary>
    PrivateMapping = 2,
}
