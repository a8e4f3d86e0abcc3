using System;
using Epvs.Samples.OwnershipMap;
using Xunit;

namespace Epvs.Samples.Tests.OwnershipMap;

public sealed class OwnershipMapTests
{
    private const int Seed = 515;
    private readonly ITestOutputHelper output;

    public OwnershipMapTests(ITestOutputHelper output) => this.output = output;

    [Fact]
    public void ConcurrentLoadWithTransfers_ValidationUnderProtection_NoMisroutedOperationAndNoLostWrite()
    {
        output.WriteLine($"seed {Seed}: 3 shards, 2 clients x 32 keys, 3000 transfers");
        using var cluster = new OwnershipCluster(3);

        OwnershipLoad.Outcome outcome = OwnershipLoad.Run(cluster, clients: 2, keysPerClient: 32, transfers: 3000, Seed);

        output.WriteLine($"{outcome.Operations} operations, {outcome.Transfers} transfers ({cluster.MigratedRecords} records migrated), {outcome.Reroutes} reroutes, {outcome.Misrouted} misrouted, lost writes: {outcome.LostWrites.Describe()}");
        Assert.Equal(3000, outcome.Transfers);
        Assert.True(outcome.Operations >= 3000 * 64, "The clients did not run between the transfers.");
        Assert.True(outcome.Reroutes > 0, "No operation ever met a bucket in transfer: the load did not overlap the transfers.");
        Assert.True(outcome.Misrouted == 0, $"{outcome.Misrouted} operation(s) executed on a shard that did not own their bucket.");
        Assert.True(outcome.LostWrites.Count == 0, outcome.LostWrites.Describe());
        AssertEveryBucketHasExactlyOneOwner(cluster);
    }

    [Fact]
    public void ConcurrentLoadWithTransfers_ValidationOutsideProtectionControl_IsCaught()
    {
        // The same load and checks must catch an ownership check done outside protection, or the test above proves nothing.
        const int Attempts = 3;
        for (int attempt = 0; attempt < Attempts; attempt++)
        {
            using var cluster = new OwnershipCluster(3);
            for (int s = 0; s < cluster.ShardCount; s++)
                cluster.GetShard(s).ValidateOutsideProtectionForTesting = true;

            OwnershipLoad.Outcome outcome = OwnershipLoad.Run(cluster, clients: 2, keysPerClient: 8, transfers: 1500, Seed + attempt);

            output.WriteLine($"control attempt {attempt}, seed {Seed + attempt}: {outcome.Operations} operations, {outcome.Transfers} transfers, {outcome.Misrouted} misrouted, lost writes: {outcome.LostWrites.Describe()}");
            if (outcome.Misrouted > 0 || outcome.LostWrites.Count > 0)
                return;
        }
        Assert.Fail($"Inconclusive: control not caught. {Attempts} runs with ownership validated outside protection showed no misrouted operation and no lost write, so the passing test proves nothing.");
    }

    [Fact]
    public void Operation_OnRelinquishedBucket_ReturnsNotOwnerAndExecutesNothing()
    {
        using var cluster = new OwnershipCluster(2);
        const long Key = 12345;
        ushort bucket = KeyBuckets.Of(Key);
        Shard owner = cluster.GetShard(cluster.Directory.OwnerOf(bucket));
        using ShardSession session = owner.OpenSession();
        Assert.Equal(OperationStatus.Ok, session.Upsert(Key, 7));

        Assert.True(owner.Relinquish(bucket));

        Assert.False(owner.Owns(bucket));
        Assert.Equal(BucketDirectory.Unowned, cluster.Directory.OwnerOf(bucket));
        Assert.Equal(OperationStatus.NotOwner, session.Add(Key, 1));
        Assert.Equal(OperationStatus.NotOwner, session.Read(Key, out _));
        Assert.True(owner.Acquire(bucket));
        Assert.Equal(OperationStatus.Ok, session.Read(Key, out long value));
        Assert.Equal(7, value); // the refused add did not execute
        Assert.Equal(0, cluster.Directory.MisroutedOperations);
    }

    [Fact]
    public void Transfer_OfBucketWithRecords_MovesThemAndTheRoute()
    {
        using var cluster = new OwnershipCluster(2);
        using ClusterClient client = cluster.OpenClient();
        const long Key = 777;
        ushort bucket = KeyBuckets.Of(Key);
        int source = cluster.Directory.OwnerOf(bucket);
        int destination = 1 - source;
        client.Upsert(Key, 41);
        client.Add(Key, 1);

        Assert.Equal(1, cluster.Transfer(bucket, destination));

        Assert.Equal(destination, cluster.Directory.OwnerOf(bucket));
        Assert.Equal(destination, cluster.RouteOf(bucket));
        Assert.True(cluster.GetShard(destination).Owns(bucket));
        Assert.False(cluster.GetShard(source).Owns(bucket));
        Assert.True(client.Read(Key, out long value));
        Assert.Equal(42, value);
        using ShardSession atSource = cluster.GetShard(source).OpenSession();
        Assert.Equal(OperationStatus.NotOwner, atSource.Read(Key, out _));
        Assert.Equal(-1, cluster.Transfer(bucket, destination));
    }

    [Fact]
    public void Relinquish_InsideProtectedRegionOfTheShard_ThrowsInvalidOperation()
    {
        using var cluster = new OwnershipCluster(2);
        Shard shard = cluster.GetShard(0);
        shard.Scheme.Enter();
        try
        {
            Assert.Throws<InvalidOperationException>(() => shard.Relinquish(0));
        }
        finally
        {
            shard.Scheme.Leave();
        }
        Assert.True(shard.Owns(0));
    }

    private static void AssertEveryBucketHasExactlyOneOwner(OwnershipCluster cluster)
    {
        for (int b = 0; b < KeyBuckets.Count; b++)
        {
            int owners = 0;
            for (int s = 0; s < cluster.ShardCount; s++)
            {
                if (cluster.GetShard(s).Owns((ushort)b))
                    owners++;
            }
            Assert.True(owners == 1, $"Bucket {b} has {owners} owners.");
            Assert.True(cluster.GetShard(cluster.Directory.OwnerOf((ushort)b)).Owns((ushort)b), $"The directory disagrees with the shards on bucket {b}.");
        }
    }
}
