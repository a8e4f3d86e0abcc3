using System;
using System.Collections.Generic;
using System.Threading;

namespace Epvs.Samples.CprCheckpoint;

/// <summary>
/// The demo's request stream, chosen so that a checkpoint can be checked from its own content: request s of client
/// c adds s to key c * <see cref="KeysPerClient"/> + s mod <see cref="KeysPerClient"/>. Given a checkpoint's
/// de-duplication entry S for c, the table must hold, for each of c's keys, exactly the sum of the s ≤ S that map to
/// it — no more (an update whose request is missing from the vector) and no less (a request in the vector whose
/// update is missing).
/// </summary>
public static class DedupWorkload
{
    /// <summary>Keys per client.</summary>
    public const int KeysPerClient = 64;

    /// <summary>The key request <paramref name="sequenceNumber"/> of <paramref name="client"/> updates.</summary>
    public static long KeyOf(long client, long sequenceNumber) => client * KeysPerClient + sequenceNumber % KeysPerClient;

    /// <summary>
    /// Runs client <paramref name="client"/>'s requests on <paramref name="session"/> from its last applied sequence
    /// number until <paramref name="stop"/> is set, resending every 16th request once (it must be a duplicate).
    /// </summary>
    /// <returns>Requests applied, and resends wrongly applied (must be 0).</returns>
    public static (long Applied, long DuplicatesApplied) RunClient(CprSession session, ref int stop)
    {
        ArgumentNullException.ThrowIfNull(session);
        long applied = 0, duplicatesApplied = 0;
        long sequence = session.LastSequenceNumber;
        while (Volatile.Read(ref stop) == 0) // acquire: pairs with the caller's release
        {
            sequence++;
            session.Add(sequence, KeyOf(session.ClientId, sequence), sequence);
            applied++;
            if (sequence % 16 == 0 && session.Add(sequence, KeyOf(session.ClientId, sequence), sequence) != RequestResult.Duplicate)
                duplicatesApplied++;
        }
        return (applied, duplicatesApplied);
    }

    /// <summary>The sum of the sequence numbers s in 1..<paramref name="last"/> with s mod <see cref="KeysPerClient"/> =
    /// <paramref name="residue"/>: what requests 1..last add to that key.</summary>
    public static long SumOfRequests(long last, long residue)
    {
        long first = residue == 0 ? KeysPerClient : residue;
        if (last < first)
            return 0;
        long n = (last - first) / KeysPerClient + 1;
        return n * first + KeysPerClient * (n * (n - 1) / 2);
    }

    /// <summary>Checks that <paramref name="snapshot"/> is a consistent cut of this workload.</summary>
    /// <returns>The inconsistencies found (empty if consistent).</returns>
    public static List<string> FindInconsistencies(CheckpointSnapshot snapshot)
    {
        ArgumentNullException.ThrowIfNull(snapshot);
        var problems = new List<string>();
        var expected = new Dictionary<long, long>();
        foreach ((long client, long last) in snapshot.ClientSequenceNumbers)
        {
            for (long residue = 0; residue < KeysPerClient; residue++)
            {
                long sum = SumOfRequests(last, residue);
                if (sum != 0)
                    expected[client * KeysPerClient + residue] = sum;
            }
        }
        foreach ((long key, long value) in expected)
        {
            if (snapshot.Records.GetValueOrDefault(key) != value)
                problems.Add($"checkpoint {snapshot.Version}: key {key} is {snapshot.Records.GetValueOrDefault(key)}, but its client's de-duplicated requests sum to {value}");
        }
        foreach ((long key, long value) in snapshot.Records)
        {
            if (!expected.ContainsKey(key) && value != 0)
                problems.Add($"checkpoint {snapshot.Version}: key {key} is {value}, but no de-duplicated request of its client touches it");
        }
        return problems;
    }
}
