namespace Epvs.Samples.CprCheckpoint;

/// <summary>Options of a <see cref="CprStore"/>.</summary>
public sealed class CprStoreOptions
{
    /// <summary>How many completed checkpoint files to keep (older ones are deleted after a checkpoint completes);
    /// 0 keeps them all. Default 4.</summary>
    public int RetainedCheckpoints { get; set; } = 4;

    /// <summary>Whether a checkpoint waits for its file to reach the disk (fsync) before it counts as complete.
    /// Default true.</summary>
    public bool FlushToDisk { get; set; } = true;
}
