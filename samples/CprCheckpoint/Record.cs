namespace Epvs.Samples.CprCheckpoint;

/// <summary>
/// One version of a key's value. At rest a record is updated in place; while a checkpoint of version v flushes,
/// records of version ≤ v are frozen (the flusher reads them) and an update makes a new record of version v + 1 that
/// points at the frozen one (read-copy-update).
/// </summary>
internal sealed class Record
{
    public long Value;

    /// <summary>The checkpoint version the record belongs to: it is in checkpoint v iff it is the newest record of
    /// its key with Version ≤ v. Immutable.</summary>
    public readonly long Version;

    /// <summary>The frozen record this one replaced, kept for the flusher of the checkpoint in progress.</summary>
    public Record? Previous;

    public Record(long value, long version, Record? previous)
    {
        Value = value;
        Version = version;
        Previous = previous;
    }
}
