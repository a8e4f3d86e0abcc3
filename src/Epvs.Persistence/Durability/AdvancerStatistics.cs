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
    public AdvancerStatistics(long cycles, long blocksWrittenBack, TimeSpan writeBackTime, TimeSpan sealTime, TimeSpan reclaimTime)
    {
        Cycles = cycles;
        BlocksWrittenBack = blocksWrittenBack;
        WriteBackTime = writeBackTime;
        SealTime = sealTime;
        ReclaimTime = reclaimTime;
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

    /// <summary>The counters accumulated since <paramref name="earlier"/> (an earlier reading of the same heap).</summary>
    /// <param name="earlier">The earlier reading.</param>
    /// <returns>This reading minus <paramref name="earlier"/>.</returns>
    public AdvancerStatistics Since(AdvancerStatistics earlier) =>
        new(Cycles - earlier.Cycles, BlocksWrittenBack - earlier.BlocksWrittenBack, WriteBackTime - earlier.WriteBackTime, SealTime - earlier.SealTime, ReclaimTime - earlier.ReclaimTime);

    /// <inheritdoc/>
    public override string ToString() =>
        $"cycles={Cycles} blocks={BlocksWrittenBack} write-back={WriteBackTime.TotalMilliseconds:0.0} ms seal={SealTime.TotalMilliseconds:0.0} ms reclaim={ReclaimTime.TotalMilliseconds:0.0} ms";
}
