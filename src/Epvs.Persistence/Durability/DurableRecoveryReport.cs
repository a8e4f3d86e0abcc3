using System;
using System.Collections.Generic;

namespace Epvs.Persistence;

/// <summary>What recovery found and did when a <see cref="BufferedDurableHeap"/> opened.</summary>
public sealed class DurableRecoveryReport
{
    internal DurableRecoveryReport()
    {
    }

    /// <summary>Whether the previous opener shut down in order.</summary>
    public bool WasCleanShutdown { get; internal set; }

    /// <summary>
    /// Whether recovery took the fast path: the allocator state saved at the previous clean shutdown was intact, so no
    /// block header was scanned (only the allocated blocks' headers were read and checked), no payload needed
    /// resolving and nothing was freed. False after a crash, and when the saved state was missing or rejected.
    /// </summary>
    public bool FastReopen { get; internal set; }

    /// <summary>After a clean shutdown, why the saved state was not used (and the heap was rescanned); null otherwise.</summary>
    public string? FastReopenRejection { get; internal set; }

    /// <summary>The persisted epoch clock found at open.</summary>
    public long PersistedClock { get; internal set; }

    /// <summary>The persisted durable frontier found at open.</summary>
    public long PersistedFrontier { get; internal set; }

    /// <summary>The cut recovery used: every payload tagged at or below it was kept (max of the frontier and clock − 2).</summary>
    public long RecoveredVersion { get; internal set; }

    /// <summary>Valid blocks the scan found: payloads and anti-payloads, including those <see cref="DroppedBeyondFrontier"/>.</summary>
    public long ScannedPayloads { get; internal set; }

    /// <summary>Blocks freed because their tag was beyond the recovered version (or 0: written without epochs).</summary>
    public long DroppedBeyondFrontier { get; internal set; }

    /// <summary>Blocks freed because a newer block of the same uid won: older copies of a payload, and the payloads (and any
    /// older anti-payloads) of a uid whose newest block is an anti-payload.</summary>
    public long Superseded { get; internal set; }

    /// <summary>Anti-payloads that won, each freed with the uid it deleted: one per deleted uid (the payloads it deleted
    /// count in <see cref="Superseded"/>).</summary>
    public long Cancelled { get; internal set; }

    /// <summary>
    /// File offsets (sorted) of the damaged blocks dropped because the heap opened with
    /// <see cref="BufferedDurableHeapOptions.SalvageDamagedBlocks"/>; without it, damage makes opening throw instead.
    /// When the file's sealed-frontier word is below its frontier (damaged, or a file written before each cycle sealed
    /// its version ahead of its frontier), every torn block counts as damaged: a damaged header of an unsealed durable
    /// version cannot be told from an interrupted allocation.
    /// </summary>
    public IReadOnlyList<long> DamagedBlocks { get; internal set; } = Array.Empty<long>();

    /// <summary>
    /// File offsets of the sweep log's damaged batches and lap words that recovery skipped because the heap opened with
    /// <see cref="BufferedDurableHeapOptions.SalvageDamagedBlocks"/>: a damaged lap word, a damaged batch with a valid
    /// one after it, or, after a clean shutdown, a half whose batches end before where the shutdown saved them ending
    /// (without salvage, opening throws there). When this open takes the clean shutdown's saved state nothing is lost: it
    /// says which blocks are free (<see cref="FastReopen"/> stays true). Otherwise (after a crash, or an earlier refused
    /// open, which leaves the file marked as not closed cleanly) the frees those entries held are lost: their blocks were
    /// classified by their headers alone. An older copy of an updated payload then still loses to its newer copy
    /// (<see cref="Superseded"/>), but a payload deleted after such a free (a removed key, a dequeued element) may have
    /// come back, and a block whose reuse a crash tore is listed in <see cref="DamagedBlocks"/>; damage to the last
    /// batches of a half, with no valid batch after them, cannot be told from an append a crash tore and is not listed
    /// unless the file still holds a clean shutdown's saved state.
    /// A salvage through a damaged log sets <see cref="SalvagedThrough"/>, as one through damaged blocks does.
    /// </summary>
    public IReadOnlyList<long> DamagedSweepLogOffsets { get; internal set; } = Array.Empty<long>();

    /// <summary>Kept blocks of durable versions that were found unsealed (a file written before each cycle sealed its version ahead of its frontier), sealed by this recovery (some may then be freed by it: superseded or cancelled copies).</summary>
    public long SealedAtRecovery { get; internal set; }

    /// <summary>
    /// The last version a salvage of this file kept payloads of — this open's (<see cref="DamagedBlocks"/> lists what it
    /// dropped) or an earlier one's, recorded on the file before that salvage freed anything, so that a file once salvaged
    /// says so at every later open, even when the open that salvaged failed or crashed before its report was read; 0 when
    /// the file was never salvaged. The structures resolve a salvage's duplicates and gaps among payloads of this version
    /// or older.
    /// </summary>
    public long SalvagedThrough { get; internal set; }

    /// <summary>Payloads handed to the structures.</summary>
    public long Live { get; internal set; }

    /// <summary>How many threads recovery used.</summary>
    public int Parallelism { get; internal set; }

    /// <summary>Wall time of the whole recovery (allocator scan, resolution, frees).</summary>
    public TimeSpan Duration { get; internal set; }

    /// <inheritdoc/>
    public override string ToString() =>
        $"clean={WasCleanShutdown} fast={FastReopen} clock={PersistedClock} frontier={PersistedFrontier} recovered≤{RecoveredVersion} scanned={ScannedPayloads} " +
        $"dropped={DroppedBeyondFrontier} superseded={Superseded} cancelled={Cancelled} damaged={DamagedBlocks.Count} damaged-log={DamagedSweepLogOffsets.Count} sealed-at-recovery={SealedAtRecovery} salvaged≤{SalvagedThrough} live={Live} threads={Parallelism} time={Duration.TotalMilliseconds:F1} ms";
}
