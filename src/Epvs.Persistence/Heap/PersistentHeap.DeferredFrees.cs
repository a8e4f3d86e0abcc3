using System;
using System.Collections.Generic;
using System.Numerics;
using System.Runtime.InteropServices;
using System.Threading;

namespace Epvs.Persistence;

// Deferred frees for a BufferedDurableHeap: a freed small block is parked, untouched, with the other
// pending frees of its segment; a sweep later takes the segments with the most pending frees, marks those free, makes
// the frees durable — an entry per block in the sweep log (SweepLog.cs), written back and fenced; the blocks' headers
// when the heap has no log — and only then hands the blocks out again, in address order.
// Why. A version's frees fall on random pages of the heap. Writing each version's frees back as they happen costs
// one cache-line flush or one dirty page (and, through the page cache, a write-protect fault) per free, every version;
// swept densest segment first, the frees cost 16 bytes each in the sweep log (format 10; before it, each page was
// written once for all the frees it collected), and the blocks handed out next lie together, so a version's new
// payloads fill a few runs of pages instead of one page each.
// Safety. A pending block keeps its durable image (its old, sealed payload) until the sweep makes its free durable,
// and is never handed out before that (the invariant reclamation had before: a reuse never reaches the file over an
// old seal that recovery would take for live, or a reuse torn over it for damage). Its replacement is durable already,
// so after a crash recovery finds both copies of the uid and keeps the newer. An anti-payload may be freed only once every older copy of its uid is durably free:
// FlushPendingFrees (all of them) comes first.
// Threads. The bitmaps and counters are guarded by _pendingGate. A sweep takes its blocks off the
// bitmaps under it, then marks them, writes them back, fences and hands them out outside it (counted in
// _sweepsInFlight), so that parking frees and other sweeps — an allocating thread's, when no block of its
// class is ready — go on meanwhile: a sweep of a stocking took 20–30 ms through the page cache, and a writer that waited
// for it inside its operation held up the next version transition as long. FlushPendingFrees waits for
// the sweeps taken before its own too, since their blocks are neither parked nor durably free until they end. Sweeps run on slow
// paths only: the stocking (the stocker thread, or the advancer's cycle), an allocating thread when no block is ready,
// and under the segment gate when the heap cannot grow and gives segments back to the free list (lock order: the
// segment gate, then this one).
public sealed unsafe partial class PersistentHeap
{
    private readonly object _pendingGate = new();

    /// <summary>Per segment, a bit per block of its class: set while the block is parked (allocated on the segment's first parked free, kept).</summary>
    private ulong[]?[] _pendingBits = Array.Empty<ulong[]?>();

    /// <summary>Per segment, how many of its blocks are parked (the sweep takes the densest segments first).</summary>
    private int[] _pendingCounts = Array.Empty<int>();
    private readonly long[] _pendingByClass = new long[SizeClasses.Count];

    /// <summary>Per class, the blocks in sweeps in flight: taken off the bitmaps, not yet handed out (under <see cref="_pendingGate"/>).</summary>
    private readonly long[] _inFlightByClass = new long[SizeClasses.Count];
    private long _pendingBlocks;
    private long _pendingBytes;

    /// <summary>Why a sweep failed after it had taken blocks off the pending lists; every later sweep then throws (fail-stop). Under <see cref="_pendingGate"/>.</summary>
    private Exception? _sweepFailure;

    /// <summary>
    /// The tickets of the sweeps that took their blocks off the bitmaps and have not ended yet (under
    /// <see cref="_pendingGate"/>, which is pulsed when one ends). A thread waits only for the sweeps taken before its
    /// look (<see cref="WaitForSweepsTakenBy"/>): waiting for none to be in flight could wait for ever while other
    /// threads keep sweeping.
    /// </summary>
    private readonly SortedSet<long> _sweepsInFlight = new();

    /// <summary>The last ticket handed to a sweep (under <see cref="_pendingGate"/>).</summary>
    private long _lastSweepTicket;

    /// <summary>Sweeps that ended, handed out or failed (under <see cref="_pendingGate"/>; tests).</summary>
    private long _sweepsEnded;

    /// <summary>Sweeps that ended since the heap opened (tests).</summary>
    internal long SweepsEndedForTesting
    {
        get
        {
            using (InterruptShield.Hold(_pendingGate))
            {
                return _sweepsEnded;
            }
        }
    }

    /// <summary>The sweep's lock (tests hold it to make a sweep's end wait).</summary>
    internal object PendingGateForTesting => _pendingGate;

    /// <summary>Test hook: runs inside a sweep after its frees are marked and before they are written back (the window in which an early reuse would race the free to the file), outside the sweep's lock. May allocate from the pools only when they have blocks (an allocation that needs a segment takes the segment gate, which a releasing thread holds while it waits for this sweep; and one that finds no block and no free segment waits for this sweep, which holds blocks of its class); must not flush (a flush waits for this sweep).</summary>
    internal Action? AfterSweepMarkedForTesting { get; set; }

    /// <summary>Test hook: runs on an allocating thread after a round of its refill sweep (<see cref="TrySweepForRefill"/>), before it takes a batch from the pool.</summary>
    internal Action? AfterRefillSweepForTesting { get; set; }

    /// <summary>Test hook: runs on an allocating thread whose refill (<see cref="TrySweepForRefill"/>) is about to wait for the sweeps in flight.</summary>
    internal Action? BeforeRefillWaitsForSweepsForTesting { get; set; }

    /// <summary>
    /// How many rounds an allocating thread whose pool is empty sweeps for itself (<see cref="TrySweepForRefill"/>) while
    /// other threads take the swept blocks first, before it takes the heap-full path.
    /// </summary>
    private const int RefillSweepRounds = 4;

    /// <summary>Small blocks freed but parked for the sweep: not marked free yet, not handed out (approximate while the advancer runs).</summary>
    internal long PendingFreeBlocks => System.Threading.Volatile.Read(ref _pendingBlocks);

    /// <summary>Bytes of the blocks parked for the sweep (approximate while the advancer runs).</summary>
    internal long PendingFreeBytes => System.Threading.Volatile.Read(ref _pendingBytes);

    /// <summary>
    /// Frees the blocks at <paramref name="offsets"/>: a small block is parked for the sweep (<see cref="SweepPendingFrees(long)"/>),
    /// which marks it free, makes the free durable and hands it out again; a large block is left to the caller.
    /// </summary>
    /// <remarks>
    /// A parked block is one bit in its segment's bitmap (no read of the block, one store into a bitmap that takes 1
    /// bit per block), so the sweep finds a segment's blocks in address order without sorting them.
    /// </remarks>
    /// <param name="offsets">Allocated blocks, none freed yet.</param>
    /// <param name="count">How many of <paramref name="offsets"/> to free.</param>
    /// <param name="large">Receives the large blocks, left allocated, for the caller to free the eager way (mark, write back, fence, release).</param>
    /// <exception cref="InvalidOperationException">A block was parked already (a double free): every other block is
    /// parked, that one is not parked again.</exception>
    internal void DeferFrees(long[] offsets, int count, List<long> large)
    {
        _file.EnterOperation();
        try
        {
            ThreadCache cache = _caches.Value!;
            using (InterruptShield.Hold(_pendingGate))
            {
                Span<long> parkedByClass = stackalloc long[SizeClasses.Count];
                long blocks = 0;
                long bytes = 0;
                int doubleFrees = 0;
                long firstDoubleFree = 0;
                try
                {
                    for (int i = 0; i < count; i++)
                    {
                        long offset = offsets[i];
                        (long segment, ulong descriptor) = Locate(new PayloadRef(offset));
                        if (HeapLayout.DescriptorRole(descriptor) != HeapLayout.RoleSmall)
                        {
                            large.Add(offset);
                            continue;
                        }

                        int cls = (int)HeapLayout.DescriptorPayload(descriptor);
                        uint index = SizeClasses.BlockIndex((uint)(offset - SegmentStart(segment)), cls);
                        ulong[]?[] bitmaps = _pendingBits;
                        ulong[]? bits = (ulong)segment < (ulong)bitmaps.Length ? bitmaps[segment] : null;
                        if (bits is null || (index >> 6) >= (uint)bits.Length)
                        {
                            bits = GrowPendingBits(segment, cls);
                        }

                        ref ulong word = ref bits[index >> 6];
                        ulong bit = 1UL << (int)(index & 63);
                        if ((word & bit) != 0)
                        {
                            firstDoubleFree = doubleFrees++ == 0 ? offset : firstDoubleFree;
                            continue;
                        }

                        word |= bit;
                        _pendingCounts[segment]++;
                        int blockSize = SizeClasses.BlockSizes[cls];
                        cache.LiveBlocks--;
                        cache.LiveBytes -= blockSize;
                        parkedByClass[cls]++;
                        blocks++;
                        bytes += blockSize;
                    }
                }
                finally
                {
                    // Counted even when the loop fails part way (a bitmap that could not grow): the bits set so far are
                    // parked blocks, and the sweep relies on the counters to find them.
                    // Volatile.Write: the counters are read without the lock (statistics, the refill's check); atomicity only.
                    for (int cls = 0; cls < parkedByClass.Length; cls++)
                    {
                        if (parkedByClass[cls] != 0)
                        {
                            System.Threading.Volatile.Write(ref _pendingByClass[cls], _pendingByClass[cls] + parkedByClass[cls]);
                        }
                    }

                    System.Threading.Volatile.Write(ref _pendingBlocks, _pendingBlocks + blocks);
                    System.Threading.Volatile.Write(ref _pendingBytes, _pendingBytes + bytes);
                }

                if (doubleFrees != 0)
                {
                    ThrowHelper.ThrowInvalidOperation($"{doubleFrees} block(s) were parked for the sweep twice (a double free), the first at offset {firstDoubleFree}; each was parked once.");
                }
            }
        }
        finally
        {
            _file.ExitOperation();
        }
    }

    /// <summary>Test hook: runs before a segment's pending-free bitmap is created or grown (with the segment; a throw stands for a failed allocation).</summary>
    internal Action<long>? BeforePendingBitsGrowForTesting { get; set; }

    /// <summary>
    /// Whether <paramref name="block"/> is parked for the sweep (reclaimed, not yet freed). Read without the sweep's lock:
    /// a bit set before something the caller synchronized with is seen (BufferedDurableHeap forgets a retirement's claim
    /// only after parking it); the sweep frees a block's header after it clears its bit, so a block in between reads as
    /// neither parked nor free.
    /// </summary>
    internal bool IsParked(PayloadRef block)
    {
        (long segment, ulong descriptor) = Locate(block);
        if (HeapLayout.DescriptorRole(descriptor) != HeapLayout.RoleSmall)
        {
            return false;
        }

        int cls = (int)HeapLayout.DescriptorPayload(descriptor);
        uint index = SizeClasses.BlockIndex((uint)(block.Offset - SegmentStart(segment)), cls);
        ulong[]?[] bitmaps = Volatile.Read(ref _pendingBits);
        ulong[]? bits = (ulong)segment < (ulong)bitmaps.Length ? Volatile.Read(ref bitmaps[segment]) : null;
        return bits is not null && (index >> 6) < (uint)bits.Length && (Volatile.Read(ref bits[index >> 6]) & (1UL << (int)(index & 63))) != 0;
    }

    /// <summary>
    /// The pending-free bitmap of <paramref name="segment"/>, a small segment of class <paramref name="cls"/>, made long
    /// enough for that class (under <see cref="_pendingGate"/>): created on the segment's first parked free, and grown,
    /// its bits kept, when the segment was formatted again for a class with more blocks.
    /// </summary>
    private ulong[] GrowPendingBits(long segment, int cls)
    {
        BeforePendingBitsGrowForTesting?.Invoke(segment);
        if (segment >= _pendingBits.Length)
        {
            int length = (int)Math.Max(segment + 1, _pendingBits.Length * 2L);
            Array.Resize(ref _pendingBits, length);
            Array.Resize(ref _pendingCounts, length);
        }

        int words = (SizeClasses.BlocksPerSegment[cls] + 63) / 64;
        if (_pendingBits[segment] is not { } bits || bits.Length < words)
        {
            Array.Resize(ref _pendingBits[segment], words);
        }

        return _pendingBits[segment]!;
    }

    /// <summary>
    /// Makes the pending frees of the densest segments durable and hands their blocks out (in address order), until at
    /// least <paramref name="minimumBlocks"/> blocks were handed out (<see cref="long.MaxValue"/>: every pending free).
    /// </summary>
    /// <returns>How many blocks were handed out.</returns>
    internal long SweepPendingFrees(long minimumBlocks) => SweepPendingFrees(minimumBlocks, -1);

    /// <summary>Like <see cref="SweepPendingFrees(long)"/>, for the segments of class <paramref name="onlyClass"/> only (-1: every class).</summary>
    internal long SweepPendingFrees(long minimumBlocks, int onlyClass)
    {
        // Run to its end on the caller's thread too (a thread interrupted here used to leave the sweep failed for good).
        using InterruptShield.Scope shield = InterruptShield.Enter();
        _file.EnterOperation();
        try
        {
            Sweep? sweep;
            long swept = 0;
            long takenBefore;
            using (InterruptShield.Hold(_pendingGate))
            {
                sweep = TakeSweepLocked(minimumBlocks, onlyClass);
                takenBefore = _lastSweepTicket;
                if (sweep is not null && (_faults & HeapFaults.SweepUnderTheGate) != 0)
                {
                    swept = Complete(sweep);
                    sweep = null;
                }
            }

            swept += sweep is null ? 0 : Complete(sweep);
            if (minimumBlocks == long.MaxValue && (_faults & HeapFaults.FlushWithoutWaitingForSweepsInFlight) == 0)
            {
                // A flush: the blocks other sweeps took before this one are not durably free until they end. (Not the
                // sweeps taken after: they took frees parked after this flush began.)
                WaitForSweepsTakenBy(takenBefore);
            }

            return swept;
        }
        finally
        {
            _file.ExitOperation();
        }
    }

    /// <summary>
    /// An allocating thread found no block of class <paramref name="cls"/> ready: if enough of that class are parked,
    /// sweeps them (densest segments first) rather than take a free segment for the class, and refills the cache. It
    /// does not wait for another thread's sweep in flight (the stocker's, typically) while parked frees of the class are
    /// left for its own; when too few are (under two batches), it waits for the sweeps in flight if one holds blocks of
    /// its class, and takes their blocks (rather than take a free segment or grow the file while they are about to join
    /// the pool). Up to <see cref="RefillSweepRounds"/> rounds while other threads take the blocks from the pool first.
    /// </summary>
    /// <remarks>
    /// What it spares the thread is <see cref="TryRefill"/>'s heap-full path, inside its operation, where every version
    /// transition waits for it: a flush of every parked free, then the segments whose blocks all sit in a pool given
    /// back (which the next stocking formats again), or the file grown. Under two writers of batches on a heap that
    /// cannot grow, a refill whose swept blocks the other writer had taken first (this thread's sweep, ending, waits
    /// for the parking lock, which a cycle's reclamation holds for milliseconds) flushed 3.5 million parked frees
    /// there: 7 of 20 benchmark repetitions ran 17–45 cycles a second instead of about 50 (benchmark/RESULTS.md).
    /// </remarks>
    private bool TrySweepForRefill(ThreadCache cache, int cls)
    {
        int rounds = (_faults & HeapFaults.RefillSweepsOnce) != 0 ? 1 : RefillSweepRounds;
        for (int round = 0; round < rounds; round++)
        {
            if (SweepOnceForRefill(cache, cls, out bool swept))
            {
                return true;
            }

            if (!swept)
            {
                // Under two batches of the class parked and none in flight: another round would find the same.
                return false;
            }
        }

        return false;
    }

    /// <summary>
    /// One round of <see cref="TrySweepForRefill"/>. <paramref name="swept"/>: whether it swept or waited for the sweeps
    /// in flight (false: too few of the class were parked and none were about to join the pool).
    /// </summary>
    private bool SweepOnceForRefill(ThreadCache cache, int cls, out bool swept)
    {
        swept = false;

        // (The broken control decides before the lock, on a value a cycle's parking may change meanwhile.)
        bool once = (_faults & HeapFaults.RefillSweepsOnce) != 0;
        if (once && System.Threading.Volatile.Read(ref _pendingByClass[cls]) < 2 * BatchSize)
        {
            return false;
        }

        _file.EnterOperation();
        try
        {
            Sweep? sweep;
            long takenBefore;
            using (InterruptShield.Hold(_pendingGate))
            {
                if (TryTakeBatch(cache, cls))
                {
                    return true;
                }

                // Read under the lock: a cycle may have parked a version's frees while this thread waited for it (it
                // holds the lock for milliseconds). Waits only for a sweep in flight that holds blocks of this class.
                // (The broken control got here only with enough parked.)
                bool enough = once || _pendingByClass[cls] >= 2 * BatchSize;
                if (!enough && _inFlightByClass[cls] == 0)
                {
                    return false;
                }

                sweep = enough ? TakeSweepLocked(8 * BatchSize, cls) : null;
                takenBefore = _lastSweepTicket;
                if (sweep is not null && (_faults & HeapFaults.SweepUnderTheGate) != 0)
                {
                    Complete(sweep);
                    swept = true;
                    return TryTakeBatch(cache, cls);
                }
            }

            if (sweep is not null)
            {
                Complete(sweep);
                CountAllocatorRefill();
            }
            else
            {
                BeforeRefillWaitsForSweepsForTesting?.Invoke();
                WaitForSweepsTakenBy(takenBefore);
            }

            swept = true;
        }
        finally
        {
            _file.ExitOperation();
        }

        AfterRefillSweepForTesting?.Invoke();
        return TryTakeBatch(cache, cls);
    }

    /// <summary>Makes every pending free durable and hands the blocks out (before an anti-payload is freed, and at a clean shutdown).</summary>
    internal void FlushPendingFrees() => SweepPendingFrees(long.MaxValue);

    /// <summary>A sweep's blocks, taken off the bitmaps (in address order) and grouped by segment: see <see cref="Complete"/>.</summary>
    private sealed record Sweep(List<long> Offsets, List<(long Segment, int Start, int Count)> Segments, long Ticket, long[] ByClass);

    /// <summary>
    /// Under <see cref="_pendingGate"/>: takes the parked blocks of the densest segments (of class
    /// <paramref name="onlyClass"/>, or of every class for -1) off the bitmaps, at least <paramref name="minimumBlocks"/>
    /// of them (<see cref="long.MaxValue"/>: all), and counts the sweep in flight.
    /// </summary>
    /// <returns>The sweep for <see cref="Complete"/> (outside the gate), or null when nothing is parked.</returns>
    /// <exception cref="System.IO.IOException">An earlier sweep failed (fail-stop).</exception>
    private Sweep? TakeSweepLocked(long minimumBlocks, int onlyClass)
    {
        ThrowIfASweepFailed();
        if (_pendingBlocks == 0)
        {
            return null;
        }

        // The densest segments first (most blocks per page written back), then in address order for the write-back.
        bool all = minimumBlocks == long.MaxValue;
        var candidates = new List<(int Count, long Segment)>();
        for (long segment = 0; segment < _pendingCounts.Length; segment++)
        {
            if (_pendingCounts[segment] > 0 && (onlyClass < 0 || (int)HeapLayout.DescriptorPayload(_table[segment]) == onlyClass))
            {
                candidates.Add((_pendingCounts[segment], segment));
            }
        }

        if (!all)
        {
            candidates = DensestInAddressOrder(candidates, minimumBlocks);
        }

        long total = 0;
        foreach ((int pending, _) in candidates)
        {
            total += pending;
        }

        // Taken off the bitmaps first: a callback below (the test hook) may allocate, and an allocation may sweep. From
        // here on a failure leaves blocks taken but not handed out: it stops every later sweep (see above).
        var offsets = new List<long>((int)total);
        var swept = new List<(long Segment, int Start, int Count)>(candidates.Count);
        long[] byClass = new long[SizeClasses.Count];
        try
        {
            foreach ((int pending, long segment) in candidates)
            {
                int cls = (int)HeapLayout.DescriptorPayload(_table[segment]);
                int first = offsets.Count;
                TakeInAddressOrder(segment, cls, offsets);
                if (offsets.Count - first != pending)
                {
                    ThrowHelper.ThrowInvalidOperation($"Segment {segment} counted {pending} parked block(s), its bitmap {offsets.Count - first}.");
                }

                _pendingCounts[segment] = 0;
                // Volatile.Write: as in DeferFrees (read without the lock; atomicity only).
                System.Threading.Volatile.Write(ref _pendingByClass[cls], _pendingByClass[cls] - pending);
                System.Threading.Volatile.Write(ref _pendingBlocks, _pendingBlocks - pending);
                System.Threading.Volatile.Write(ref _pendingBytes, _pendingBytes - ((long)pending * SizeClasses.BlockSizes[cls]));
                _inFlightByClass[cls] += pending;
                byClass[cls] += pending;
                swept.Add((segment, first, pending));
            }
        }
        catch (Exception e)
        {
            _sweepFailure = e;
            throw;
        }

        if (offsets.Count == 0)
        {
            return null;
        }

        var sweep = new Sweep(offsets, swept, _lastSweepTicket + 1, byClass);
        _sweepsInFlight.Add(sweep.Ticket);
        _lastSweepTicket = sweep.Ticket;
        return sweep;
    }

    /// <summary>
    /// Outside <see cref="_pendingGate"/>: marks the sweep's blocks free, writes them back, fences and hands them out;
    /// then ends the sweep in flight. A failure stops every later sweep (fail-stop).
    /// </summary>
    /// <returns>How many blocks were handed out.</returns>
    private long Complete(Sweep sweep)
    {
        Exception? failure = null;
        try
        {
            return MarkWriteBackAndHandOut(sweep.Offsets, sweep.Segments);
        }
        catch (Exception e)
        {
            failure = e;
            throw;
        }
        finally
        {
            EndSweep(sweep, failure);
        }
    }

    /// <summary>
    /// Ends a sweep in flight: records its failure (if any) and uncounts it in one critical section, entered
    /// uninterruptibly (a Thread.Interrupt here used to leave the sweep counted for ever, or its failure unrecorded).
    /// </summary>
    private void EndSweep(Sweep sweep, Exception? failure)
    {
        using InterruptShield.Scope shield = InterruptShield.Enter();
        InterruptShield.Lock(_pendingGate);
        try
        {
            if (failure is not null)
            {
                _sweepFailure ??= failure;
            }

            _sweepsInFlight.Remove(sweep.Ticket);
            for (int cls = 0; cls < sweep.ByClass.Length; cls++)
            {
                _inFlightByClass[cls] -= sweep.ByClass[cls];
            }

            _sweepsEnded++;
            System.Threading.Monitor.PulseAll(_pendingGate);
        }
        finally
        {
            System.Threading.Monitor.Exit(_pendingGate);
        }
    }

    /// <summary>
    /// Waits until every sweep whose ticket is at most <paramref name="lastTicket"/> has ended; throws if a sweep failed
    /// (its frees may not be durable).
    /// </summary>
    private void WaitForSweepsTakenBy(long lastTicket)
    {
        using (InterruptShield.Hold(_pendingGate))
        {
            // (The broken control waits for every sweep in flight.)
            long upTo = (_faults & HeapFaults.WaitForEverySweepInFlight) != 0 ? long.MaxValue : lastTicket;
            while (_sweepsInFlight.Count != 0 && _sweepsInFlight.Min <= upTo)
            {
                InterruptShield.Wait(_pendingGate, Timeout.InfiniteTimeSpan);
            }

            ThrowIfASweepFailed();
        }
    }

    /// <summary>Under <see cref="_pendingGate"/>.</summary>
    private void ThrowIfASweepFailed()
    {
        if (_sweepFailure is { } failure)
        {
            // The failed sweep's blocks are marked free in memory but their frees may not be durable: freeing anything
            // that relies on them (an anti-payload) could bring a deleted key back after a crash. Stop instead.
            throw new System.IO.IOException($"An earlier sweep of deferred frees failed ({failure.Message}); no more frees can be made durable.", failure);
        }
    }

    /// <summary>
    /// The densest of <paramref name="candidates"/> (in address order, each with its count of parked blocks), as few as
    /// hold at least <paramref name="minimumBlocks"/> blocks together (all of them when they hold fewer), in address
    /// order; of segments with equal counts at the threshold, the lowest addresses. A histogram of the counts (at most
    /// the blocks of a segment) finds the threshold in one pass over the segments, where sorting them by count took
    /// O(n log n) delegate comparisons under the sweep's lock, at every stocking's sweep of a large heap.
    /// </summary>
    internal static List<(int Count, long Segment)> DensestInAddressOrder(List<(int Count, long Segment)> candidates, long minimumBlocks)
    {
        int max = 0;
        foreach ((int count, _) in candidates)
        {
            max = Math.Max(max, count);
        }

        // Blocks held by the segments of each count.
        var blocksByCount = new long[max + 1];
        foreach ((int count, _) in candidates)
        {
            blocksByCount[count] += count;
        }

        // The threshold: every segment denser than it is taken, and they hold fewer than the minimum.
        long denser = 0;
        int threshold = max;
        while (threshold > 0 && denser + blocksByCount[threshold] < minimumBlocks)
        {
            denser += blocksByCount[threshold];
            threshold--;
        }

        var chosen = new List<(int Count, long Segment)>();
        long taken = denser;
        foreach ((int count, long segment) candidate in candidates)
        {
            if (candidate.count > threshold)
            {
                chosen.Add(candidate);
            }
            else if (candidate.count == threshold && threshold > 0 && taken < minimumBlocks)
            {
                chosen.Add(candidate);
                taken += candidate.count;
            }
        }

        return chosen;
    }

    /// <summary>Appends the parked blocks of <paramref name="segment"/> to <paramref name="offsets"/> in address order and clears its bitmap.</summary>
    private void TakeInAddressOrder(long segment, int cls, List<long> offsets)
    {
        long blockSize = SizeClasses.BlockSizes[cls];
        long start = SegmentStart(segment);
        ulong[] bits = _pendingBits[segment]!;
        for (int word = 0; word < bits.Length; word++)
        {
            for (ulong set = bits[word]; set != 0; set &= set - 1)
            {
                offsets.Add(start + (((word * 64L) + BitOperations.TrailingZeroCount(set)) * blockSize));
            }

            bits[word] = 0;
        }
    }

    /// <summary>Called by a sweep with the blocks it has just marked free, before it hands any of them out (a buffered
    /// heap's claims of retirements are kept until then: see BufferedDurableHeap.CallerRetirements.cs).</summary>
    internal Action<List<long>>? BlocksFreed { get; set; }

    /// <summary>Test hook: runs in a sweep once it has taken its blocks (their parked bits cleared), before it marks them free.</summary>
    internal Action? SweepTakenForTesting { get; set; }

    private long MarkWriteBackAndHandOut(List<long> blocks, List<(long Segment, int Start, int Count)> swept)
    {
        SweepTakenForTesting?.Invoke();
        Span<long> offsets = CollectionsMarshal.AsSpan(blocks);
        SweepLog? log = _sweepLog;
        ulong[]? commits = log is null ? null : System.Buffers.ArrayPool<ulong>.Shared.Rent(offsets.Length);
        ulong[]? epochWords = log is null ? null : System.Buffers.ArrayPool<ulong>.Shared.Rent(offsets.Length);
        try
        {
            for (int i = 0; i < offsets.Length; i++)
            {
                // Each mark is a compare-and-swap, whose fence would wait for the next block's cache miss: the blocks a few
                // places ahead are prefetched (a prefetch is not held back by the fence), so the misses overlap.
                if (i + PrefetchDistance < offsets.Length)
                {
                    Prefetch(_base + offsets[i + PrefetchDistance]);
                }

                // Marked only now: through the page cache, the first store to a page written back earlier takes a
                // write-protect fault, so marking a segment's frees together costs one per page, not one per free.
                // The log keeps what the header held (its image in the file, unless a free there was durable already).
                ulong epochWord = *(ulong*)(_base + offsets[i] + HeapLayout.EpochOffset);
                MarkFreeCore(new PayloadRef(offsets[i]), out ulong commit);
                if (log is not null)
                {
                    commits![i] = commit;
                    epochWords![i] = epochWord;
                }
            }

            return WriteBackAndHandOut(blocks, swept, log, commits, epochWords);
        }
        finally
        {
            if (log is not null)
            {
                System.Buffers.ArrayPool<ulong>.Shared.Return(commits!);
                System.Buffers.ArrayPool<ulong>.Shared.Return(epochWords!);
            }
        }
    }

    /// <summary>
    /// Makes the sweep's frees (marked in the working image) durable — through the log when the heap has one, else in
    /// the blocks' headers — and then hands the blocks out.
    /// </summary>
    private long WriteBackAndHandOut(List<long> blocks, List<(long Segment, int Start, int Count)> swept, SweepLog? log, ulong[]? commits, ulong[]? epochWords)
    {
        Span<long> offsets = CollectionsMarshal.AsSpan(blocks);

        // Free now, not handed out yet: whoever keeps something per block until it is free forgets it here.
        BlocksFreed?.Invoke(blocks);

        // (The broken controls hand the blocks out before their frees are durable, or with their frees never written.)
        bool inMemory = (_faults & HeapFaults.SweepFreesStayInMemory) != 0;
        bool early = inMemory || (_faults & HeapFaults.HandOutSweptFreesEarly) != 0;
        if (early)
        {
            HandOut(offsets, swept);
        }

        AfterSweepMarkedForTesting?.Invoke();
        if (inMemory)
        {
            if ((_faults & HeapFaults.SweepFencesWithoutFrees) != 0)
            {
                _file.Domain.FenceOwned();
            }

            return offsets.Length;
        }

        if (log is not null)
        {
            // A few bytes per block, written back and fenced: the frees are durable, the blocks' pages untouched.
            log.Append(offsets, commits.AsSpan(0, offsets.Length), epochWords.AsSpan(0, offsets.Length));
        }
        else
        {
            // Segments are in address order, so through the page cache the headers merge into runs of pages.
            var runs = new WriteBackRuns(_file.Domain);
            foreach (long offset in offsets)
            {
                runs.Add(offset, HeapLayout.HeaderSize);
            }

            runs.Flush();
            _file.Domain.FenceOwned();
        }

        if (!early)
        {
            // The frees (free words and empty marks) are durable: the blocks can be reused.
            HandOut(offsets, swept);
        }

        return offsets.Length;
    }

    private void HandOut(Span<long> offsets, List<(long Segment, int Start, int Count)> swept)
    {
        foreach ((long segment, int start, int count) in swept)
        {
            // Pushed highest first: the pool pops the lowest addresses first.
            Span<long> blocks = offsets.Slice(start, count);
            blocks.Reverse();
            PushFree((int)HeapLayout.DescriptorPayload(_table[segment]), blocks);
        }
    }
}
