using System.Threading;

namespace Epvs.Samples.OwnershipMap;

/// <summary>
/// The cluster's ground truth of who owns each bucket, written only inside the shards' ownership critical sections
/// (so it changes exactly when ownership does), and the audit that every executed operation checks against it: an
/// operation that executes on a shard which, per this directory, does not own its bucket is counted as misrouted.
/// The sample's claim is that this count stays zero under any load and any number of transfers.
/// </summary>
public sealed class BucketDirectory
{
    /// <summary>The owner value of a bucket that is being migrated (owned by no shard).</summary>
    public const int Unowned = -1;

    private readonly int[] owners = new int[KeyBuckets.Count];
    private long misrouted;

    internal BucketDirectory(int shards)
    {
        for (int b = 0; b < owners.Length; b++)
            owners[b] = b % shards;
    }

    /// <summary>The shard that owns <paramref name="bucket"/>, or <see cref="Unowned"/> during its migration.</summary>
    public int OwnerOf(ushort bucket) => Volatile.Read(ref owners[bucket]); // acquire: pairs with Set

    /// <summary>Operations that executed on a shard that did not own their bucket. Zero unless something is broken.</summary>
    public long MisroutedOperations => Interlocked.Read(ref misrouted);

    internal void Set(ushort bucket, int owner) => Volatile.Write(ref owners[bucket], owner); // release

    internal void CountMisrouted() => Interlocked.Increment(ref misrouted);
}
