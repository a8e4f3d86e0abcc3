using System;
using System.Collections.Generic;
using System.Runtime.InteropServices;
using System.Threading;
using System.Threading.Tasks;

namespace Epvs.Persistence;

// Recovery: rebuilding every transient structure from the segment table and the block headers.
public sealed unsafe partial class PersistentHeap
{
    /// <summary>Broken control for tests: recovery does not look at the table beyond the heap size (as before).</summary>
    internal static bool SkipTableBeyondTheHeapSizeForTesting { get; set; }

    /// <summary>
    /// A superblock older than a growth (a lost write of its page, an old copy of it put back): its heap size hides the
    /// segments the growth added, and every block in them, silently (a heap full before the growth put every later
    /// payload there); and the session's next growth formats them, for good. A growth extends the medium first, then
    /// writes only free, generation-0 descriptors beyond the heap size before the size covers them (see
    /// <see cref="HeapFile.TryGrow"/>): a checked descriptor there that is any other is no crash's, and proves the size
    /// word older than the table. Looked at up to the end of the medium (a spare segment, normally), before anything is written.
    /// </summary>
    /// <exception cref="HeapFileException"><see cref="HeapFileError.Corrupt"/>: such a descriptor.</exception>
    private void RefuseDescriptorsBeyondTheHeapSize(long segments)
    {
        if (SkipTableBeyondTheHeapSizeForTesting || HeapFileTestHooks.IgnoreSeals)
        {
            return;
        }

        long onMedium = Math.Min(_file.MaxSegments, Math.Max(0, (_file.MediumLength - _file.DataStart) / HeapLayout.SegmentSize));
        for (long s = segments; s < onMedium; s++)
        {
            if (HeapLayout.IsValidDescriptor(_table[s], s) && _table[s] != HeapLayout.InitialDescriptor(s))
            {
                ThrowHelper.ThrowHeapFile(HeapFileError.Corrupt, $"Cannot open heap file '{_file.Path}': the descriptor of segment {s} (0x{_table[s]:X16}), beyond the {segments} segments the superblock's heap size covers, is one only a heap that grew over it writes: the superblock is older than the segment table (a lost write of its first page, or an old copy of it), and opening would hide those segments' blocks. Restore the superblock (the file's first page) from a copy of the file, or the file.");
            }
        }
    }

    private HeapStatistics Recover(PersistentHeapOptions options)
    {
        long segments = _file.SegmentCount;
        // Volatile.Write: release; the constructor publishes the heap to other threads anyway (no concurrent reader yet).
        Volatile.Write(ref _segmentCount, segments);
        var small = new List<long>();
        long liveBlocks = 0, liveBytes = 0, maxUid = 0;
        Func<PayloadRef, PayloadHeader, bool>? filter = options.RecoveryFilter;
        long tagBound = options.TagBound;
        long beyondBound = 0, maxBeyond = 0;

        // Every descriptor of the heap is checked before anything is written: a damaged one is reported, never trusted
        // (a flipped role or class would silently drop or misread a whole segment of blocks, and a zeroed one — which
        // fails its check — would read as a free segment).
        for (long s = 0; s < segments; s++)
        {
            if (!HeapLayout.IsValidDescriptor(_table[s], s))
            {
                ThrowHelper.ThrowHeapFile(HeapFileError.Corrupt, $"Cannot open heap file '{_file.Path}': the descriptor of segment {s} (0x{_table[s]:X16}) fails its check (damaged, or a descriptor of another slot); the segment's blocks cannot be trusted. Restore the file from a copy.");
            }

            if (!DescribesASegment(_table[s], s, segments) && !HeapFileTestHooks.IgnoreSeals)
            {
                ThrowHelper.ThrowHeapFile(HeapFileError.Corrupt, $"Cannot open heap file '{_file.Path}': the descriptor of segment {s} (0x{_table[s]:X16}) passes its check but describes no segment this format writes (role {HeapLayout.DescriptorRole(_table[s])}, {HeapLayout.DescriptorPayload(_table[s])}); the segment's blocks cannot be trusted. Restore the file from a copy.");
            }
        }

        RefuseDescriptorsBeyondTheHeapSize(segments);

        // Fast reopen: checked (read-only, every block it marks allocated checked whole); invalidated durably once the
        // sweep log is checked too (below), before the first write.
        (ulong[] Bitmap, long NextUid, (long End0, long End1)? LogEnds)? saved = TryReadSavedState(options.RecoveryParallelism);
        ulong[]? bitmap = saved?.Bitmap;
        OpenedFromSavedState = saved is not null;

        // Nothing below writes to the file until every block has been classified (the writes are collected): a
        // damaged block is reported before recovery has changed anything it would need to salvage by hand.
        var damaged = new List<long>();
        var unsealed = new List<long>();
        // Only a buffered heap seals its blocks: a raw heap's are all unsealed, and listing them would cost 8 bytes a block.
        bool listUnsealed = _ownerKind == HeapLayout.KindBufferedDurable;

        // Only a buffered heap's sweeps log their frees. Read (and checked) before anything is written, at a fast reopen
        // too, which goes on with it: the saved state's frees of swept blocks are durable in the log only.
        SweepLog.Contents? log = listUnsealed && (_faults & HeapFaults.IgnoreSweepLogAtRecovery) == 0 ? SweepLog.Read(_file, options.SalvageDamagedBlocks) : null;
        if (log is not null && SavedLogEnds(saved) is { } savedEnds)
        {
            RefuseLogEndsOtherThanSaved(log, [savedEnds.End0, savedEnds.End1], options.SalvageDamagedBlocks);
        }

        if (log is not null)
        {
            RefuseLogEndsShortOfItsMarks(log, options.SalvageDamagedBlocks);
        }

        RecoveryDamagedSweepLog = log?.Damaged ?? [];

        // The checks that refuse the file before anything is classified are done: the first write of this open follows.
        InvalidateSavedState();

        // Salvaging a damaged log after a clean shutdown: its lost entries held the only durable frees of blocks the
        // saved state counts free, so the log cannot go on. Every such block whose header is not free is written free
        // instead (pass 2), exactly as the saved state says, and the log begins anew (below).
        bool freeHeadersFromSavedState = RecoveryDamagedSweepLog.Count != 0 && bitmap is not null;

        SweepLog.LoggedFrees? logged = bitmap is null && log is { Frees.Count: > 0 } ? log.Frees : null;
        var freeSpans = new List<(long Segment, long Span, long FreeOffset)>();
        var freeBlocks = new List<long>();

        // Pass 1, sequential and cheap (8 bytes per 64 KiB): classify segments, settle large blocks.
        for (long s = 0; s < segments;)
        {
            ulong descriptor = _table[s];
            ulong role = HeapLayout.DescriptorRole(descriptor);
            long payload = HeapLayout.DescriptorPayload(descriptor);
            if (role == HeapLayout.RoleSmall && payload < SizeClasses.Count)
            {
                small.Add(s++);
                continue;
            }

            if (role == HeapLayout.RoleLargeStart && payload >= 1 && s + payload <= segments)
            {
                long offset = SegmentStart(s);
                BlockState largeState = ClassifyBlock(offset, HeapLayout.DescriptorGeneration(descriptor), (payload * HeapLayout.SegmentSize) - HeapLayout.HeaderSize, out PayloadHeader header);
                largeState = largeState == BlockState.Torn && options.TornIsDamaged ? BlockState.Damaged : largeState;
                bool complete = largeState is BlockState.Allocated or BlockState.Sealed;
                if (complete && HeapLayout.HeaderSize + (long)header.Size <= (payload - 1) * HeapLayout.SegmentSize)
                {
                    // A checked header whose size does not need its whole span: no crash leaves this.
                    largeState = HeapFileTestHooks.IgnoreSeals ? BlockState.Torn : BlockState.Damaged;
                    complete = false;
                }

                if (complete && tagBound > 0 && header.EpochTag > tagBound)
                {
                    // Intact, but newer than anything the superblock says the file can hold (see TagBound).
                    largeState = BlockState.Damaged;
                    complete = false;
                    beyondBound++;
                    maxBeyond = Math.Max(maxBeyond, header.EpochTag);
                }

                // Inside the span a crash leaves only the block's continuations or, while the span's table range was
                // being persisted (in any order on persistent memory), what the segments held before: free descriptors,
                // or a small segment whose blocks were all free (taken for the block as free). A small segment or another
                // large start under a start whose block is complete, or damaged, is no crash's: the range is fenced before
                // the header is written, and a release rewrites start and span in one fenced write. The start is stale
                // (a lost or rolled-back write of the table) or damaged, and trusting its span would skip, or free, the
                // healthy blocks of the segments under it without listing them; which of the two descriptors is right
                // cannot be told. Refused, with or without salvage, as a descriptor that fails its check is.
                long foreign = ForeignSegmentInSpan(s, payload);
                if (foreign >= 0 && (complete || largeState == BlockState.Damaged) && !HeapFileTestHooks.IgnoreSeals)
                {
                    ThrowHelper.ThrowHeapFile(HeapFileError.Corrupt, $"Cannot open heap file '{_file.Path}': the descriptor of segment {s} (0x{_table[s]:X16}) starts a large block of {payload} segments, but segment {foreign} inside it has a descriptor of its own (0x{_table[foreign]:X16}, role {HeapLayout.DescriptorRole(_table[foreign])}), which no crash leaves: one of the two is stale or damaged, and the blocks of the segments between them cannot be trusted. Restore the file from a copy.");
                }

                if (complete && (filter is null || filter(new PayloadRef(offset), header)))
                {
                    if (largeState == BlockState.Allocated && listUnsealed)
                    {
                        unsealed.Add(offset);
                    }

                    liveBlocks++;
                    liveBytes += payload * HeapLayout.SegmentSize;
                    maxUid = Math.Max(maxUid, header.Uid);
                    s += payload;
                    continue;
                }

                if (largeState == BlockState.Damaged)
                {
                    damaged.Add(offset);
                }

                // A torn, damaged or rejected large block: its whole span is freed durably (after the scan), so no
                // stale descriptor inside it can resurface; its segments are free ones below.
                long freeOffset = complete || largeState == BlockState.Damaged ? offset : -1;
                if (foreign < 0)
                {
                    freeSpans.Add((s, payload, freeOffset));
                }
                else
                {
                    // A block whose allocation a crash interrupted while its span's descriptors were being persisted:
                    // the start and the continuations that became durable are freed; the others keep what they were (a
                    // free segment, or a small one whose blocks the scan below finds free), never freed unread.
                    freeSpans.Add((s, 1, freeOffset));
                    for (long t = s + 1; t < s + payload; t++)
                    {
                        if (HeapLayout.DescriptorRole(_table[t]) == HeapLayout.RoleLargeContinuation)
                        {
                            freeSpans.Add((t, 1, -1));
                        }
                    }
                }
            }

            // Free, orphan continuation, or anything unrecognizable: the segment is free.
            _segmentFree[s++] = true;
            _freeSegmentCount++;
        }

        // Pass 2, parallel: the blocks of small-block segments (from the saved bits, or by reading every header).
        var firstWord = new long[small.Count];
        for (int i = 1; i < small.Count; i++)
        {
            firstWord[i] = firstWord[i - 1] + WordsPerSegment((int)HeapLayout.DescriptorPayload(_table[small[i - 1]]));
        }

        var gate = new object();
        long freeBlockBytes = 0;
        bool acceptTorn = (_faults & HeapFaults.AcceptTornHeaders) != 0;
        bool loseInvalid = (_faults & HeapFaults.LoseInvalidBlocksAtRecovery) != 0;
        bool leaveTorn = (_faults & HeapFaults.LeaveTornHeaders) != 0;
        bool tornIsDamaged = options.TornIsDamaged;
        bool scrubEpochWords = listUnsealed && _marksEmptyEpochs;
        InterruptShield.RunToItsEnd(bodies => Parallel.For(
            0,
            small.Count,
            new ParallelOptions { MaxDegreeOfParallelism = Math.Max(1, options.RecoveryParallelism) },
            () => new ScanTotals(),
            bodies.Guard<ScanTotals>((index, loopState, totals) =>
            {
                long segment = small[index];
                ulong descriptor = _table[segment];
                int cls = (int)HeapLayout.DescriptorPayload(descriptor);
                uint generation = HeapLayout.DescriptorGeneration(descriptor);
                int blockSize = SizeClasses.BlockSizes[cls];
                int blocks = SizeClasses.BlocksPerSegment[cls];
                long start = SegmentStart(segment);
                long[] free = new long[blocks];
                int freeCount = 0, live = 0, invalid = 0;
                for (int k = 0; k < blocks; k++)
                {
                    long offset = start + ((long)k * blockSize);
                    PayloadHeader header;
                    bool valid;
                    bool sealedBlock = true;
                    if (bitmap is not null)
                    {
                        // Checked whole when the saved state was accepted (TryReadSavedState).
                        valid = (bitmap[firstWord[index] + (k >> 6)] & (1UL << (k & 63))) != 0;
                        header = valid ? ReadHeaderUnchecked(offset) : default;
                        if (!valid && freeHeadersFromSavedState && !ReadsFree(*(ulong*)(_base + offset + HeapLayout.CommitOffset)))
                        {
                            // Free in the saved state, free in the damaged log only: written free, durably, before the log begins anew.
                            totals.FreeBlocks.Add(offset);
                        }
                    }
                    else if (acceptTorn)
                    {
                        valid = LooksAllocated(offset, generation, out header);
                    }
                    else
                    {
                        BlockState blockState = ClassifyBlock(offset, generation, blockSize - HeapLayout.HeaderSize, out header);
                        blockState = blockState == BlockState.Torn && tornIsDamaged ? BlockState.Damaged : blockState;
                        bool loggedFree = false;
                        if (logged is not null)
                        {
                            // A block a sweep freed through the log: free while its header is still the one logged,
                            // whatever else of a reuse reached the file (see SweepLog).
                            ulong* words = (ulong*)(_base + offset);
                            BlockState byLog = logged.Reclassify(offset, words[3], words[1], blockState, _inFlightVersion);
                            loggedFree = byLog != blockState;
                            blockState = byLog;
                        }

                        valid = blockState is BlockState.Allocated or BlockState.Sealed;
                        sealedBlock = blockState != BlockState.Allocated;
                        if (loggedFree)
                        {
                            // Written free, durably, before the log is emptied (SweepLog.Begin).
                            totals.FreeBlocks.Add(offset);
                        }
                        else if (blockState == BlockState.Damaged)
                        {
                            totals.Damaged.Add(offset);
                            totals.FreeBlocks.Add(offset);
                        }
                        else if (blockState is BlockState.Free or BlockState.Unused && scrubEpochWords && ((ulong*)(_base + offset))[1] != HeapLayout.EmptyEpoch(offset))
                        {
                            // A free block whose Epoch word is not its empty mark (an allocation a crash interrupted
                            // before its commit word, or a free whose mark did not reach the file): rewritten as free
                            // with its mark, durably, before it is handed out, so that a seal over its next use that a
                            // crash tears holds that use's version or the mark there, never this one (see HeapLayout, sealing).
                            totals.FreeBlocks.Add(offset);
                        }
                        else if (blockState == BlockState.Torn && !leaveTorn)
                        {
                            // A crash interrupted this allocation: some of its header words are durable, and the check
                            // over them fails. It is free, and made durably free before it is handed out again: left
                            // as it is, a later allocation of the same uid and shape at this offset can supply the
                            // missing words, and a crash then completes the old header — an old, durable-looking tag —
                            // over the new payload's bytes.
                            totals.FreeBlocks.Add(offset);
                        }
                    }

                    // A size read from the file is checked against the block before anyone reads that many bytes.
                    valid &= (uint)header.Size <= (uint)(blockSize - HeapLayout.HeaderSize);

                    if (valid && tagBound > 0 && header.EpochTag > tagBound)
                    {
                        // Intact, but newer than anything the superblock says the file can hold (see TagBound): damage,
                        // reported before anything is written, never a payload beyond the frontier to drop and free.
                        totals.Damaged.Add(offset);
                        totals.FreeBlocks.Add(offset);
                        totals.BeyondTagBound++;
                        totals.MaxBeyondTagBound = Math.Max(totals.MaxBeyondTagBound, header.EpochTag);
                        valid = false;
                    }

                    if (valid && filter is not null && !filter(new PayloadRef(offset), header))
                    {
                        totals.FreeBlocks.Add(offset);
                        valid = false;
                    }
                    else if (!valid)
                    {
                        invalid++;
                    }

                    if (valid)
                    {
                        live++;
                        totals.MaxUid = Math.Max(totals.MaxUid, header.Uid);
                        if (!sealedBlock && listUnsealed)
                        {
                            totals.Unsealed.Add(offset);
                        }
                    }
                    else
                    {
                        free[freeCount++] = offset;
                    }
                }

                if (live == 0)
                {
                    totals.FreeSegments.Add(segment);
                    return totals;
                }

                if (loseInvalid && invalid > 0)
                {
                    // The broken control: only never-used blocks (an unused commit word) go back to the free lists.
                    int keep = 0;
                    for (int k = 0; k < freeCount; k++)
                    {
                        if (HeapLayout.CommitState(*(ulong*)(_base + free[k] + HeapLayout.CommitOffset)) == HeapLayout.StateUnused)
                        {
                            free[keep++] = free[k];
                        }
                    }

                    freeCount = keep;
                }

                totals.LiveBlocks += live;
                totals.LiveBytes += (long)live * blockSize;
                totals.FreeBytes += (long)freeCount * blockSize;
                totals.Overhead += SizeClasses.SegmentOverhead(cls);
                PushFree(cls, free, freeCount);
                return totals;
            }),
            bodies.Guard<ScanTotals>(totals =>
            {
                using (InterruptShield.Hold(gate))
                {
                    liveBlocks += totals.LiveBlocks;
                    liveBytes += totals.LiveBytes;
                    freeBlockBytes += totals.FreeBytes;
                    _overheadBytes += totals.Overhead;
                    maxUid = Math.Max(maxUid, totals.MaxUid);
                    damaged.AddRange(totals.Damaged);
                    beyondBound += totals.BeyondTagBound;
                    maxBeyond = Math.Max(maxBeyond, totals.MaxBeyondTagBound);
                    unsealed.AddRange(totals.Unsealed);
                    freeBlocks.AddRange(totals.FreeBlocks);
                    foreach (long segment in totals.FreeSegments)
                    {
                        _segmentFree[segment] = true;
                        _freeSegmentCount++;
                    }
                }
            })), Math.Max(1, options.RecoveryParallelism));

        damaged.Sort();
        RecoveryDamagedBlocks = damaged;
        unsealed.Sort();
        RecoveryUnsealedBlocks = unsealed;
        if (damaged.Count != 0 && !options.SalvageDamagedBlocks)
        {
            ThrowDamaged(damaged, options.TornIsDamaged, beyondBound, maxBeyond, tagBound);
        }

        if (damaged.Count != 0 || RecoveryDamagedSweepLog.Count != 0)
        {
            options.BeforeSalvage?.Invoke();
        }

        WriteRecoveredFrees(freeBlocks, freeSpans);
        if (listUnsealed)
        {
            // After a scan, every free the log held is durable in its block (above): the log is emptied. After a fast
            // reopen it goes on as the last session left it, unless it was damaged: then the saved state's frees were
            // written into the blocks (above) instead, and it is emptied too.
            if (bitmap is not null && log is not null && !freeHeadersFromSavedState && (_faults & HeapFaults.FastReopenVoidsTheSweepLog) == 0)
            {
                _sweepLog = SweepLog.Resume(_file, log);
                MarkLoggedFreesInWorkingImage(log.Frees);
            }
            else
            {
                _sweepLog = SweepLog.Begin(_file);
            }
        }

        _recoveredLiveBlocks = liveBlocks;
        _recoveredLiveBytes = liveBytes;
        _nextUid = saved is { } state ? Math.Max(maxUid, state.NextUid) : maxUid;
        return new HeapStatistics(
            segments * HeapLayout.SegmentSize,
            liveBlocks,
            liveBytes,
            freeBlockBytes + (_freeSegmentCount * HeapLayout.SegmentSize),
            _overheadBytes,
            _freeSegmentCount);
    }

    /// <summary>
    /// After a fast reopen: each block whose header still holds a commit word the sweep log lists for it (a block the
    /// saved state counts free, free in the log only) gets its free word and empty mark in the working image, as the
    /// sweep that logged it left them in the last session's, so that nothing reading headers (a scan of the allocated
    /// blocks, a free's check) takes its old seal for a live block. Not written back: the log keeps the free durable.
    /// </summary>
    private void MarkLoggedFreesInWorkingImage(SweepLog.LoggedFrees frees)
    {
        long end = SegmentStart(_segmentCount);
        foreach ((long offset, ulong commit) in frees.Entries)
        {
            if (offset < _dataStart || offset >= end)
            {
                continue;
            }

            long segment = SegmentOf(offset);
            ulong descriptor = _table[segment];
            if (HeapLayout.DescriptorRole(descriptor) != HeapLayout.RoleSmall || HeapLayout.DescriptorPayload(descriptor) >= SizeClasses.Count)
            {
                continue;
            }

            int blockSize = SizeClasses.BlockSizes[(int)HeapLayout.DescriptorPayload(descriptor)];
            long within = offset - SegmentStart(segment);
            ulong* commitWord = (ulong*)(_base + offset + HeapLayout.CommitOffset);
            if (within % blockSize == 0 && within / blockSize < SizeClasses.BlocksPerSegment[(int)HeapLayout.DescriptorPayload(descriptor)] && *commitWord == commit)
            {
                *commitWord = HeapLayout.FreeWord(offset, HeapLayout.DescriptorGeneration(descriptor));
                MarkEpochWordEmpty(offset);
            }
        }
    }

    /// <summary>
    /// The file offsets (sorted) of the damaged blocks recovery dropped when the heap opened with
    /// <see cref="PersistentHeapOptions.SalvageDamagedBlocks"/>; empty when it found none.
    /// </summary>
    public IReadOnlyList<long> RecoveryDamagedBlocks { get; private set; } = Array.Empty<long>();

    /// <summary>Whether a commit word is a free or never-used block's (a stale seal, or damage, is not).</summary>
    private static bool ReadsFree(ulong commit) =>
        (commit & (0xFFUL << 56)) == HeapLayout.CommitTag && HeapLayout.CommitState(commit) is HeapLayout.StateFree or HeapLayout.StateUnused;

    /// <summary>
    /// While the file holds a clean shutdown's saved state: where each half of <paramref name="log"/>'s valid batches end
    /// must be where that state says they ended. Damage to a half's last batches reads as the end of its batches (as an append a crash tore does),
    /// so only this tells it: refused, or with <paramref name="salvage"/> listed in the log's damage.
    /// </summary>
    private void RefuseLogEndsOtherThanSaved(SweepLog.Contents log, long[] savedEnds, bool salvage)
    {
        long start = HeapLayout.SweepLogStart(_file.MaxSegments);
        long half = (_dataStart - start) / 2;
        for (int h = 0; h < 2; h++)
        {
            long lapOffset = start + (h * half);
            if (log.Ends[h] == savedEnds[h] || log.Damaged.Contains(lapOffset))
            {
                continue;
            }

            long at = Math.Min(log.Ends[h], savedEnds[h]);
            if (!salvage)
            {
                ThrowHelper.ThrowHeapFile(HeapFileError.Corrupt, $"Cannot open heap file '{_file.Path}': the sweep log's batches end at file offset {log.Ends[h]}, but the last clean shutdown saved them ending at {savedEnds[h]}: the batch at {at} is damaged, and the frees it held cannot be trusted. Restore the file from a copy, or open it with SalvageDamagedBlocks = true (the recovery report then lists the damage; this refused open left the file marked as not closed cleanly, so the heap is scanned, and a payload deleted after one of those frees may come back).");
            }

            log.Damaged.Add(at);
        }
    }

    /// <summary>
    /// Where each half of <paramref name="log"/>'s valid batches end must be at least where a cycle's mark of its lap
    /// says they reached (<see cref="SweepLog.WriteBackMark"/>): short of it, the batch they end at is damaged, not an
    /// append a crash tore (whose batch no mark can have reached). Refused, or with <paramref name="salvage"/> listed in
    /// the log's damage.
    /// </summary>
    private void RefuseLogEndsShortOfItsMarks(SweepLog.Contents log, bool salvage)
    {
        long start = HeapLayout.SweepLogStart(_file.MaxSegments);
        long half = (_dataStart - start) / 2;
        foreach ((int h, long lap, long end) in SweepLog.ReadMarks(_base, _file.MaxSegments, _dataStart, _file.SweepLogEpoch, (_faults & HeapFaults.SweepLogMarksOfAnyEpoch) != 0))
        {
            if (log.Laps[h] != lap || log.Ends[h] >= end || log.Damaged.Contains(start + (h * half)))
            {
                continue;
            }

            if (!salvage)
            {
                ThrowHelper.ThrowHeapFile(HeapFileError.Corrupt, $"Cannot open heap file '{_file.Path}': the sweep log's batches end at file offset {log.Ends[h]}, but an advance of the heap found them durable up to {end}: the batch at {log.Ends[h]} is damaged (not an append a crash interrupted), and the frees it held cannot be trusted. Restore the file from a copy, or open it with SalvageDamagedBlocks = true (the recovery report then lists the damage; a payload deleted after one of those frees may come back).");
            }

            if (!log.Damaged.Contains(log.Ends[h]))
            {
                log.Damaged.Add(log.Ends[h]);
            }
        }
    }

    /// <summary>
    /// The file offsets of the sweep log's damaged batches and lap words that recovery skipped under
    /// <see cref="PersistentHeapOptions.SalvageDamagedBlocks"/> (a buffered heap's log only); empty when it found none.
    /// </summary>
    internal List<long> RecoveryDamagedSweepLog { get; private set; } = new();

    /// <summary>The file offsets (sorted) of the blocks the full scan kept that are allocated but not sealed (their payload unchecked). Empty after a fast reopen.</summary>
    internal List<long> RecoveryUnsealedBlocks { get; private set; } = new();

    /// <summary>Drops the scan's list of unsealed blocks once the owner has used it.</summary>
    internal void ReleaseRecoveryLists()
    {
        RecoveryUnsealedBlocks = new List<long>();
    }

    private void ThrowDamaged(List<long> damaged, bool tornIsDamaged, long beyondBound, long maxBeyond, long tagBound)
    {
        string why = tornIsDamaged
            ? " The file's sealed-frontier word is below its durable frontier (a file written by a version of this library that persisted the frontier before the seals, or the word is damaged), so blocks left torn by a crash count as damage: the scan cannot tell them from damaged headers of the last durable version."
            : string.Empty;
        if (beyondBound != 0)
        {
            why += $" {beyondBound} of them pass their checks but carry versions up to {maxBeyond}, above the epoch clock {tagBound} that the superblock holds, which is persisted before any block of a version is written: the superblock is older than the blocks (a lost write of its page, or an old copy of it), and the durable frontier it holds would drop data that was durable. Restore the superblock (the file's first page) from a copy rather than salvage.";
        }

        const int Shown = 16;
        string offsets = string.Join(", ", damaged.GetRange(0, Math.Min(Shown, damaged.Count)).ConvertAll(o => $"0x{o:X}"));
        string more = damaged.Count > Shown ? $" and {damaged.Count - Shown} more" : string.Empty;
        throw new HeapFileException(
            HeapFileError.Corrupt,
            $"Cannot open heap file '{_file.Path}': {damaged.Count} block(s) fail their checks (at file offsets {offsets}{more}); their contents cannot be trusted, and recovery changed no block. Restore the file from a copy, or open it with SalvageDamagedBlocks = true to drop those blocks (each is listed in the recovery report).{why}",
            damagedBlocks: damaged);
    }

    /// <summary>
    /// Whether a checked descriptor of segment <paramref name="s"/> is one this format writes: free or a continuation
    /// (payload 0), a small segment of a size class, or a large start whose span fits the heap.
    /// </summary>
    private static bool DescribesASegment(ulong descriptor, long s, long segments)
    {
        long payload = HeapLayout.DescriptorPayload(descriptor);
        return HeapLayout.DescriptorRole(descriptor) switch
        {
            HeapLayout.RoleFree or HeapLayout.RoleLargeContinuation => payload == 0,
            HeapLayout.RoleSmall => payload < SizeClasses.Count,
            HeapLayout.RoleLargeStart => payload >= 1 && payload <= segments - s,
            _ => false,
        };
    }

    /// <summary>
    /// The frees recovery decided on, written after every block was classified: rejected and damaged blocks get a free
    /// commit, torn or rejected large blocks their span's descriptors; all of it durable before the constructor returns.
    /// </summary>
    private void WriteRecoveredFrees(List<long> freeBlocks, List<(long Segment, long Span, long FreeOffset)> freeSpans)
    {
        // Through the page cache (msync), a write-back per freed header is a system call and a disk write each (the
        // PersistentKv sample's recovery spent seconds on them); one ranged persist after the loop covers them all.
        bool perBlockWriteBack = _file.Domain.IsPersistentMemory;
        foreach (long offset in freeBlocks)
        {
            ulong* commit = (ulong*)(_base + offset + HeapLayout.CommitOffset);
            uint generation = HeapLayout.DescriptorGeneration(_table[SegmentOf(offset)]);
            // Volatile.Write: one aligned 8-byte store (failure-atomic); written back below, with the empty mark.
            Volatile.Write(ref *commit, HeapLayout.FreeWord(offset, generation));
            MarkEpochWordEmpty(offset);

            if (perBlockWriteBack)
            {
                _file.Domain.WriteBackOwned(offset, HeapLayout.HeaderSize);
            }
        }

        foreach ((long segment, long span, long freeOffset) in freeSpans)
        {
            if (freeOffset >= 0)
            {
                ulong* commit = (ulong*)(_base + freeOffset + HeapLayout.CommitOffset);
                // Volatile.Write: one aligned 8-byte store (failure-atomic), persisted before the descriptors below.
                Volatile.Write(ref *commit, HeapLayout.FreeWord(freeOffset, HeapLayout.DescriptorGeneration(_table[segment])));
                _file.Domain.PersistOwned(freeOffset, HeapLayout.HeaderSize);
            }

            for (long t = segment; t < segment + span; t++)
            {
                // Volatile.Write: release; the segments were already counted free by the scan (no other thread yet).
                Volatile.Write(ref _table[t], HeapLayout.FreedDescriptor(_table[t], t));
            }

            _file.Domain.PersistOwned(TableOffset(segment), span * sizeof(ulong));
        }

        if (freeBlocks.Count != 0)
        {
            // Every free above is durable before the constructor returns (callers rely on it).
            if (perBlockWriteBack)
            {
                _file.Domain.FenceOwned();
            }
            else if (_file.Domain.WritesBackByCopy)
            {
                // A private mapping copies whole ranges: the freed headers only, merged into runs per page.
                WriteBackRuns.WriteBackHeadersAndFence(_file.Domain, CollectionsMarshal.AsSpan(freeBlocks));
            }
            else
            {
                _file.Domain.PersistOwned(0, _file.Size);
            }
        }
    }

    /// <summary>
    /// The first segment after <paramref name="start"/> within its large block's <paramref name="span"/> whose descriptor is
    /// a small segment's or another large start's (neither a continuation nor free), or -1.
    /// </summary>
    private long ForeignSegmentInSpan(long start, long span)
    {
        for (long t = start + 1; t < start + span; t++)
        {
            ulong role = HeapLayout.DescriptorRole(_table[t]);
            if (role is HeapLayout.RoleSmall or HeapLayout.RoleLargeStart)
            {
                return t;
            }
        }

        return -1;
    }

    private BlockState ClassifyBlock(long offset, uint generation, long maxPayload, out PayloadHeader header) =>
        HeapLayout.Classify(_base + offset, offset, generation, maxPayload, out header, _inFlightVersion, _faults);

    private void Scan(Action<PayloadRef, PayloadHeader> visitor, int degreeOfParallelism)
    {
        // Volatile.Read: acquire; pairs with the release in TryGrowLocked.
        long segments = Volatile.Read(ref _segmentCount);
        var work = new List<long>();
        for (long s = 0; s < segments;)
        {
            ulong descriptor = _table[s];
            ulong role = HeapLayout.DescriptorRole(descriptor);
            long payload = HeapLayout.DescriptorPayload(descriptor);
            if (role == HeapLayout.RoleLargeStart && payload >= 1 && s + payload <= segments)
            {
                if (TryReadHeader(SegmentStart(s), HeapLayout.DescriptorGeneration(descriptor), (payload * HeapLayout.SegmentSize) - HeapLayout.HeaderSize, out PayloadHeader header))
                {
                    visitor(new PayloadRef(SegmentStart(s)), header);
                    s += payload;
                    continue;
                }
            }
            else if (role == HeapLayout.RoleSmall && payload < SizeClasses.Count)
            {
                work.Add(s);
            }

            s++;
        }

        InterruptShield.RunToItsEnd(bodies => Parallel.ForEach(work, new ParallelOptions { MaxDegreeOfParallelism = Math.Max(1, degreeOfParallelism) }, bodies.Guard<long>(segment =>
        {
            // Each scanning thread inside a call of the file (nested on the caller's): a visitor's Dispose on a pool
            // thread is then refused as on the caller's (it used to wait 30 s for the caller's call, which waited for it).
            // Without the disposed check: a Dispose on another thread waits for the scan, as it always did.
            _file.EnterHelperOfACall();
            try
            {
                ulong descriptor = _table[segment];
                int cls = (int)HeapLayout.DescriptorPayload(descriptor);
                uint generation = HeapLayout.DescriptorGeneration(descriptor);
                for (int k = 0; k < SizeClasses.BlocksPerSegment[cls]; k++)
                {
                    long offset = SegmentStart(segment) + ((long)k * SizeClasses.BlockSizes[cls]);
                    bool valid = (_faults & HeapFaults.AcceptTornHeaders) != 0 ? LooksAllocated(offset, generation, out PayloadHeader header) : TryReadHeader(offset, generation, SizeClasses.BlockSizes[cls] - HeapLayout.HeaderSize, out header);
                    if (valid)
                    {
                        visitor(new PayloadRef(offset), header);
                    }
                }
            }
            finally
            {
                _file.ExitOperation();
            }
        })), Math.Max(1, degreeOfParallelism));
    }

    /// <summary>Whether the block is a complete allocation (a sealed one checked whole, header and payload).</summary>
    private bool TryReadHeader(long offset, uint generation, long maxPayload, out PayloadHeader header) =>
        ClassifyBlock(offset, generation, maxPayload, out header) is BlockState.Allocated or BlockState.Sealed;

    /// <summary>The broken check of <see cref="HeapFaults.AcceptTornHeaders"/>: state bits and generation (the version tag of a sealed word is not checked) only.</summary>
    private bool LooksAllocated(long offset, uint generation, out PayloadHeader header)
    {
        ulong* h = (ulong*)(_base + offset);
        ulong commit = h[3];
        bool looks = (commit & (0xFFUL << 56)) == HeapLayout.CommitTag
            && HeapLayout.InUse(commit)
            && (HeapLayout.CommitState(commit) == HeapLayout.StateSealed || HeapLayout.SameGeneration(commit, generation));
        header = looks ? new PayloadHeader((long)h[0], (long)h[1], HeapLayout.CommitKind(commit), HeapLayout.ShapeSize(h[2]), HeapLayout.ShapeTypeId(h[2])) : default;
        return looks;
    }

    private sealed class ScanTotals
    {
        internal long LiveBlocks;
        internal long LiveBytes;
        internal long FreeBytes;
        internal long Overhead;
        internal long MaxUid;
        internal List<long> FreeSegments { get; } = new();

        internal List<long> FreeBlocks { get; } = new();

        internal List<long> Damaged { get; } = new();

        internal List<long> Unsealed { get; } = new();

        /// <summary>Blocks that pass their checks with a tag above <see cref="PersistentHeapOptions.TagBound"/>, and the largest such tag.</summary>
        internal long BeyondTagBound;

        internal long MaxBeyondTagBound;
    }
}
