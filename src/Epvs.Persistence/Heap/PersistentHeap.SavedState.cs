using System;
using System.Collections.Generic;
using System.Numerics;
using System.Threading.Tasks;

namespace Epvs.Persistence;

// Fast reopen: at a clean shutdown, the allocator's state (one bit per small block) is saved into free segments, so
// the next open rebuilds the free lists from the bits instead of reading every block header. The format and the
// protocol (checksum, clean flag, durable invalidation at open) are documented on HeapLayout.
public sealed unsafe partial class PersistentHeap
{
    /// <summary>
    /// Whether this open rebuilt the allocator from the state saved at the previous clean shutdown (no scan of block
    /// headers: only the headers of allocated blocks were read and checked) rather than by a full scan.
    /// </summary>
    public bool OpenedFromSavedState { get; private set; }

    /// <summary>Why the saved state was not used, when one was expected (a clean shutdown of a buffered heap) but rejected;
    /// null otherwise.</summary>
    public string? SavedStateRejection { get; private set; }

    /// <summary>Whether this open claimed the file for its heap kind: the file's first open, after which no shutdown saved state.</summary>
    private readonly bool _firstOpen;

    private static int WordsPerSegment(int cls) => (SizeClasses.BlocksPerSegment[cls] + 63) / 64;

    /// <summary>
    /// Saves the allocator state for a fast reopen. Call only on a quiescent heap about to close cleanly, whose
    /// allocated blocks are exactly the payloads the next opener should keep (no garbage awaiting reclamation).
    /// </summary>
    /// <returns>Null when saved; otherwise why not (the next open then rescans).</returns>
    internal string? TrySaveStateForReopen() => TrySaveStateForReopen(freedSegmentsAlready: false);

    private string? TrySaveStateForReopen(bool freedSegmentsAlready)
    {
        if (PendingFreeBlocks != 0)
        {
            return "frees were still waiting for the sweep";
        }

        long segments = _segmentCount;
        var wordIndex = new long[segments];
        long bitmapWords = 0;
        for (long s = 0; s < segments;)
        {
            ulong descriptor = _table[s];
            ulong role = HeapLayout.DescriptorRole(descriptor);
            long payload = HeapLayout.DescriptorPayload(descriptor);
            wordIndex[s] = -1;
            if (role == HeapLayout.RoleSmall && payload < SizeClasses.Count)
            {
                wordIndex[s++] = bitmapWords;
                bitmapWords += WordsPerSegment((int)payload);
            }
            else if (role == HeapLayout.RoleLargeStart && payload >= 1 && s + payload <= segments)
            {
                for (long t = s + 1; t < s + payload; t++)
                {
                    wordIndex[t] = -1;
                }

                s += payload;
            }
            else
            {
                s++;
            }
        }

        // Every block of a small segment in use starts allocated; the free lists (thread caches, shared pools) clear bits.
        var bitmap = new ulong[bitmapWords];
        for (long s = 0; s < segments; s++)
        {
            if (wordIndex[s] >= 0 && !_segmentFree[s])
            {
                int blocks = SizeClasses.BlocksPerSegment[(int)HeapLayout.DescriptorPayload(_table[s])];
                for (int k = 0; k < blocks; k++)
                {
                    bitmap[wordIndex[s] + (k >> 6)] |= 1UL << (k & 63);
                }
            }
        }

        bool ClearFree(long offset)
        {
            long segment = SegmentOf(offset);
            if (segment < 0 || segment >= segments || wordIndex[segment] < 0)
            {
                return false;
            }

            int blockSize = SizeClasses.BlockSizes[(int)HeapLayout.DescriptorPayload(_table[segment])];
            long k = (offset - SegmentStart(segment)) / blockSize;
            bitmap[wordIndex[segment] + (k >> 6)] &= ~(1UL << (int)(k & 63));
            return true;
        }

        foreach (ThreadCache cache in Caches)
        {
            for (int cls = 0; cls < SizeClasses.Count; cls++)
            {
                for (int i = 0; i < cache.Counts[cls]; i++)
                {
                    if (!ClearFree(cache.Blocks[cls][i]))
                    {
                        return "a cached free block is outside the small-block segments";
                    }
                }
            }
        }

        foreach (ClassPool pool in _pools)
        {
            using (InterruptShield.Hold(pool))
            {
                foreach (long[] batch in pool.Batches)
                {
                    foreach (long offset in batch)
                    {
                        if (!ClearFree(offset))
                        {
                            return "a pooled free block is outside the small-block segments";
                        }
                    }
                }
            }
        }

        // Blocks set aside for anti-payloads are free too (saved as allocated, they would fail the check below, and a fast
        // reopen would take them for live ones).
        foreach (long offset in ReserveBlocksSnapshot())
        {
            if (!ClearFree(offset))
            {
                return "a free block set aside for deletes is outside the small-block segments";
            }
        }

        // Self-check against the accounting: a block lost from every free list would otherwise be saved as allocated.
        long live = 0;
        foreach (ulong word in bitmap)
        {
            live += BitOperations.PopCount(word);
        }

        for (long s = 0; s < segments; s++)
        {
            if (HeapLayout.DescriptorRole(_table[s]) == HeapLayout.RoleLargeStart && !_segmentFree[s])
            {
                live++;
            }
        }

        HeapStatistics stats = GetStatistics();
        if (live != stats.LiveBlocks)
        {
            return $"the free lists account for {stats.LiveBlocks} live blocks but the bitmap has {live}";
        }

        // The last run of free segments long enough (allocation is first-fit from the start, so it survives longest).
        long words = HeapLayout.SavedStateHeaderWords + bitmapWords;
        long needed = ((words * sizeof(ulong)) + HeapLayout.SegmentSize - 1) / HeapLayout.SegmentSize;
        long start = -1, run = 0;
        for (long s = segments - 1; s >= 0; s--)
        {
            run = _segmentFree[s] && HeapLayout.DescriptorRole(_table[s]) == HeapLayout.RoleFree ? run + 1 : 0;
            if (run == needed)
            {
                start = s;
                break;
            }
        }

        if (start < 0 && !freedSegmentsAlready && FreeUnusedSegmentsForSavedState())
        {
            // The table and the bitmap changed: computed again.
            return TrySaveStateForReopen(freedSegmentsAlready: true);
        }

        if (start < 0)
        {
            return $"no run of {needed} free segments for the saved state";
        }

        long offsetOfState = SegmentStart(start);
        ulong* w = (ulong*)(_base + offsetOfState);
        w[0] = HeapLayout.SavedStateMagic;
        w[1] = (ulong)segments;
        w[2] = (ulong)_nextUid;
        w[3] = (ulong)_file.EpochClock;
        w[4] = (ulong)_file.DurableFrontier;
        w[5] = HeapLayout.Hash(_table, segments, 0);
        w[6] = (ulong)bitmapWords;
        (long logEnd0, long logEnd1) = _sweepLog is { } log ? log.Ends : (0, 0);
        w[7] = (ulong)logEnd0;
        w[8] = (ulong)logEnd1;
        bitmap.AsSpan().CopyTo(new Span<ulong>(w + HeapLayout.SavedStateHeaderWords, checked((int)bitmapWords)));
        _file.Domain.PersistOwned(offsetOfState, words * sizeof(ulong));

        // The state is durable before the words that point at it; the clean flag (HeapFile.Dispose) comes last.
        ulong* super = (ulong*)_base;
        super[HeapLayout.SavedStateWordsOffset / sizeof(ulong)] = (ulong)words;
        super[HeapLayout.SavedStateCheckOffset / sizeof(ulong)] = HeapLayout.Hash(w, words, (ulong)offsetOfState);
        super[HeapLayout.SavedStateOffset / sizeof(ulong)] = (ulong)offsetOfState;
        _file.Domain.PersistOwned(HeapLayout.SavedStateOffset, 3 * sizeof(ulong));
        return null;
    }

    /// <summary>
    /// For a saved state that found no run of free segments: the segments whose blocks are all unused become free, durably
    /// — those a full scan found empty (free in memory, their descriptors still naming a size class until reused) and
    /// those whose blocks all sit in their class's pool. A heap emptied of small payloads used to save no state at
    /// every clean shutdown, and so to rescan at every open, for good.
    /// </summary>
    /// <returns>Whether any segment's descriptor became free.</returns>
    private bool FreeUnusedSegmentsForSavedState()
    {
        using (InterruptShield.Hold(_segmentGate))
        {
            // The delete reserve is this session's only (recovery designates it again): its segment, every block of it free
            // (in the pool, or set aside for deletes), is released like any other. Kept designated, a full heap that had
            // ever deleted saved no state at any clean shutdown.
            ReleaseReserveDesignationLocked();
            ReturnEveryCacheToThePoolsLocked();
            ReleasePooledSegmentsLocked();
            var claimed = new List<long>();
            for (long s = 0; s < _segmentCount; s++)
            {
                if (_segmentFree[s] && HeapLayout.DescriptorRole(_table[s]) != HeapLayout.RoleFree)
                {
                    claimed.Add(s);
                }
            }

            FreeClaimingDescriptorsLocked(claimed);
            for (long s = 0; s < _segmentCount; s++)
            {
                if (_segmentFree[s] && HeapLayout.DescriptorRole(_table[s]) == HeapLayout.RoleFree)
                {
                    return true;
                }
            }

            return false;
        }
    }

    /// <summary>
    /// Under the segment gate, at a clean shutdown (no operation runs any more, so no thread touches its cache again): the
    /// free blocks of every thread's cache go back to their class's pool, so that a segment whose free blocks sat in the
    /// cache of a thread still alive (the one that deleted, a recovery worker) can be released. Only the closing thread's
    /// and exited threads' caches were, and a full heap whose deletes ran on a live worker thread saved no state.
    /// </summary>
    private void ReturnEveryCacheToThePoolsLocked()
    {
        // (Lock order: the segment gate, then the caches' gate, then a pool's.)
        using (InterruptShield.Hold(_cachesGate))
        {
            foreach (ThreadCache cache in Caches)
            {
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

    /// <summary>
    /// Durably invalidates the saved state, if the file holds one: called by recovery once the sweep log is checked,
    /// before anything else is written, since whatever this open writes from then on makes the state stale. While the
    /// file holds it, no open has got past those checks since the shutdown that saved it: the log is as it left it.
    /// </summary>
    private void InvalidateSavedState()
    {
        if ((_faults & HeapFaults.TrustStaleSavedState) != 0 || _file.Word(HeapLayout.SavedStateOffset) == 0)
        {
            return;
        }

        ulong* super = (ulong*)_base;
        super[HeapLayout.SavedStateOffset / sizeof(ulong)] = 0;
        super[HeapLayout.SavedStateWordsOffset / sizeof(ulong)] = 0;
        super[HeapLayout.SavedStateCheckOffset / sizeof(ulong)] = 0;
        _file.Domain.PersistOwned(HeapLayout.SavedStateOffset, 3 * sizeof(ulong));
    }

    /// <summary>
    /// Where the sweep log's halves ended when the saved state the file holds was saved, whatever the clean-shutdown
    /// flag: the log has not changed since (see <see cref="InvalidateSavedState"/>), even when an open was refused
    /// after that shutdown (which leaves the flag cleared), or a crash came between the state and the flag. Null when
    /// the file holds no state that checks out for this heap, or one without a log. Takes them from
    /// <paramref name="accepted"/>, the state this open took, when there is one (checked once).
    /// </summary>
    private (long End0, long End1)? SavedLogEnds((ulong[] Bitmap, long NextUid, (long End0, long End1)? LogEnds)? accepted)
    {
        if (accepted is { } state)
        {
            return state.LogEnds;
        }

        if ((_faults & (HeapFaults.TrustStaleSavedState | HeapFaults.IgnoreSavedState)) != 0 || _file.Word(HeapLayout.SavedStateOffset) == 0)
        {
            return null;
        }

        ulong* w = CheckedSavedState(trust: false, out _, out _);
        return w == null || w[7] == 0 ? null : ((long)w[7], (long)w[8]);
    }

    /// <summary>
    /// The saved state's words, when the one the superblock points at lies in the heap, passes its checksum and
    /// describes this heap's segment table, clock and frontier (with <paramref name="trust"/>, only its shape is
    /// checked); otherwise null, and <paramref name="rejection"/> says why. Read-only.
    /// </summary>
    private ulong* CheckedSavedState(bool trust, out long words, out string? rejection)
    {
        long offset = (long)_file.Word(HeapLayout.SavedStateOffset);
        words = (long)_file.Word(HeapLayout.SavedStateWordsOffset);
        ulong check = _file.Word(HeapLayout.SavedStateCheckOffset);
        long segments = _file.SegmentCount;
        // Overflow-safe: both words come from the file and may be damaged; offset + words * 8 must not wrap around
        // (a wrapped sum passed the old check and the hash below then read outside the mapping).
        long heapSize = _file.Size;
        if (offset < _dataStart || offset >= heapSize || offset % sizeof(ulong) != 0 || words < HeapLayout.SavedStateHeaderWords || words > (heapSize - offset) / sizeof(ulong))
        {
            rejection = $"its position ({offset}, {words} words) is outside the heap";
            return null;
        }

        ulong* w = (ulong*)(_base + offset);
        if (!trust && HeapLayout.Hash(w, words, (ulong)offset) != check)
        {
            rejection = "its checksum does not match";
            return null;
        }

        if (w[0] != HeapLayout.SavedStateMagic || (long)w[1] != segments || (long)w[6] != words - HeapLayout.SavedStateHeaderWords
            || (!trust && (w[5] != HeapLayout.Hash(_table, segments, 0) || (long)w[3] != _file.EpochClock || (long)w[4] != _file.DurableFrontier)))
        {
            rejection = w[0] != HeapLayout.SavedStateMagic ? "it was saved by another build of the library (its mark differs)" : "it does not describe this heap's segment table, clock and frontier";
            return null;
        }

        rejection = null;
        return w;
    }

    /// <summary>
    /// Reads and checks the saved state, writing nothing (recovery invalidates it with <see cref="InvalidateSavedState"/>
    /// before its first write): a rejected state leaves nothing to undo.
    /// </summary>
    /// <returns>The bitmap, the saved next uid and where the sweep log's halves ended (null without a log), or null
    /// (then <see cref="SavedStateRejection"/> may say why).</returns>
    private (ulong[] Bitmap, long NextUid, (long End0, long End1)? LogEnds)? TryReadSavedState(int parallelism)
    {
        bool trust = (_faults & HeapFaults.TrustStaleSavedState) != 0;
        long offset = (long)_file.Word(HeapLayout.SavedStateOffset);
        if (offset == 0)
        {
            // Expected only after a clean shutdown of a buffered heap: not at the first open of a new file (it used to
            // say "saved no state" there), nor for a raw heap, which never saves one.
            SavedStateRejection = _file.WasCleanShutdown && !_firstOpen && _ownerKind == HeapLayout.KindBufferedDurable ? "the last shutdown saved no state" : null;
            return null;
        }

        if ((_faults & HeapFaults.IgnoreSavedState) != 0)
        {
            SavedStateRejection = "ignored (test reference)";
            return null;
        }

        if (!_file.WasCleanShutdown && !trust)
        {
            // A crash after an open that used (and invalidated) it, or before the clean flag: never trusted.
            return null;
        }

        long segments = _file.SegmentCount;
        ulong* w = CheckedSavedState(trust, out long words, out string? rejection);
        if (w == null)
        {
            SavedStateRejection = rejection;
            return null;
        }

        var bitmap = new ulong[words - HeapLayout.SavedStateHeaderWords];
        new ReadOnlySpan<ulong>(w + HeapLayout.SavedStateHeaderWords, bitmap.Length).CopyTo(bitmap);
        long nextUid = (long)w[2];
        (long, long)? logEnds = trust || w[7] == 0 ? null : ((long)w[7], (long)w[8]);

        // The same walk as recovery's pass 1; every allocated block's header must be a valid allocation.
        var small = new List<(long Segment, long Word)>();
        long at = 0;
        for (long s = 0; s < segments;)
        {
            ulong descriptor = _table[s];
            ulong role = HeapLayout.DescriptorRole(descriptor);
            long payload = HeapLayout.DescriptorPayload(descriptor);
            if (role == HeapLayout.RoleSmall && payload < SizeClasses.Count)
            {
                small.Add((s++, at));
                at += WordsPerSegment((int)payload);
                continue;
            }

            if (role == HeapLayout.RoleLargeStart && payload >= 1 && s + payload <= segments)
            {
                if (!trust && !TryReadHeader(SegmentStart(s), HeapLayout.DescriptorGeneration(descriptor), (payload * HeapLayout.SegmentSize) - HeapLayout.HeaderSize, out _))
                {
                    SavedStateRejection = $"the large block at segment {s} is not a valid allocation";
                    return null;
                }

                s += payload;
                continue;
            }

            s++;
        }

        if (at != bitmap.Length)
        {
            SavedStateRejection = $"its bitmap has {bitmap.Length} words where the segment table needs {at}";
            return null;
        }

        if (!trust)
        {
            int bad = 0;
            InterruptShield.RunToItsEnd(bodies => Parallel.For(0, small.Count, new ParallelOptions { MaxDegreeOfParallelism = Math.Max(1, parallelism) }, bodies.Guard((i, state) =>
            {
                (long segment, long word) = small[i];
                ulong descriptor = _table[segment];
                int cls = (int)HeapLayout.DescriptorPayload(descriptor);
                uint generation = HeapLayout.DescriptorGeneration(descriptor);
                int blocks = SizeClasses.BlocksPerSegment[cls];
                for (int k = 0; k < WordsPerSegment(cls) * 64; k++)
                {
                    if ((bitmap[word + (k >> 6)] & (1UL << (k & 63))) == 0)
                    {
                        continue;
                    }

                    if (k >= blocks || !TryReadHeader(SegmentStart(segment) + ((long)k * SizeClasses.BlockSizes[cls]), generation, SizeClasses.BlockSizes[cls] - HeapLayout.HeaderSize, out _))
                    {
                        // Volatile.Write: release; read after Parallel.For returns, whose join orders it anyway.
                        System.Threading.Volatile.Write(ref bad, 1);
                        state.Stop();
                        return;
                    }
                }
            })), Math.Max(1, parallelism));

            if (bad != 0)
            {
                SavedStateRejection = "a block it marks allocated fails its check (stale or damaged; the full scan reports damage)";
                return null;
            }
        }

        return (bitmap, nextUid, logEnds);
    }

    /// <summary>The header of a block the saved state marks allocated (checked already, or trusted by the broken control).</summary>
    private PayloadHeader ReadHeaderUnchecked(long offset)
    {
        ulong* h = (ulong*)(_base + offset);
        return new PayloadHeader((long)h[0], (long)h[1], HeapLayout.CommitKind(h[3]), HeapLayout.ShapeSize(h[2]), HeapLayout.ShapeTypeId(h[2]));
    }
}
