using System;
using System.Threading;

namespace Epvs.Persistence;

/// <summary>How a <see cref="BufferedDurableHeap"/> persists and recovers.</summary>
public sealed class BufferedDurableHeapOptions
{
    /// <summary>Buffered (default), strict or transient; see <see cref="DurabilityMode"/>.</summary>
    public DurabilityMode Mode { get; set; } = DurabilityMode.Buffered;

    /// <summary>
    /// How often the background advancer moves the version (and so the durable frontier). Default 20 ms; about one
    /// period of completed operations is at risk at a crash. A period in which the heap is idle — no operation open,
    /// nothing left to write back or reclaim (a replaced or deleted payload takes two more advances), no sweep to record,
    /// no exited thread to forget, no <see cref="BufferedDurableHeap.SyncAsync"/> waiting — moves nothing and writes
    /// nothing to the file (<see cref="AdvancerStatistics.IdlePeriods"/>); the first write after it is made durable at
    /// the next period as usual. <see cref="Timeout.InfiniteTimeSpan"/> starts no
    /// background advancer: versions then move only in <see cref="BufferedDurableHeap.Sync(TimeSpan)"/> and
    /// <see cref="BufferedDurableHeap.AdvanceVersion(TimeSpan)"/>. At most <see cref="int.MaxValue"/> milliseconds.
    /// </summary>
    public TimeSpan AdvancePeriod { get; set; } = TimeSpan.FromMilliseconds(20);

    /// <summary>
    /// Back-pressure on the durability lag (<see cref="DurabilityMode.Buffered"/> with a background advancer): when a
    /// version has run longer than this (from its start, or from the advancer's last look that found the heap idle, which
    /// dates the version afresh: see <see cref="AdvancePeriod"/>) — writers produce faster than the advancer writes back, so its cycles overrun
    /// the period — a thread beginning an operation first runs the advance that ends it (one thread at a time; the other
    /// threads beginning operations meanwhile wait until the old version has ended, not for the advance's write-back). Writers then slow down to what the
    /// medium takes, instead of letting versions, and the time until an operation is durable, grow without bound. Null (the default): 1.25 × <see cref="AdvancePeriod"/>, which a background
    /// advancer keeping to its period never reaches. <see cref="Timeout.InfiniteTimeSpan"/>: no bound (throughput
    /// first; the lag then grows with the overload). At most <see cref="int.MaxValue"/> milliseconds.
    /// </summary>
    public TimeSpan? MaxVersionAge { get; set; }

    /// <summary>How long <see cref="BufferedDurableHeap.Sync()"/> waits before it throws <see cref="TimeoutException"/>. Default 30 s.</summary>
    public TimeSpan SyncTimeout { get; set; } = TimeSpan.FromSeconds(30);

    /// <summary>
    /// Back-pressure: when replaced and deleted payloads waiting for reclamation (they are freed two versions later)
    /// exceed this many bytes, a thread beginning an operation first runs advances itself until they are freed, so a
    /// write rate the background advancer cannot keep up with (a starved advancer, a fast producer) slows down instead
    /// of filling the heap. 0 (the default) means an eighth of the heap's current size, at least 64 KiB.
    /// </summary>
    public long ReclaimBacklogLimit { get; set; }

    /// <summary>How many threads recovery uses at most to scan blocks and resolve payloads (the resolution uses no more than one per processor); default <see cref="Environment.ProcessorCount"/>.</summary>
    public int RecoveryParallelism { get; set; } = Environment.ProcessorCount;

    /// <summary>
    /// What recovery does with a damaged block (see <see cref="PersistentHeapOptions.SalvageDamagedBlocks"/>). False (the
    /// default): opening throws <see cref="HeapFileException"/> (<see cref="HeapFileError.Corrupt"/>, the blocks in
    /// <see cref="HeapFileException.DamagedBlocks"/>) and changes nothing. True: they are dropped and listed in
    /// <see cref="DurableRecoveryReport.DamagedBlocks"/>; the operations they held are lost. The file records the salvage before
    /// anything is freed, and the maps and queues resolve what it leaves (a key's older payload live again, a queue gap)
    /// when they are constructed, durably — at the salvaging open or any later one. Damage to the sweep log that its checks
    /// can tell from a torn append (a damaged batch with a valid one after it, a damaged lap word, or after a clean
    /// shutdown batches that end early) is salvaged too, and listed in
    /// <see cref="DurableRecoveryReport.DamagedSweepLogOffsets"/>; at the first open after a clean shutdown without loss
    /// (the saved state says which blocks are free).
    /// </summary>
    public bool SalvageDamagedBlocks { get; set; }

    /// <summary>Deliberate faults, for the tests' broken controls only.</summary>
    internal DurabilityFaults Faults { get; set; }

    /// <summary>Deliberate allocator faults, for the tests' broken controls only.</summary>
    internal HeapFaults HeapFaults { get; set; }

    /// <summary>Test hook: runs as the open starts the advancer's thread, after recovery (a throw stands for a thread the process cannot create).</summary>
    internal Action? StartingAdvancerForTesting { get; set; }

    /// <summary>Test hook: runs once the stocker's thread has started (<see cref="BufferedDurableHeap.StockerForTesting"/> of the argument), as the advancer's is about to start (a throw stands for an advancer thread the process cannot create).</summary>
    internal Action<BufferedDurableHeap>? StartingAdvancerThreadForTesting { get; set; }

    internal void Validate()
    {
        if (AdvancePeriod != Timeout.InfiniteTimeSpan && (AdvancePeriod <= TimeSpan.Zero || AdvancePeriod.TotalMilliseconds > int.MaxValue))
        {
            ThrowHelper.ThrowArgumentOutOfRange(nameof(AdvancePeriod), $"AdvancePeriod must be positive and at most int.MaxValue milliseconds (about 24.8 days), or Timeout.InfiniteTimeSpan for no background advancer, not {AdvancePeriod}.");
        }

        if (MaxVersionAge is { } age && age != Timeout.InfiniteTimeSpan && (age <= TimeSpan.Zero || age.TotalMilliseconds > int.MaxValue))
        {
            ThrowHelper.ThrowArgumentOutOfRange(nameof(MaxVersionAge), $"MaxVersionAge must be positive and at most int.MaxValue milliseconds (about 24.8 days), null (1.25 advance periods) or Timeout.InfiniteTimeSpan (no bound), not {age}.");
        }

        if (SyncTimeout != Timeout.InfiniteTimeSpan && (SyncTimeout <= TimeSpan.Zero || SyncTimeout.TotalMilliseconds > int.MaxValue))
        {
            ThrowHelper.ThrowArgumentOutOfRange(nameof(SyncTimeout), $"SyncTimeout must be positive and at most int.MaxValue milliseconds (about 24.8 days), or Timeout.InfiniteTimeSpan, not {SyncTimeout}.");
        }

        if (ReclaimBacklogLimit < 0)
        {
            ThrowHelper.ThrowArgumentOutOfRange(nameof(ReclaimBacklogLimit), $"ReclaimBacklogLimit must be 0 (automatic) or positive, not {ReclaimBacklogLimit}.");
        }

        if (RecoveryParallelism < 1)
        {
            ThrowHelper.ThrowArgumentOutOfRange(nameof(RecoveryParallelism), $"RecoveryParallelism must be at least 1, not {RecoveryParallelism}.");
        }

        if ((uint)Mode > (uint)DurabilityMode.Transient)
        {
            ThrowHelper.ThrowArgumentOutOfRange(nameof(Mode), $"{Mode} is not a durability mode.");
        }
    }
}
