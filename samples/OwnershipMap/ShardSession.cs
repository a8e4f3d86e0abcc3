using System;
using System.Threading;

namespace Epvs.Samples.OwnershipMap;

/// <summary>
/// A thread's session on one <see cref="Shard"/> (Fig. 8's <c>ProcessRequest</c>): each operation enters the shard's
/// protected region, checks that the shard owns the key's bucket, executes on the FASTER store, and leaves. If the
/// shard does not own the bucket it executes nothing and returns <see cref="OperationStatus.NotOwner"/>.
/// Thread-affine: use and dispose it on the thread that opened it.
/// </summary>
public sealed class ShardSession : IDisposable
{
    private readonly Shard shard;
    private readonly ShardStoreSession store;

    internal ShardSession(Shard shard)
    {
        this.shard = shard;
        store = shard.Store.NewSession();
    }

    /// <summary>The shard.</summary>
    public Shard Shard => shard;

    /// <summary>Reads <paramref name="key"/> if the shard owns its bucket.</summary>
    /// <param name="key">The key.</param>
    /// <param name="value">The value, or 0.</param>
    /// <returns><see cref="OperationStatus.Ok"/>, <see cref="OperationStatus.NotFound"/> or
    /// <see cref="OperationStatus.NotOwner"/>.</returns>
    public OperationStatus Read(long key, out long value) => Execute(Operation.Read, key, 0, out value);

    /// <summary>Sets <paramref name="key"/> to <paramref name="value"/> if the shard owns its bucket.</summary>
    /// <param name="key">The key.</param>
    /// <param name="value">The value.</param>
    /// <returns><see cref="OperationStatus.Ok"/> or <see cref="OperationStatus.NotOwner"/>.</returns>
    public OperationStatus Upsert(long key, long value) => Execute(Operation.Upsert, key, value, out _);

    /// <summary>Adds <paramref name="delta"/> to <paramref name="key"/> (a FASTER read-modify-write; a missing key
    /// starts at 0) if the shard owns its bucket.</summary>
    /// <param name="key">The key.</param>
    /// <param name="delta">The amount.</param>
    /// <returns><see cref="OperationStatus.Ok"/> or <see cref="OperationStatus.NotOwner"/>.</returns>
    public OperationStatus Add(long key, long delta) => Execute(Operation.Add, key, delta, out _);

    private OperationStatus Execute(Operation operation, long key, long argument, out long value)
    {
        ushort bucket = KeyBuckets.Of(key);
        if (shard.ValidateOutsideProtectionForTesting)
            return ExecuteValidatedOutsideProtection(operation, bucket, key, argument, out value);

        shard.Scheme.Enter();
        try
        {
            // Safe to read a HashSet here: it changes only in critical sections, which cannot overlap this region.
            if (!shard.Ownership.Contains(bucket))
            {
                value = 0;
                return OperationStatus.NotOwner;
            }
            return ExecuteAudited(operation, bucket, key, argument, out value);
        }
        finally
        {
            shard.Scheme.Leave();
        }
    }

    /// <summary>Runs the operation on the store, and counts it as misrouted if the directory says, before or after,
    /// that this shard does not own the bucket.</summary>
    private OperationStatus ExecuteAudited(Operation operation, ushort bucket, long key, long argument, out long value)
    {
        bool owned = shard.Directory.OwnerOf(bucket) == shard.Id;
        OperationStatus status = OperationStatus.Ok;
        value = 0;
        switch (operation)
        {
            case Operation.Read:
                if (!store.TryRead(key, out value))
                    status = OperationStatus.NotFound;
                break;
            case Operation.Upsert:
                store.Upsert(key, argument);
                break;
            default:
                store.Add(key, argument);
                break;
        }
        owned &= shard.Directory.OwnerOf(bucket) == shard.Id;
        if (!owned)
            shard.Directory.CountMisrouted();
        return status;
    }

    /// <summary>The test-only control (see <see cref="Shard.ValidateOutsideProtectionForTesting"/>).</summary>
    private OperationStatus ExecuteValidatedOutsideProtection(Operation operation, ushort bucket, long key, long argument, out long value)
    {
        bool owned;
        shard.Scheme.Enter();
        try
        {
            owned = shard.Ownership.Contains(bucket);
        }
        finally
        {
            shard.Scheme.Leave();
        }
        if (!owned)
        {
            value = 0;
            return OperationStatus.NotOwner;
        }
        Thread.Yield(); // widen the window in which a relinquish can complete between validation and execution
        return ExecuteAudited(operation, bucket, key, argument, out value);
    }

    private enum Operation
    {
        Read,
        Upsert,
        Add,
    }

    /// <summary>Disposes the FASTER session.</summary>
    public void Dispose() => store.Dispose();
}
