using System;

namespace Epvs.Persistence;

/// <summary>
/// Where a <see cref="BufferedDurableHeap"/>'s advance cycles have spent their time since the heap opened: sealing each
/// finished version's blocks, writing them back (and persisting the frontier), and reclaiming (freeing what older versions
/// replaced, sweeping deferred frees). Read with <see cref="BufferedDurableHeap.GetAdvancerStatistics"/>; subtract two
/// readings for an interval. It also counts what the cycles cost the heap's writers: the times their operations were held
/// back at their start by the back-pressure (<see cref="BackPressureWaits"/>).
/// </summary>
/// <remarks>Each counter is read atomically, the set is not: a reading taken during a cycle may include some of that
/// cycle's phases and not others.</remarks>
public readonly struct AdvancerStatistics
{
    /// <summary>Creates a statistics value.</summary>
    /// <param name="cycles">Completed cycles that found a version to finish.</param>
    /// <param name="blocksWrittenBack">Blocks those cycles finished: written back by the cycle (<see cref="DurabilityMode.Buffered"/>) or by their operations (<see cref="DurabilityMode.Strict"/>), and sealed.</param>
    /// <param name="writeBackTime">Time spent writing back versions (in <see cref="DurabilityMode.Buffered"/> with their seals, under one fence) and persisting the frontier.</param>
    /// <param name="sealTime">Time spent sealing blocks: computing their checks (in <see cref="DurabilityMode.Strict"/>, also making the seals durable).</param>
    /// <param name="reclaimTime">Time spent reclaiming: deferring and sweeping frees, freeing anti-payloads.</param>
    /// <param name="allocatorRefills">Times an operation's thread found its size class's pool empty and formatted a segment or swept parked frees itself.</param>
    /// <param name="fenceTime">Of <paramref name="writeBackTime"/>, the time spent waiting on fences.</param>
    /// <param name="backPressureWaits">Times an operation's thread was held back at its start by the back-pressure.</param>
    /// <param name="backPressureTime">The time those threads were held back, summed over the threads.</param>
    /// <param name="idlePeriods">Periods in which the background advancer found nothing to advance, and wrote nothing.</param>
    public AdvancerStatistics(long cycles, long blocksWrittenBack, TimeSpan writeBackTime, TimeSpan sealTime, TimeSpan reclaimTime, long allocatorRefills, TimeSpan fenceTime, long backPressureWaits, TimeSpan backPressureTime, long idlePeriods)
    {
        Cycles = cycles;
        BlocksWrittenBack = blocksWrittenBack;
        WriteBackTime = writeBackTime;
        SealTime = sealTime;
        ReclaimTime = reclaimTime;
        AllocatorRefills = allocatorRefills;
        FenceTime = fenceTime;
        BackPressureWaits = backPressureWaits;
        BackPressureTime = backPressureTime;
        IdlePeriods = idlePeriods;
    }

    /// <summary>Completed cycles that found a version to finish.</summary>
    public long Cycles { get; }

    /// <summary>Blocks those cycles finished: written back by the cycle (<see cref="DurabilityMode.Buffered"/>) or by their operations (<see cref="DurabilityMode.Strict"/>), and sealed.</summary>
    public long BlocksWrittenBack { get; }

    /// <summary>Time spent writing back versions (in <see cref="DurabilityMode.Buffered"/> with their seals, under one fence) and persisting the frontier.</summary>
    public TimeSpan WriteBackTime { get; }

    /// <summary>Time spent sealing blocks: computing their checks (in <see cref="DurabilityMode.Strict"/>, also making the seals durable).</summary>
    public TimeSpan SealTime { get; }

    /// <summary>Time spent reclaiming: deferring and sweeping frees, freeing anti-payloads.</summary>
    public TimeSpan ReclaimTime { get; }

    /// <summary>
    /// Times an operation's thread found its size class's pool empty and formatted a segment or swept parked frees
    /// itself: a write-back and a fence inside the operation (through the page cache, an <c>fdatasync</c>), which the
    /// next version transition waits for. The stocker keeps the pools ahead of the demand, so under a steady load this
    /// stays near zero; it grows when the heap is nearly full, or when the demand outruns the stocking.
    /// </summary>
    public long AllocatorRefills { get; }

    /// <summary>
    /// Of <see cref="WriteBackTime"/>, the time the cycles spent waiting on their fences — the version's write-back and the
    /// frontier's (through the page cache, <c>fdatasync</c>: the medium's time, which grows with the pages a version
    /// dirtied; on persistent memory, a store fence).
    /// </summary>
    public TimeSpan FenceTime { get; }

    /// <summary>
    /// Times an operation's thread was held back at its start by the heap's back-pressure: the current version was older
    /// than <see cref="BufferedDurableHeapOptions.MaxVersionAge"/> (the thread ended it, or waited while another thread
    /// did), or the reclamation backlog was over its limit (the thread ran cycles to free it). Near zero while the cycles
    /// keep to their period; under writers faster than the cycles, this is how the heap slows them to its pace.
    /// </summary>
    public long BackPressureWaits { get; }

    /// <summary>The time the threads counted by <see cref="BackPressureWaits"/> were held back, summed over the threads (two threads held for 1 ms each count 2 ms).</summary>
    public TimeSpan BackPressureTime { get; }

    /// <summary>
    /// Periods in which the background advancer found the heap idle — no operation open, nothing left to write back or
    /// reclaim, no sweep to record, no exited thread to forget, no <see cref="BufferedDurableHeap.SyncAsync"/> waiting — and
    /// let the version run on instead of ending it: nothing is written to the file then (an idle heap used to write and
    /// fence its frontier every period). <see cref="BufferedDurableHeap.CurrentVersion"/> and
    /// <see cref="BufferedDurableHeap.DurableFrontier"/> stay where they are meanwhile; the first write after an idle
    /// stretch is ended at the next period as usual.
    /// </summary>
    public long IdlePeriods { get; }

    /// <summary>The counters accumulated since <paramref name="earlier"/> (an earlier reading of the same heap).</summary>
    /// <param name="earlier">The earlier reading.</param>
    /// <returns>This reading minus <paramref name="earlier"/>.</returns>
    public AdvancerStatistics Since(AdvancerStatistics earlier) =>
        new(Cycles - earlier.Cycles, BlocksWrittenBack - earlier.BlocksWrittenBack, WriteBackTime - earlier.WriteBackTime, SealTime - earlier.SealTime, ReclaimTime - earlier.ReclaimTime, AllocatorRefills - earlier.AllocatorRefills, FenceTime - earlier.FenceTime, BackPressureWaits - earlier.BackPressureWaits, BackPressureTime - earlier.BackPressureTime, IdlePeriods - earlier.IdlePeriods);

    /// <inheritdoc/>
    public override string ToString() =>
        $"cycles={Cycles} blocks={BlocksWrittenBack} write-back={WriteBackTime.TotalMilliseconds:0.0} ms seal={SealTime.TotalMilliseconds:0.0} ms reclaim={ReclaimTime.TotalMilliseconds:0.0} ms allocator-refills={AllocatorRefills} fences={FenceTime.TotalMilliseconds:0.0} ms back-pressure={BackPressureWaits} waits, {BackPressureTime.TotalMilliseconds:0.0} ms idle-periods={IdlePeriods}";
}
