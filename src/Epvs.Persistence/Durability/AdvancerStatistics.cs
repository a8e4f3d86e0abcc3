using System;

namespace Epvs.Persistence;

/// <summary>
/// Where a <see cref="BufferedDurableHeap"/>'s advance cycles have spent their time since the heap opened: sealing each
/// finished version's blocks, writing them back (and persisting the frontier), and reclaiming (freeing what older versions
/// replaced, sweeping deferred frees). Read with <see cref="BufferedDurableHeap.GetAdvancerStatistics"/>; subtract two
/// readings for an interval.
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
    public AdvancerStatistics(long cycles, long blocksWrittenBack, TimeSpan writeBackTime, TimeSpan sealTime, TimeSpan reclaimTime, long allocatorRefills)
    {
        Cycles = cycles;
        BlocksWrittenBack = blocksWrittenBack;
        WriteBackTime = writeBackTime;
        SealTime = sealTime;
        ReclaimTime = reclaimTime;
        AllocatorRefills = allocatorRefills;
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

    /// <summary>The counters accumulated since <paramref name="earlier"/> (an earlier reading of the same heap).</summary>
    /// <param name="earlier">The earlier reading.</param>
    /// <returns>This reading minus <paramref name="earlier"/>.</returns>
    public AdvancerStatistics Since(AdvancerStatistics earlier) =>
        new(Cycles - earlier.Cycles, BlocksWrittenBack - earlier.BlocksWrittenBack, WriteBackTime - earlier.WriteBackTime, SealTime - earlier.SealTime, ReclaimTime - earlier.ReclaimTime, AllocatorRefills - earlier.AllocatorRefills);

    /// <inheritdoc/>
    public override string ToString() =>
        $"cycles={Cycles} blocks={BlocksWrittenBack} write-back={WriteBackTime.TotalMilliseconds:0.0} ms seal={SealTime.TotalMilliseconds:0.0} ms reclaim={ReclaimTime.TotalMilliseconds:0.0} ms allocator-refills={AllocatorRefills}";
}
