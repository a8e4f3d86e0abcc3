using System;
using System.Threading;

namespace Epvs.Samples.OwnershipMap;

/// <summary>
/// A sharded key-value service in one process (paper §5.1): <see cref="ShardCount"/> shards, each a FASTER store that
/// owns a set of the 65,536 hash buckets, a routing table clients use to find a bucket's shard (a hint, possibly stale:
/// shards validate), and bucket transfers between shards — relinquish at the source (a version transition), migrate
/// the bucket's records, acquire at the destination (a version transition), update the route.
/// </summary>
public sealed class OwnershipCluster : IDisposable
{
    private readonly Shard[] shards;
    private readonly int[] routes = new int[KeyBuckets.Count];
    private readonly object transferLock = new();
    private ShardStoreSession[]? coordinatorSessions;
    private long transfers;
    private long migratedRecords;

    /// <summary>Creates a cluster; bucket b starts on shard b mod <paramref name="shardCount"/>.</summary>
    /// <param name="shardCount">The number of shards (2 or more).</param>
    /// <exception cref="ArgumentOutOfRangeException"><paramref name="shardCount"/> is below 2.</exception>
    public OwnershipCluster(int shardCount)
    {
        ArgumentOutOfRangeException.ThrowIfLessThan(shardCount, 2);
        Directory = new BucketDirectory(shardCount);
        shards = new Shard[shardCount];
        for (int i = 0; i < shardCount; i++)
            shards[i] = new Shard(i, shardCount, Directory);
        for (int b = 0; b < routes.Length; b++)
            routes[b] = b % shardCount;
    }

    /// <summary>The number of shards.</summary>
    public int ShardCount => shards.Length;

    /// <summary>The ground truth of bucket ownership and the misrouted-operation audit.</summary>
    public BucketDirectory Directory { get; }

    /// <summary>Transfers completed.</summary>
    public long Transfers => Interlocked.Read(ref transfers);

    /// <summary>Records migrated by all transfers.</summary>
    public long MigratedRecords => Interlocked.Read(ref migratedRecords);

    /// <summary>The shard with number <paramref name="id"/>.</summary>
    /// <param name="id">0 to <see cref="ShardCount"/> - 1.</param>
    /// <returns>The shard.</returns>
    public Shard GetShard(int id) => shards[id];

    /// <summary>Where clients send operations on <paramref name="bucket"/> (a hint).</summary>
    /// <param name="bucket">The bucket.</param>
    /// <returns>A shard number.</returns>
    public int RouteOf(ushort bucket) => Volatile.Read(ref routes[bucket]); // acquire: pairs with Transfer's release

    /// <summary>Opens the calling thread's client (one FASTER session per shard).</summary>
    /// <returns>The client; dispose it on the same thread.</returns>
    public ClusterClient OpenClient() => new(this);

    /// <summary>
    /// Moves <paramref name="bucket"/> to shard <paramref name="destination"/>: relinquish at its owner (after which
    /// no operation on it runs there), migrate its records, acquire at the destination, update the route. While the
    /// bucket migrates no shard owns it and clients retry. One transfer at a time; blocks; call it outside protected
    /// regions.
    /// </summary>
    /// <param name="bucket">The bucket.</param>
    /// <param name="destination">The shard to move it to.</param>
    /// <returns>The number of records migrated, or -1 if the bucket already lives there.</returns>
    /// <exception cref="ArgumentOutOfRangeException"><paramref name="destination"/> is not a shard.</exception>
    public int Transfer(ushort bucket, int destination)
    {
        ArgumentOutOfRangeException.ThrowIfNegative(destination);
        ArgumentOutOfRangeException.ThrowIfGreaterThanOrEqual(destination, shards.Length);
        lock (transferLock)
        {
            int source = Directory.OwnerOf(bucket);
            if (source == destination)
                return -1;
            // FASTER sessions are not thread-safe; these are used under the lock only, by one thread at a time.
            coordinatorSessions ??= Array.ConvertAll(shards, shard => shard.Store.NewSession());

            if (!shards[source].Relinquish(bucket))
                throw new InvalidOperationException($"Shard {source} was expected to own bucket {bucket}.");

            // No operation on the bucket runs anywhere now: its records at the source are frozen.
            var records = coordinatorSessions[source].ScanBucket(bucket);
            foreach (var record in records)
                coordinatorSessions[destination].Upsert(record.Key, record.Value);
            foreach (var record in records)
                coordinatorSessions[source].Delete(record.Key);

            shards[destination].Acquire(bucket);
            Volatile.Write(ref routes[bucket], destination); // release: clients now go straight to the new owner
            Interlocked.Increment(ref transfers);
            Interlocked.Add(ref migratedRecords, records.Count);
            return records.Count;
        }
    }

    /// <summary>Disposes every shard. No client may be in use and no transfer running.</summary>
    public void Dispose()
    {
        lock (transferLock)
        {
            if (coordinatorSessions is not null)
            {
                foreach (ShardStoreSession session in coordinatorSessions)
                    session.Dispose();
                coordinatorSessions = null;
            }
        }
        foreach (Shard shard in shards)
            shard.Dispose();
    }
}
