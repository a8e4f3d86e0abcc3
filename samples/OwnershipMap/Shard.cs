using System;
using System.Collections.Generic;

namespace Epvs.Samples.OwnershipMap;

/// <summary>
/// One shard of the paper's §5.1 (Fig. 8): a FASTER store plus the set of 16-bit buckets it owns. Every operation
/// validates ownership inside an EPVS protected region that lasts until the operation has executed, so the
/// ownership set — a plain, single-threaded <see cref="HashSet{T}"/> — is read-only while anyone reads it, and
/// changes only as a version transition (<see cref="Acquire"/>, <see cref="Relinquish"/>) in mutual exclusion with
/// every operation. When <see cref="Relinquish"/> returns, every operation that validated the bucket has finished and
/// none will validate it again, so the bucket's records can be migrated.
/// </summary>
public sealed class Shard : IDisposable
{
    private readonly EpochProtectedVersionScheme epvs = new();
    private readonly HashSet<ushort> ownership = new();
    private readonly BucketDirectory directory;

    internal Shard(int id, int shardCount, BucketDirectory directory)
    {
        Id = id;
        this.directory = directory;
        for (int b = id; b < KeyBuckets.Count; b += shardCount)
            ownership.Add((ushort)b);
        Store = new ShardStore();
    }

    /// <summary>The shard's number in its cluster.</summary>
    public int Id { get; }

    /// <summary>The scheme guarding ownership; its version counts ownership changes + 1.</summary>
    public EpochProtectedVersionScheme Scheme => epvs;

    internal ShardStore Store { get; }

    internal BucketDirectory Directory => directory;

    internal HashSet<ushort> Ownership => ownership;

    /// <summary>TEST-ONLY CONTROL: validate ownership in a protected region, but execute the operation after leaving
    /// it (and yield in between to widen the race), as a latch-free design without EPVS would. Breaks the guarantee on
    /// purpose, so that tests can show their checkers catch it.</summary>
    internal bool ValidateOutsideProtectionForTesting { get; set; }

    /// <summary>How many buckets the shard owns now.</summary>
    public int OwnedBucketCount
    {
        get
        {
            using var scope = epvs.EnterScope(out _);
            return ownership.Count;
        }
    }

    /// <summary>Whether the shard owns <paramref name="bucket"/> now.</summary>
    /// <param name="bucket">The bucket.</param>
    /// <returns>Whether it is in the ownership set.</returns>
    public bool Owns(ushort bucket)
    {
        using var scope = epvs.EnterScope(out _);
        return ownership.Contains(bucket);
    }

    /// <summary>
    /// Opens the calling thread's session on this shard (a FASTER session underneath, which is not thread-safe).
    /// </summary>
    /// <returns>The session; dispose it on the same thread.</returns>
    public ShardSession OpenSession() => new(this);

    /// <summary>
    /// Gives up <paramref name="bucket"/> as a version transition (Fig. 8, lines 27–29) and waits for it: when this
    /// returns, no operation on the bucket is executing on this shard and none will start. Blocks; call it outside any
    /// protected region.
    /// </summary>
    /// <param name="bucket">The bucket.</param>
    /// <returns>False if the shard did not own the bucket.</returns>
    /// <exception cref="InvalidOperationException">The calling thread is inside a protected region of this shard.</exception>
    public bool Relinquish(ushort bucket)
    {
        bool owned = false;
        epvs.AdvanceVersionWithCriticalSection((_, _) =>
        {
            owned = ownership.Remove(bucket);
            if (owned)
                directory.Set(bucket, BucketDirectory.Unowned);
        }, spin: true);
        return owned;
    }

    /// <summary>
    /// Takes ownership of <paramref name="bucket"/> as a version transition (Fig. 8, line 24) and waits for it: when
    /// this returns, every later operation on the bucket validates here. Blocks; call it outside any protected region.
    /// The bucket must have been relinquished by its previous owner and its records migrated here.
    /// </summary>
    /// <param name="bucket">The bucket.</param>
    /// <returns>False if the shard already owned the bucket.</returns>
    /// <exception cref="InvalidOperationException">The calling thread is inside a protected region of this shard.</exception>
    public bool Acquire(ushort bucket)
    {
        bool added = false;
        epvs.AdvanceVersionWithCriticalSection((_, _) =>
        {
            added = ownership.Add(bucket);
            directory.Set(bucket, Id);
        }, spin: true);
        return added;
    }

    /// <summary>Disposes the scheme and the store. No session may be in use.</summary>
    public void Dispose()
    {
        epvs.Dispose();
        Store.Dispose();
    }
}
