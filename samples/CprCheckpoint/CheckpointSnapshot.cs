using System.Collections.Generic;

namespace Epvs.Samples.CprCheckpoint;

/// <summary>The content of one checkpoint file: a consistent cut of the store.</summary>
/// <param name="Version">The checkpoint version (the store's version when the cut was taken).</param>
/// <param name="ClientSequenceNumbers">The de-duplication vector: per client, the last request applied in the cut.</param>
/// <param name="Records">Every key's value in the cut.</param>
public sealed record CheckpointSnapshot(long Version, IReadOnlyDictionary<long, long> ClientSequenceNumbers, IReadOnlyDictionary<long, long> Records);
