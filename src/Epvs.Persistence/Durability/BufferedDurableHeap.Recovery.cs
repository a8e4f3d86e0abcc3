using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Runtime.InteropServices;
using System.Threading;
using System.Threading.Tasks;

namespace Epvs.Persistence;

// Recovery (DESIGN §4, layer 6): a parallel scan that keeps 0 &lt; tag ≤ cut, the newest copy per uid, lets mature
// anti-payloads cancel their uid, frees the rest durably, and restores the clock.
public sealed unsafe partial class BufferedDurableHeap
{
    private readonly object _recoveredGate = new();
    private readonly HashSet<int> _claimedTypes = new();

    /// <summary>The user type ids of the structures opened on this heap (see <see cref="ReserveStructureTypeId"/>).</summary>
    private readonly HashSet<int> _structureTypeIds = new();
    private Dictionary<int, List<RecoveredPayload>> _recovered = new();

    /// <summary>
    /// Refuses <see cref="DurabilityMode.Transient"/> over a file that holds durable data, before anything of the heap
    /// exists: the refused open changed nothing, so the file keeps its clean-shutdown mark and its saved state (the
    /// next open is still a fast reopen; refused inside recovery, it lost both).
    /// </summary>
    private static void RefuseTransientOverDurableData(HeapFile file, DurabilityMode mode)
    {
        long frontier = file.DurableFrontier;
        long clock = file.EpochClock;
        if (mode == DurabilityMode.Transient && (frontier > 0 || clock > 0))
        {
            // Transient updates payloads of any version in place and frees without making the free durable: over
            // durable data it would destroy what the file promises to keep (and leave seals over changed payloads).
            ThrowHelper.ThrowInvalidOperation($"Cannot open heap file '{file.Path}' in DurabilityMode.Transient: it holds durable data (frontier {frontier}, clock {clock}), which a transient heap would overwrite in place. Open it with DurabilityMode.Buffered or Strict, or give the transient heap a new file.");
        }
    }

    private (PersistentHeap Heap, DurableRecoveryReport Report) Recover(HeapFile file, BufferedDurableHeapOptions options)
    {
        var watch = Stopwatch.StartNew();
        var report = new DurableRecoveryReport
        {
            WasCleanShutdown = file.WasCleanShutdown,
            PersistedClock = file.EpochClock,
            PersistedFrontier = file.DurableFrontier,
            Parallelism = options.RecoveryParallelism,
        };

        // Montage's rule (clock − 2) and ours (the frontier): the advancer writes back and fences version v before it
        // persists frontier v with clock v + 2, so every version up to clock − 2 is whole even when a crash left the
        // clock word of that pair durable without its frontier word (frontier v − 1, clock v + 2); taking the max keeps
        // the Montage guarantee then, and for a file whose frontier word was never written.
        long cut = Math.Max(report.PersistedFrontier, report.PersistedClock - 2);
        if (_mode != DurabilityMode.Transient && Math.Max(report.PersistedClock, report.PersistedFrontier) >= (long)HeapLayout.SealedValueMask)
        {
            // The open's first version (below: above the clock, the frontier and the cut) would not fit the clock word.
            // Only once the opens' headroom (HeapLayout.VersionHeadroom) is used up too, or under the broken control that
            // lets transitions run past the last writable version. Refused before anything is written.
            ThrowHelper.ThrowHeapFile(HeapFileError.VersionSpaceExhausted, $"Cannot open heap file '{file.Path}': its versions are used up (epoch clock {report.PersistedClock}, durable frontier {report.PersistedFrontier}; every open begins a new version, and the file stores versions in {HeapLayout.SealedValueBits} bits). Its payloads up to the frontier are intact on the file, but no buffered heap can open it.");
        }

        if (file.SalvagedThroughDamaged && !options.SalvageDamagedBlocks)
        {
            // Read as 0 it would erase the record of an earlier salvage silently, and the structures would then refuse what
            // it left (a queue gap, a key's two payloads) as an inconsistent heap instead of naming the damaged word.
            ThrowHelper.ThrowHeapFile(HeapFileError.Corrupt, $"Cannot open heap file '{file.Path}': its superblock is damaged (the salvaged-through word at offset {HeapLayout.SalvagedThroughOffset} fails its check). Open it with SalvageDamagedBlocks = true to accept what an earlier salvage may have left among the versions up to the recovered one.");
        }

        report.RecoveredVersion = cut;
        bool keepBeyond = (_faults & DurabilityFaults.KeepTagsBeyondFrontier) != 0;
        long dropped = 0;
        using var candidates = new ThreadLocal<List<Candidate>>(() => new List<Candidate>(), trackAllValues: true);

        // Pass 1 (part 1's parallel scan): payloads beyond the cut, and blocks written without epochs, are freed
        // durably before the allocator's constructor returns; the rest are collected per scanning thread.
        // Read before anything is written. Each cycle makes its seals and this word durable before its frontier, so the
        // word is below the frontier only in a file written before that order, or when the word itself is damaged (-1;
        // also a file older than the word). A durable version may then be unsealed, checked by its headers only, and a
        // damaged header of it reads as an interrupted allocation (its version is in the header): recovery takes every
        // torn block for damage — refused unless salvaged, as any damage — rather than free one without a word.
        long sealedThrough = file.SealedFrontier;
        bool windowOpen = cut > 0 && sealedThrough < cut && (_faults & DurabilityFaults.TrustTornBlocksBelowTheSealedFrontier) == 0;
        var heapOptions = new PersistentHeapOptions
        {
            TornIsDamaged = windowOpen,

            // The one version whose cycle can have been in flight: its blocks are sealed in the pass that writes them
            // back, so a seal may be durable over bytes that are not. Beyond the cut, they are dropped anyway.
            InFlightVersion = (_faults & DurabilityFaults.TornSealsAreDamage) != 0 ? 0 : cut + 1,

            // Durable before the salvage frees anything: a crash (or a failed open) after the frees leaves what they
            // explain — a key's older payload live again, a queue gap — and the structures must still accept it.
            BeforeSalvage = () => file.SalvagedThrough = Math.Max(file.SalvagedThrough, cut),
            RecoveryParallelism = options.RecoveryParallelism,
            // (The reuse-before-durable control breaks the heap's sweep of deferred frees the same way.)
            Faults = options.HeapFaults | ((_faults & DurabilityFaults.ReuseBeforeFreeIsDurable) != 0 ? HeapFaults.HandOutSweptFreesEarly : HeapFaults.None),
            OwnerKind = HeapLayout.KindBufferedDurable,

            // Its deletes write anti-payloads (not in Transient mode): a heap that cannot grow keeps room for them.
            KeepsDeleteReserve = _mode != DurabilityMode.Transient,

            // Every tag on the file was written after the clock covering it was persisted (the first transition after an
            // open persists it before any operation of the version; each cycle persists the next one with its frontier),
            // so an intact block tagged above the clock means the superblock is older than the blocks. (A clock of 0: a
            // file no durable heap has advanced, such as a transient heap's.)
            TagBound = (_faults & (DurabilityFaults.TrustTheClockOverTheBlocks | DurabilityFaults.ClockLeftBehind)) != 0 ? 0 : report.PersistedClock,
            SalvageDamagedBlocks = options.SalvageDamagedBlocks,
            RecoveryFilter = (block, header) =>
            {
                if (header.EpochTag <= 0 || (header.EpochTag > cut && !keepBeyond))
                {
                    // Interlocked.Increment: a counter shared by the scanning threads; no ordering needed.
                    Interlocked.Increment(ref dropped);
                    return false;
                }

                candidates.Value!.Add(new Candidate(block.Offset, header.Uid, header.EpochTag, header.Kind, header.TypeId, header.Size));
                return true;
            },
        };

        var heap = new PersistentHeap(file, heapOptions);
        try
        {
            if (file.SalvagedThroughDamaged)
            {
                // Only under SalvageDamagedBlocks (refused above otherwise), after the scan validated the blocks.
                file.SalvagedThrough = cut;
            }

            report.FastReopen = heap.OpenedFromSavedState;
            report.DamagedBlocks = heap.RecoveryDamagedBlocks;
            report.DamagedSweepLogOffsets = heap.RecoveryDamagedSweepLog;
            report.FastReopenRejection = heap.SavedStateRejection;
            if (heap.RecoveryUnsealedBlocks.Count != 0 && (_faults & DurabilityFaults.LeaveRecoveredBlocksUnsealed) == 0)
            {
                // Kept blocks that were never sealed (that version's): sealed now, so the next recovery checks them whole.
                report.SealedAtRecovery = heap.SealRecovered(CollectionsMarshal.AsSpan(heap.RecoveryUnsealedBlocks));
            }

            heap.ReleaseRecoveryLists();
            report.SalvagedThrough = file.SalvagedThrough;

            // Interlocked.Read: the scanning threads have been joined; an atomic read of their shared counter. Set before
            // Resolve, which counts the dropped blocks among the scanned ones (it read 0 here: ScannedPayloads left them out).
            report.DroppedBeyondFrontier = Interlocked.Read(ref dropped);
            if (heap.OpenedFromSavedState && report.DroppedBeyondFrontier == 0 && !HasAntiPayloads(candidates.Values))
            {
                // Saved only after every replaced payload and anti-payload was reclaimed: each block is the one live
                // payload of its uid, so there is nothing to resolve and nothing to free.
                HandOver(candidates.Values, report);
            }
            else
            {
                Resolve(heap, candidates.Values, options.RecoveryParallelism, report);
            }


            // New versions start above every tag that could be durable anywhere, and the frontier moves up to the
            // version before: nothing tagged between the cut and it survived (all of it was freed durably above).
            long start = Math.Max(Math.Max(report.PersistedClock, report.PersistedFrontier), cut) + 1;
            _versionBase = start - 1;
            _frontier = start - 1;
            if (_mode != DurabilityMode.Transient)
            {
                if ((_faults & DurabilityFaults.LeaveRecoveredBlocksUnsealed) == 0)
                {
                    // Every kept block is sealed now (above), the rest freed durably: no window left for the next recovery.
                    file.SealedFrontier = start - 1;
                }

                file.DurableFrontier = start - 1;
                file.EpochClock = start;
                _persistedClock = start;
            }

            // Once the superseded and cancelled payloads are free (the former reserve's anti-payloads among them).
            heap.DesignateReserveAfterRecovery();
        }
        catch
        {
            // (The internal Dispose: the public one refuses for a buffered heap's allocator.)
            heap.Dispose(operationsDrained: true);
            throw;
        }

        report.Duration = watch.Elapsed;
        return (heap, report);
    }

    private static bool HasAntiPayloads(IList<List<Candidate>> perThread)
    {
        foreach (List<Candidate> list in perThread)
        {
            foreach (Candidate c in list)
            {
                if (c.Kind == PayloadKind.Delete)
                {
                    return true;
                }
            }
        }

        return false;
    }

    private void HandOver(IList<List<Candidate>> perThread, DurableRecoveryReport report)
    {
        // Counted first: each type's list is allocated once at its size, not grown by doubling.
        var counts = new Dictionary<int, int>();
        foreach (List<Candidate> list in perThread)
        {
            foreach (Candidate c in list)
            {
                CollectionsMarshal.GetValueRefOrAddDefault(counts, c.TypeId, out _)++;
            }
        }

        long live = 0;
        foreach (List<Candidate> list in perThread)
        {
            foreach (Candidate c in list)
            {
                if (!_recovered.TryGetValue(c.TypeId, out List<RecoveredPayload>? payloads))
                {
                    _recovered[c.TypeId] = payloads = new List<RecoveredPayload>(counts[c.TypeId]);
                }

                payloads.Add(new RecoveredPayload(new PayloadRef(c.Offset), new PayloadHeader(c.Uid, c.Tag, c.Kind, c.Size, c.TypeId)));
                live++;
            }
        }

        report.ScannedPayloads = live;
        report.Live = live;
    }

    private void Resolve(PersistentHeap heap, IList<List<Candidate>> perThread, int parallelism, DurableRecoveryReport report)
    {
        // The scanning threads' lists are read where they are (a concatenated copy cost a serial pass over every
        // candidate): a candidate is named by its list and its index in it, Locate's packing.
        var lists = new List<Candidate>[perThread.Count];
        perThread.CopyTo(lists, 0);
        long total = 0;
        foreach (List<Candidate> list in lists)
        {
            total += list.Count;
        }

        report.ScannedPayloads = total + report.DroppedBeyondFrontier;

        // Partition by uid: each partition resolves its uids alone, in parallel. Each reads every candidate, so no more
        // partitions than processors (one per unit of a huge RecoveryParallelism made int.MaxValue fail the open with
        // OutOfMemoryException and 100,000 read every candidate 100,000 times).
        int partitions = Math.Clamp(parallelism, 1, Environment.ProcessorCount);
        var results = new PartitionResult[partitions];
        InterruptShield.RunToItsEnd(bodies => Parallel.For(0, partitions, new ParallelOptions { MaxDegreeOfParallelism = partitions }, bodies.Guard<int>(p =>
        {
            // Sized for this partition's share of the uids (a uid's copies all go to one partition): grown from empty, it
            // rehashed a heap's worth of entries several times over.
            var result = new PartitionResult((int)Math.Min(int.MaxValue - 64, (total / partitions) + (total / (partitions * 16)) + 16));
            Dictionary<long, long> winners = result.Winners;
            for (int l = 0; l < lists.Length; l++)
            {
                Span<Candidate> candidates = CollectionsMarshal.AsSpan(lists[l]);
                for (int i = 0; i < candidates.Length; i++)
                {
                    ref Candidate c = ref candidates[i];
                    if ((int)((ulong)c.Uid % (ulong)partitions) != p)
                    {
                        continue;
                    }

                    ref long best = ref CollectionsMarshal.GetValueRefOrAddDefault(winners, c.Uid, out bool seen);
                    if (!seen)
                    {
                        best = Locator(l, i);
                        continue;
                    }

                    // Newest tag wins; at an equal tag an anti-payload wins (a payload deleted in the version that wrote it).
                    ref Candidate b = ref Locate(lists, best);
                    if (c.TypeId != b.TypeId && result.TypeConflict is null)
                    {
                        // A copy and an anti-payload keep the type id of the payload they replace or delete: no crash leaves
                        // one uid under two type ids. A block from another heap file (whose uids also count from 1) or a
                        // forged header: freeing the loser as superseded would destroy a healthy payload of another
                        // structure without a word.
                        result.TypeConflict = (b.Offset, b.TypeId, c.Offset, c.TypeId, c.Uid);
                    }

                    bool newer = c.Tag > b.Tag || (c.Tag == b.Tag && c.Kind == PayloadKind.Delete && b.Kind != PayloadKind.Delete);
                    ref Candidate loser = ref newer ? ref b : ref c;
                    result.Superseded++;
                    (loser.Kind == PayloadKind.Delete ? result.FreeSecond : result.FreeFirst).Add(loser.Offset);
                    if (newer)
                    {
                        best = Locator(l, i);
                    }
                }
            }

            foreach (long at in winners.Values)
            {
                ref Candidate w = ref Locate(lists, at);
                if (w.Kind == PayloadKind.Delete)
                {
                    result.Cancelled++;
                    result.FreeSecond.Add(w.Offset);
                }
                else
                {
                    CollectionsMarshal.GetValueRefOrAddDefault(result.LiveByType, w.TypeId, out _)++;
                }
            }

            results[p] = result;
        })), partitions);

        foreach (PartitionResult result in results)
        {
            if (result.TypeConflict is { } conflict)
            {
                // Before anything of the resolution is written.
                ThrowHelper.ThrowHeapFile(HeapFileError.Corrupt, $"Cannot open heap file '{heap.File.Path}': the payloads at 0x{conflict.First:X} (type id {conflict.FirstType}) and 0x{conflict.Second:X} (type id {conflict.SecondType}) carry one uid ({conflict.Uid}), which no crash leaves (a copy keeps its payload's type id): a block of another heap file, or a damaged header that passes its check. Resolving them would free a healthy payload. Restore the file from a copy.");
            }
        }

        // Superseded and cancelled payloads are freed durably before any anti-payload is: an anti-payload whose free
        // became durable first would let the payload it cancels come back at the next recovery.
        if ((_faults & DurabilityFaults.KeepCancelledPayloads) == 0)
        {
            // (The broken control frees the anti-payloads first.)
            bool unordered = (_faults & DurabilityFaults.FreeAntiPayloadsWithoutOrdering) != 0;
            FreeDurably(heap, results, first: !unordered, partitions);
            FreeDurably(heap, results, first: unordered, partitions);

            // The frees went to the caches of the loop's threads, the first of them its own thread, which has ended (see
            // InterruptShield.RunToItsEnd): their blocks join the pools now, not at the advancer's next cycle.
            heap.ReleaseExitedThreadCaches();
        }

        // The live payloads: one list per type id, sized once, into which each partition writes its winners at its own
        // place, in parallel (partition lists merged afterwards cost a serial copy of every payload).
        long live = 0;
        var totals = new Dictionary<int, int>();
        foreach (PartitionResult result in results)
        {
            report.Superseded += result.Superseded;
            report.Cancelled += result.Cancelled;
            foreach ((int typeId, int count) in result.LiveByType)
            {
                CollectionsMarshal.GetValueRefOrAddDefault(totals, typeId, out _) += count;
            }
        }

        // Filled once per heap, by this or HandOver (the constructor's recovery): nothing to append to.
        Debug.Assert(_recovered.Count == 0, "the recovered payloads are handed over once");
        foreach ((int typeId, int count) in totals)
        {
            _recovered[typeId] = new List<RecoveredPayload>(count);
        }

        var starts = new Dictionary<int, int>[partitions];
        for (int p = 0; p < partitions; p++)
        {
            starts[p] = new Dictionary<int, int>();
            foreach ((int typeId, int count) in results[p].LiveByType)
            {
                List<RecoveredPayload> payloads = _recovered[typeId];
                starts[p][typeId] = payloads.Count;
                CollectionsMarshal.SetCount(payloads, payloads.Count + count);
                live += count;
            }
        }

        InterruptShield.RunToItsEnd(bodies => Parallel.For(0, partitions, new ParallelOptions { MaxDegreeOfParallelism = partitions }, bodies.Guard<int>(p =>
        {
            Dictionary<int, int> next = starts[p];
            foreach (long at in results[p].Winners.Values)
            {
                ref Candidate w = ref Locate(lists, at);
                if (w.Kind != PayloadKind.Delete)
                {
                    ref int slot = ref CollectionsMarshal.GetValueRefOrNullRef(next, w.TypeId);
                    CollectionsMarshal.AsSpan(_recovered[w.TypeId])[slot++] = new RecoveredPayload(new PayloadRef(w.Offset), new PayloadHeader(w.Uid, w.Tag, w.Kind, w.Size, w.TypeId));
                }
            }
        })), partitions);

        report.Live = live;
    }

    private void FreeDurably(PersistentHeap heap, PartitionResult[] results, bool first, int parallelism)
    {
        bool any = false;
        foreach (PartitionResult result in results)
        {
            any |= (first ? result.FreeFirst : result.FreeSecond).Count != 0;
        }

        if (!any)
        {
            return;
        }

        InterruptShield.RunToItsEnd(bodies => Parallel.For(0, results.Length, new ParallelOptions { MaxDegreeOfParallelism = parallelism }, bodies.Guard<int>(p =>
        {
            List<long> offsets = first ? results[p].FreeFirst : results[p].FreeSecond;
            foreach (long offset in offsets)
            {
                heap.FreeForOwner(new PayloadRef(offset));
                if (!_pageWriteBack)
                {
                    heap.WriteBackHeader(new PayloadRef(offset));
                }
            }

            // The fence orders this thread's write-backs; each partition fences its own.
            if (!_pageWriteBack && offsets.Count != 0)
            {
                heap.Fence();
            }
        })), parallelism);

        var freed = new List<long>();
        foreach (PartitionResult result in results)
        {
            freed.AddRange(first ? result.FreeFirst : result.FreeSecond);
        }

        if (_pageWriteBack && _domain.WritesBackByCopy)
        {
            // A private mapping copies whole ranges: the freed headers only, merged into runs per page.
            WriteBackRuns.WriteBackHeadersAndFence(_domain, CollectionsMarshal.AsSpan(freed));
        }
        else if (_pageWriteBack)
        {
            _domain.PersistOwned(0, heap.File.Size);
        }
    }

    private readonly struct Candidate
    {
        internal Candidate(long offset, long uid, long tag, PayloadKind kind, int typeId, int size)
        {
            Offset = offset;
            Uid = uid;
            Tag = tag;
            Kind = kind;
            TypeId = typeId;
            Size = size;
        }

        internal long Offset { get; }

        internal long Uid { get; }

        internal long Tag { get; }

        internal PayloadKind Kind { get; }

        internal int TypeId { get; }

        internal int Size { get; }
    }

    /// <summary>A candidate's place in the scanning threads' lists: the list in the high half, the index in the low.</summary>
    private static long Locator(int list, int index) => ((long)list << 32) | (uint)index;

    private static ref Candidate Locate(List<Candidate>[] lists, long locator) =>
        ref CollectionsMarshal.AsSpan(lists[(int)(locator >> 32)])[(int)locator];

    private sealed class PartitionResult
    {
        internal PartitionResult(int capacity) => Winners = new Dictionary<long, long>(capacity);

        /// <summary>Each uid's winning candidate (see <see cref="Locator"/>), in the order the uids were first seen.</summary>
        internal Dictionary<long, long> Winners { get; }

        internal List<long> FreeFirst { get; } = new();

        internal List<long> FreeSecond { get; } = new();

        /// <summary>The winners that are payloads (not anti-payloads), counted per type id.</summary>
        internal Dictionary<int, int> LiveByType { get; } = new();

        internal long Superseded;

        internal long Cancelled;

        /// <summary>The first uid found under two type ids, if any (see Resolve).</summary>
        internal (long First, int FirstType, long Second, int SecondType, long Uid)? TypeConflict;
    }
}
