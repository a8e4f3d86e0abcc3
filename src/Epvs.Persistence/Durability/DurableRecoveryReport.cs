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

    /// <summary>Valid blocks the scan found.</summary>
    public long ScannedPayloads { get; internal set; }

    /// <summary>Blocks freed because their tag was beyond the recovered version (or 0: written without epochs).</summary>
    public long DroppedBeyondFrontier { get; internal set; }

    /// <summary>Older copies freed because a newer copy of the same uid survived.</summary>
    public long Superseded { get; internal set; }

    /// <summary>Payloads and anti-payloads freed because a mature anti-payload deleted their uid.</summary>
    public long Cancelled { get; internal set; }

    /// <summary>
    /// File offsets (sorted) of the damaged blocks dropped because the heap opened with
    /// <see cref="BufferedDurableHeapOptions.SalvageDamagedBlocks"/>; without it, damage makes opening throw instead.
    /// </summary>
    public IReadOnlyList<long> DamagedBlocks { get; internal set; } = Array.Empty<long>();

    /// <summary>
    /// File offsets (sorted) of blocks recovery freed as torn although it could not rule out damage: listed only when the
    /// file's sealed frontier is below the recovered version — a crash between the durable frontier's last move and the
    /// seals of that version, a cycle that failed between the two, or a file written before the word existed. A torn
    /// block — its commit word says allocated, the check over its header fails — is normally an allocation of a later
    /// version that the crash interrupted; in that window it may instead be a block of the last durable version whose
    /// header was damaged, and the scan cannot tell which (the version is in the header). Empty otherwise: every other
    /// torn block is an interrupted allocation. Only this recovery reports them (they are freed durably).
    /// </summary>
    public IReadOnlyList<long> UnverifiedBlocks { get; internal set; } = Array.Empty<long>();

    /// <summary>Kept blocks of durable versions that a crash left unsealed (see <see cref="UnverifiedBlocks"/>), sealed by this recovery (some may then be freed by it: superseded or cancelled copies).</summary>
    public long SealedAtRecovery { get; internal set; }

    /// <summary>Payloads handed to the structures.</summary>
    public long Live { get; internal set; }

    /// <summary>How many threads recovery used.</summary>
    public int Parallelism { get; internal set; }

    /// <summary>Wall time of the whole recovery (allocator scan, resolution, frees).</summary>
    public TimeSpan Duration { get; internal set; }

    /// <inheritdoc/>
    public override string ToString() =>
        $"clean={WasCleanShutdown} fast={FastReopen} clock={PersistedClock} frontier={PersistedFrontier} recovered≤{RecoveredVersion} scanned={ScannedPayloads} " +
        $"dropped={DroppedBeyondFrontier} superseded={Superseded} cancelled={Cancelled} damaged={DamagedBlocks.Count} unverified={UnverifiedBlocks.Count} sealed-at-recovery={SealedAtRecovery} live={Live} threads={Parallelism} time={Duration.TotalMilliseconds:F1} ms";
}
