using System;
using System.Collections.Generic;
using System.Threading;
using System.Threading.Tasks;

namespace Epvs.Persistence;

/// <summary>Recovery: rebuilding every transient structure from the segment table and the block headers.</summary>
public sealed unsafe partial class PersistentHeap
{
    private HeapStatistics Recover(PersistentHeapOptions options)
    {
        long segments = _file.SegmentCount;
        // Volatile.Write: release; the constructor publishes the heap to other threads anyway (no concurrent reader yet).
        Volatile.Write(ref _segmentCount, segments);
        var small = new List<long>();
        long liveBlocks = 0, liveBytes = 0, maxUid = 0;
        Func<PayloadRef, PayloadHeader, bool>? filter = options.RecoveryFilter;

        // Every descriptor in use is checked before anything is written: a damaged one is reported, never trusted
        // (a flipped role or class would silently drop or misread a whole segment of blocks).
        for (long s = 0; s < segments; s++)
        {
            if (!HeapLayout.IsValidDescriptor(_table[s]))
            {
                ThrowHelper.ThrowHeapFile(HeapFileError.Corrupt, $"Cannot open heap file '{_file.Path}': the descriptor of segment {s} (0x{_table[s]:X16}) fails its check; the segment's blocks cannot be trusted. Restore the file from a copy.");
            }
        }

        // Fast reopen: checked (read-only) and invalidated durably before pass 1 can write anything.
        (ulong[] Bitmap, long NextUid)? saved = TryReadSavedState(options.RecoveryParallelism);
        ulong[]? bitmap = saved?.Bitmap;
        OpenedFromSavedState = saved is not null;

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
                bool valid = TryReadHeader(offset, HeapLayout.DescriptorGeneration(descriptor), out PayloadHeader header)
                    && HeapLayout.HeaderSize + (long)(uint)header.Size > (payload - 1) * HeapLayout.SegmentSize
                    && HeapLayout.HeaderSize + (long)(uint)header.Size <= payload * HeapLayout.SegmentSize;
                if (valid && (filter is null || filter(new PayloadRef(offset), header)))
                {
                    liveBlocks++;
                    liveBytes += payload * HeapLayout.SegmentSize;
                    maxUid = Math.Max(maxUid, header.Uid);
                    s += payload;
                    continue;
                }

                // A torn or rejected large block: free its whole span durably, so no stale descriptor inside it can
                // resurface, then classify its segments as free ones below.
                if (valid)
                {
                    ulong* commit = (ulong*)(_base + offset + HeapLayout.CommitOffset);
                    // Volatile.Write: one aligned 8-byte store (failure-atomic); written back below.
                    Volatile.Write(ref *commit, HeapLayout.FreeCommit(*commit));
                    _file.Domain.WriteBack(offset, HeapLayout.HeaderSize);
                }

                lock (_segmentGate)
                {
                    ReleaseSpanLocked(s, payload);
                    _freeSegmentCount -= payload;
                    for (long t = s; t < s + payload; t++)
                    {
                        _segmentFree[t] = false;
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

        // Through the page cache (msync), a write-back per freed header is a system call and a disk write each (the
        // PersistentKv sample's recovery spent seconds on them); one ranged persist after the scan covers them all.
        bool perBlockWriteBack = _file.Domain.IsPersistentMemory;
        int anyFreed = 0;
        bool acceptTorn = (_faults & HeapFaults.AcceptTornHeaders) != 0;
        bool loseInvalid = (_faults & HeapFaults.LoseInvalidBlocksAtRecovery) != 0;
        Parallel.For(
            0,
            small.Count,
            new ParallelOptions { MaxDegreeOfParallelism = Math.Max(1, options.RecoveryParallelism) },
            () => new ScanTotals(),
            (index, loopState, totals) =>
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
                bool wroteBack = false;
                for (int k = 0; k < blocks; k++)
                {
                    long offset = start + ((long)k * blockSize);
                    PayloadHeader header;
                    bool valid;
                    if (bitmap is not null)
                    {
                        valid = (bitmap[firstWord[index] + (k >> 6)] & (1UL << (k & 63))) != 0;
                        header = valid ? ReadHeaderUnchecked(offset) : default;
                    }
                    else
                    {
                        valid = acceptTorn ? LooksAllocated(offset, generation, out header) : TryReadHeader(offset, generation, out header);
                    }

                    // A size read from the file is checked against the block before anyone reads that many bytes.
                    valid &= (uint)header.Size <= (uint)(blockSize - HeapLayout.HeaderSize);

                    if (valid && filter is not null && !filter(new PayloadRef(offset), header))
                    {
                        ulong* commit = (ulong*)(_base + offset + HeapLayout.CommitOffset);
                        // Volatile.Write: one aligned 8-byte store (failure-atomic); written back below.
                        Volatile.Write(ref *commit, HeapLayout.FreeCommit(*commit));
                        if (perBlockWriteBack)
                        {
                            _file.Domain.WriteBack(offset, HeapLayout.HeaderSize);
                        }

                        wroteBack = true;
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
                    }
                    else
                    {
                        free[freeCount++] = offset;
                    }
                }

                if (wroteBack)
                {
                    if (perBlockWriteBack)
                    {
                        _file.Domain.Fence();
                    }
                    else
                    {
                        // Volatile.Write: release; read after Parallel.For returns (its join orders it anyway).
                        Volatile.Write(ref anyFreed, 1);
                    }
                }

                if (live == 0)
                {
                    totals.FreeSegments.Add(segment);
                    return totals;
                }

                if (loseInvalid && invalid > 0)
                {
                    // The broken control: only never-used blocks (commit word 0) go back to the free lists.
                    int keep = 0;
                    for (int k = 0; k < freeCount; k++)
                    {
                        if (*(ulong*)(_base + free[k] + HeapLayout.CommitOffset) == 0)
                        {
                            free[keep++] = free[k];
                        }
                    }

                    freeCount = keep;
                }

                totals.LiveBlocks += live;
                totals.LiveBytes += (long)live * blockSize;
                totals.FreeBytes += (long)freeCount * blockSize;
                totals.Overhead += HeapLayout.SegmentSize - ((long)blocks * blockSize);
                PushFree(cls, free, freeCount);
                return totals;
            },
            totals =>
            {
                lock (gate)
                {
                    liveBlocks += totals.LiveBlocks;
                    liveBytes += totals.LiveBytes;
                    freeBlockBytes += totals.FreeBytes;
                    _overheadBytes += totals.Overhead;
                    maxUid = Math.Max(maxUid, totals.MaxUid);
                    foreach (long segment in totals.FreeSegments)
                    {
                        _segmentFree[segment] = true;
                        _freeSegmentCount++;
                    }
                }
            });

        if (anyFreed != 0)
        {
            // Every free above is durable before the constructor returns (callers rely on it).
            _file.Domain.Persist(0, _file.Size);
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
                if (TryReadHeader(SegmentStart(s), HeapLayout.DescriptorGeneration(descriptor), out PayloadHeader header))
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

        Parallel.ForEach(work, new ParallelOptions { MaxDegreeOfParallelism = Math.Max(1, degreeOfParallelism) }, segment =>
        {
            ulong descriptor = _table[segment];
            int cls = (int)HeapLayout.DescriptorPayload(descriptor);
            uint generation = HeapLayout.DescriptorGeneration(descriptor);
            for (int k = 0; k < SizeClasses.BlocksPerSegment[cls]; k++)
            {
                long offset = SegmentStart(segment) + ((long)k * SizeClasses.BlockSizes[cls]);
                bool valid = (_faults & HeapFaults.AcceptTornHeaders) != 0 ? LooksAllocated(offset, generation, out PayloadHeader header) : TryReadHeader(offset, generation, out header);
                if (valid)
                {
                    visitor(new PayloadRef(offset), header);
                }
            }
        });
    }

    private bool TryReadHeader(long offset, uint generation, out PayloadHeader header)
    {
        ulong* h = (ulong*)(_base + offset);
        ulong uid = h[0], epoch = h[1], shape = h[2], commit = h[3];
        if (!HeapLayout.IsValidAllocated(uid, epoch, shape, commit, offset, generation))
        {
            header = default;
            return false;
        }

        header = new PayloadHeader((long)uid, (long)epoch, HeapLayout.CommitKind(commit), HeapLayout.ShapeSize(shape), HeapLayout.ShapeTypeId(shape));
        return true;
    }

    /// <summary>The broken check of <see cref="HeapFaults.AcceptTornHeaders"/>: state bits and generation only.</summary>
    private bool LooksAllocated(long offset, uint generation, out PayloadHeader header)
    {
        ulong* h = (ulong*)(_base + offset);
        ulong commit = h[3];
        bool looks = (commit & (0xFFUL << 56)) == HeapLayout.CommitTag
            && HeapLayout.CommitState(commit) == HeapLayout.StateAllocated
            && (ushort)(commit >> 32) == (ushort)generation;
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
    }
}
