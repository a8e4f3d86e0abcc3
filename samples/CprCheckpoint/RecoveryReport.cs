using System.Collections.Generic;

namespace Epvs.Samples.CprCheckpoint;

/// <summary>What <see cref="CprStore.Recover"/> did. Every file it did not use is listed with the reason, so a
/// fallback to an older checkpoint is never silent.</summary>
/// <param name="RecoveredVersion">The version recovered, or null if the directory held no checkpoint (a fresh store).</param>
/// <param name="RecoveredPath">The file recovered from, or null.</param>
/// <param name="Skipped">Newer files that were not used: corrupt or truncated checkpoints, and incomplete ones
/// (temporary files of a checkpoint interrupted by a crash).</param>
/// <param name="ClientSequenceNumbers">Per client, the last request the recovered state reflects: the client must
/// resend everything after it (CPR's per-session commit point).</param>
public sealed record RecoveryReport(long? RecoveredVersion, string? RecoveredPath, IReadOnlyList<SkippedCheckpoint> Skipped, IReadOnlyDictionary<long, long> ClientSequenceNumbers);
