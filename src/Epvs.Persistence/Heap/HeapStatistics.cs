namespace Epvs.Persistence;

/// <summary>
/// The allocator's accounting of the heap's segments. Every byte of every segment is live, free or overhead, so
/// <see cref="LiveBytes"/> + <see cref="FreeBytes"/> + <see cref="OverheadBytes"/> = <see cref="TotalBytes"/> when the
/// heap is quiescent (the parts are read one after another, so they need not add up while other threads allocate).
/// </summary>
public readonly struct HeapStatistics
{
    /// <summary>Creates a statistics value.</summary>
    /// <param name="totalBytes">Bytes in all segments.</param>
    /// <param name="liveBlocks">Allocated blocks.</param>
    /// <param name="liveBytes">Bytes of allocated blocks (whole blocks, headers included).</param>
    /// <param name="freeBytes">Bytes of free blocks and free segments.</param>
    /// <param name="overheadBytes">Bytes at the end of small-block segments that no block fits.</param>
    /// <param name="freeSegments">Segments not assigned to a size class or a large block.</param>
    public HeapStatistics(long totalBytes, long liveBlocks, long liveBytes, long freeBytes, long overheadBytes, long freeSegments)
    {
        TotalBytes = totalBytes;
        LiveBlocks = liveBlocks;
        LiveBytes = liveBytes;
        FreeBytes = freeBytes;
        OverheadBytes = overheadBytes;
        FreeSegments = freeSegments;
    }

    /// <summary>Bytes in all segments.</summary>
    public long TotalBytes { get; }

    /// <summary>Allocated blocks.</summary>
    public long LiveBlocks { get; }

    /// <summary>Bytes of allocated blocks (whole blocks, headers included).</summary>
    public long LiveBytes { get; }

    /// <summary>Bytes of free blocks (in thread caches, shared free lists and free segments).</summary>
    public long FreeBytes { get; }

    /// <summary>Bytes at the end of small-block segments that no block fits.</summary>
    public long OverheadBytes { get; }

    /// <summary>Segments not assigned to a size class or a large block.</summary>
    public long FreeSegments { get; }

    /// <summary>Whether live, free and overhead bytes add up to the total (they must, on a quiescent heap).</summary>
    public bool AddsUp => LiveBytes + FreeBytes + OverheadBytes == TotalBytes;

    /// <inheritdoc/>
    public override string ToString() =>
        $"total={TotalBytes} live={LiveBytes} ({LiveBlocks} blocks) free={FreeBytes} ({FreeSegments} free segments) overhead={OverheadBytes}";
}
