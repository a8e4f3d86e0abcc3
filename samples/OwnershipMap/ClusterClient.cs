using System;
using System.Threading;

namespace Epvs.Samples.OwnershipMap;

/// <summary>
/// A thread's client of an <see cref="OwnershipCluster"/>: routes each operation to the shard the routing table names
/// and, when that shard answers <see cref="OperationStatus.NotOwner"/> (the bucket moved, or is migrating), routes
/// it again. Thread-affine; dispose it on the thread that opened it.
/// </summary>
public sealed class ClusterClient : IDisposable
{
    private readonly OwnershipCluster cluster;
    private readonly ShardSession[] sessions;

    internal ClusterClient(OwnershipCluster cluster)
    {
        this.cluster = cluster;
        sessions = new ShardSession[cluster.ShardCount];
        for (int i = 0; i < sessions.Length; i++)
            sessions[i] = cluster.GetShard(i).OpenSession();
    }

    /// <summary>Operations that a shard refused because it did not own the bucket (each was routed again).</summary>
    public long Reroutes { get; private set; }

    /// <summary>Reads <paramref name="key"/>.</summary>
    /// <param name="key">The key.</param>
    /// <param name="value">The value, or 0 if the key has none.</param>
    /// <returns>Whether the key has a value.</returns>
    public bool Read(long key, out long value)
    {
        ushort bucket = KeyBuckets.Of(key);
        var spinner = new SpinWait();
        while (true)
        {
            OperationStatus status = sessions[cluster.RouteOf(bucket)].Read(key, out value);
            if (status != OperationStatus.NotOwner)
                return status == OperationStatus.Ok;
            Reroutes++;
            spinner.SpinOnce();
        }
    }

    /// <summary>Sets <paramref name="key"/> to <paramref name="value"/>.</summary>
    /// <param name="key">The key.</param>
    /// <param name="value">The value.</param>
    public void Upsert(long key, long value)
    {
        ushort bucket = KeyBuckets.Of(key);
        var spinner = new SpinWait();
        while (sessions[cluster.RouteOf(bucket)].Upsert(key, value) == OperationStatus.NotOwner)
        {
            Reroutes++;
            spinner.SpinOnce();
        }
    }

    /// <summary>Adds <paramref name="delta"/> to <paramref name="key"/> (a missing key starts at 0).</summary>
    /// <param name="key">The key.</param>
    /// <param name="delta">The amount.</param>
    public void Add(long key, long delta)
    {
        ushort bucket = KeyBuckets.Of(key);
        var spinner = new SpinWait();
        while (sessions[cluster.RouteOf(bucket)].Add(key, delta) == OperationStatus.NotOwner)
        {
            Reroutes++;
            spinner.SpinOnce();
        }
    }

    /// <summary>Disposes the sessions.</summary>
    public void Dispose()
    {
        foreach (ShardSession session in sessions)
            session.Dispose();
    }
}
