namespace Epvs.Samples.CprCheckpoint;

/// <summary>A checkpoint file recovery did not use, and why.</summary>
/// <param name="Path">The file.</param>
/// <param name="Reason">Why it was skipped (corrupt, truncated, or never completed).</param>
public sealed record SkippedCheckpoint(string Path, string Reason);
