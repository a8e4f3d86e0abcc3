using System;

namespace Epvs.Persistence;

/// <summary>How a <see cref="PersistentHeap"/> recovers when it opens.</summary>
public sealed class PersistentHeapOptions
{
    /// <summary>
    /// Called for every valid allocated block found by the recovery scan; returning <see langword="false"/> frees the
    /// block (its free is persisted before the constructor returns). Buffered durability (part 2) uses this to drop
    /// payloads newer than the durable frontier. Called from several threads at once when
    /// <see cref="RecoveryParallelism"/> is above 1. Null keeps every valid block.
    /// </summary>
    public Func<PayloadRef, PayloadHeader, bool>? RecoveryFilter { get; set; }

    /// <summary>How many threads scan the segments at open, at least 1; default <see cref="Environment.ProcessorCount"/>.</summary>
    public int RecoveryParallelism { get; set; } = Environment.ProcessorCount;

    /// <summary>
    /// What recovery does with a damaged block (a commit word no crash can leave, or a sealed block whose check over
    /// header and payload fails). False (the default): opening throws <see cref="HeapFileException"/> with
    /// <see cref="HeapFileError.Corrupt"/>, listing the blocks in <see cref="HeapFileException.DamagedBlocks"/>, and
    /// frees nothing. True: the damaged blocks are dropped (freed durably, their contents lost) and the heap opens;
    /// <see cref="PersistentHeap.RecoveryDamagedBlocks"/> lists them. A buffered heap's sweep log is salvaged too (see
    /// <see cref="DurableRecoveryReport.DamagedSweepLogOffsets"/>).
    /// </summary>
    public bool SalvageDamagedBlocks { get; set; }

    /// <summary>Deliberate faults, for the tests' broken controls only.</summary>
    internal HeapFaults Faults { get; set; }

    /// <summary>Checks the options a caller gave (as <see cref="BufferedDurableHeapOptions"/> are checked); returns them.</summary>
    /// <exception cref="ArgumentOutOfRangeException"><see cref="RecoveryParallelism"/> is below 1 (it used to be taken as 1).</exception>
    internal static PersistentHeapOptions? Validated(PersistentHeapOptions? options)
    {
        if (options is not null && options.RecoveryParallelism < 1)
        {
            ThrowHelper.ThrowArgumentOutOfRange(nameof(RecoveryParallelism), $"RecoveryParallelism must be at least 1, not {options.RecoveryParallelism}.");
        }

        return options;
    }

    /// <summary>Which heap kind opens the file (a buffered durable heap sets its own).</summary>
    internal long OwnerKind { get; set; } = HeapLayout.KindRaw;

    /// <summary>Whether the owner writes anti-payloads for its deletes, so that a heap that cannot grow keeps a delete
    /// reserve (see PersistentHeap.DeleteReserve): a buffered heap in Buffered or Strict mode. A raw heap frees with Free,
    /// and a transient buffered heap writes no anti-payloads: a reserve would only withhold a segment from them.</summary>
    internal bool KeepsDeleteReserve { get; set; }

    /// <summary>
    /// Whether a torn block (a header whose check fails, as an interrupted allocation leaves it) is damage: set by a
    /// buffered heap whose sealed-frontier word is below its frontier, where a durable version may be unsealed and one
    /// of its headers damaged cannot be told from an interrupted allocation.
    /// </summary>
    internal bool TornIsDamaged { get; set; }

    /// <summary>
    /// The version whose cycle a crash may have interrupted (a buffered heap's recovered cut + 1): its blocks may be
    /// sealed over bytes that never reached the file, and recovery frees such a block as torn instead of reporting it
    /// (see <see cref="HeapLayout"/>, sealing). 0: no block can be (a raw heap never seals).
    /// </summary>
    internal long InFlightVersion { get; set; }

    /// <summary>Runs when recovery salvages damaged blocks, after it classified every block and before it writes anything.</summary>
    internal Action? BeforeSalvage { get; set; }

    /// <summary>
    /// Recovery of a buffered heap: the persisted epoch clock, which precedes every tag written to the file. A block that
    /// passes its check with an epoch tag above it is damage — the superblock is older than the blocks (a lost write of
    /// its page, an old copy of it restored) — and not a payload beyond the frontier to drop and free. 0: no bound.
    /// </summary>
    internal long TagBound { get; set; }
}
