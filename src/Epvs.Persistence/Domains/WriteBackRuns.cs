namespace Epvs.Persistence;

/// <summary>
/// Writes back byte ranges of a <see cref="PersistenceDomain"/>, merging ranges added in ascending order into runs,
/// each written back once. Through the page cache (where every write-back is a system call) a run takes in the next
/// range when it starts on the page the run ends on, on the page after it (so no page is written that no range
/// touches), or within <see cref="PersistenceDomain.WriteBackMergeGap"/> of its end. On persistent memory (cache-line
/// write-backs, one native call each) when it starts inside the run, on the line the run ends on, or exactly at the
/// start of the next line (its end rounded up to a line): neighbouring
/// blocks, handed out in address order, take one call and write back the line they share once, and no line is
/// written back that no range touches.
/// </summary>
internal struct WriteBackRuns
{
    private readonly PersistenceDomain _domain;
    private readonly bool _pages;
    private readonly long _mergeGap;
    private readonly long _pageMask;
    private long _start;
    private long _end;

    internal WriteBackRuns(PersistenceDomain domain)
    {
        _domain = domain;
        _pages = !domain.IsPersistentMemory;
        _mergeGap = domain.WriteBackMergeGap;
        _pageMask = System.Environment.SystemPageSize - 1;
        _start = -1;
        _end = -1;
    }

    /// <summary>Adds a range (in ascending order of <paramref name="offset"/> to merge; out of order it starts a run of its own).</summary>
    internal void Add(long offset, long length)
    {
        if (!_pages)
        {
            // Merged when it starts no later than the run's end rounded up to a line: every line of the merged run is one
            // a range touches.
            if (_start >= 0 && offset >= _start && offset <= ((_end + LineMask) & ~LineMask))
            {
                _end = System.Math.Max(_end, offset + length);
                return;
            }

            Flush();
            _start = offset;
            _end = offset + length;
            return;
        }

        // Merged: within the gap the domain bridges, or on the page the run ends on or the page after it. Bridging to the
        // next page copies no page that is not written anyway, and saves a call: a version's commit words, one per
        // block, would otherwise take one call per page (a page's last word and the next page's first are further
        // apart than the run's end and the page's end).
        long nextPageEnd = ((_end - 1) & ~_pageMask) + (2 * (_pageMask + 1));
        if (_start >= 0 && offset >= _start && offset <= System.Math.Max(_end + _mergeGap, nextPageEnd - 1))
        {
            _end = System.Math.Max(_end, offset + length);
            return;
        }

        Flush();
        _start = offset;
        _end = offset + length;
    }

    /// <summary>
    /// Writes back the header of every block in <paramref name="offsets"/> and fences: on persistent memory in the order
    /// given (ascending neighbours merged into runs of lines), through the page cache sorted (in place) into runs of pages.
    /// </summary>
    internal static void WriteBackHeadersAndFence(PersistenceDomain domain, System.Span<long> offsets)
    {
        var runs = new WriteBackRuns(domain);
        if (runs._pages)
        {
            System.MemoryExtensions.Sort(offsets);
        }

        foreach (long offset in offsets)
        {
            runs.Add(offset, HeapLayout.HeaderSize);
        }

        runs.Flush();
        domain.FenceOwned();
    }

    /// <summary>
    /// Through the page cache: writes back the whole pages of the run in progress and keeps its last page, which a range
    /// added next may still extend (a page copied twice would also be written to the disk twice); on persistent memory
    /// writes back the run in progress.
    /// </summary>
    internal void FlushWholePages()
    {
        if (!_pages)
        {
            Flush();
            return;
        }

        if (_start < 0)
        {
            return;
        }

        long lastPage = _end & ~_pageMask;
        if (lastPage == _end)
        {
            // Ends on a page boundary: nothing to keep.
            Flush();
        }
        else if (lastPage > _start)
        {
            _domain.WriteBackOwned(_start, lastPage - _start);
            _start = lastPage;
        }
    }

    /// <summary>A cache line's offset bits (64-byte lines: a line boundary is only where runs are merged on persistent memory, a longer line is still written back whole).</summary>
    private const long LineMask = 63;

    /// <summary>Writes back the run in progress (the caller fences).</summary>
    internal void Flush()
    {
        if (_start >= 0)
        {
            _domain.WriteBackOwned(_start, _end - _start);
            _start = -1;
        }
    }
}
