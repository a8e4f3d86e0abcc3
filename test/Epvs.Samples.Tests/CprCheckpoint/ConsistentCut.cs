using System.Collections.Generic;
using Epvs.Samples.CprCheckpoint;

namespace Epvs.Samples.Tests.CprCheckpoint;

/// <summary>
/// The test's own oracle for the sample's request stream (request s of client c adds s to key c*K + s mod K): a
/// checkpoint is a consistent cut iff each of c's keys holds exactly the sum of c's requests up to the checkpoint's
/// de-duplication entry that map to it, and no other key has a value. Written independently of the sample's checker.
/// </summary>
internal static class ConsistentCut
{
    public static List<string> Violations(CheckpointSnapshot snapshot)
    {
        const int K = DedupWorkload.KeysPerClient;
        var violations = new List<string>();
        var covered = new HashSet<long>();
        foreach (KeyValuePair<long, long> entry in snapshot.ClientSequenceNumbers)
        {
            long client = entry.Key, last = entry.Value;
            for (int residue = 0; residue < K; residue++)
            {
                // Requests residue, residue + K, ... (residue 0 starts at K) up to last: an arithmetic series.
                long expected = 0;
                long first = residue == 0 ? K : residue;
                if (last >= first)
                {
                    long terms = (last - first) / K + 1;
                    long lastTerm = first + (terms - 1) * K;
                    expected = terms * (first + lastTerm) / 2;
                }
                long key = client * K + residue;
                covered.Add(key);
                snapshot.Records.TryGetValue(key, out long actual);
                if (actual != expected)
                {
                    violations.Add(actual > expected
                        ? $"v{snapshot.Version}: key {key} = {actual} > {expected}: an update is in the table but its request is not in the de-duplication vector (client {client} at {last})"
                        : $"v{snapshot.Version}: key {key} = {actual} < {expected}: a de-duplicated request's update is missing from the table (client {client} at {last})");
                }
            }
        }
        foreach (KeyValuePair<long, long> record in snapshot.Records)
        {
            if (!covered.Contains(record.Key) && record.Value != 0)
                violations.Add($"v{snapshot.Version}: key {record.Key} = {record.Value}, but its client is not in the de-duplication vector");
        }
        return violations;
    }
}
