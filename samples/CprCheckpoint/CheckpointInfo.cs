namespace Epvs.Samples.CprCheckpoint;

/// <summary>A completed checkpoint.</summary>
/// <param name="Version">Its version.</param>
/// <param name="Path">The file it was written to.</param>
/// <param name="Clients">De-duplication entries in it.</param>
/// <param name="Records">Records in it.</param>
/// <param name="Bytes">The file's size.</param>
public sealed record CheckpointInfo(long Version, string Path, int Clients, long Records, long Bytes);
