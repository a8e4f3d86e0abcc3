using System;
using System.Threading;
using Epvs.Samples.OwnershipMap;
using Epvs.Samples.Tests.Infrastructure;

namespace Epvs.Samples.Tests.OwnershipMap;

/// <summary>
/// Client threads add to and read back their own keys (each key has one writer, who therefore knows its value) while a
/// coordinator transfers the keys' buckets between shards a fixed number of times. Checks: no operation executed on a
/// shard that did not own its bucket (the cluster's directory audit), and no write was lost (every read and the
/// final value of every key equal the adds acknowledged to its client).
/// </summary>
internal static class OwnershipLoad
{
    public sealed record Outcome(long Misrouted, ViolationLog LostWrites, long Operations, long Transfers, long Reroutes);

    /// <summary>Client operations the coordinator waits for between two transfers, so that transfers interleave
    /// with real load instead of racing ahead of clients that have not been scheduled yet.</summary>
    private const long OperationsBetweenTransfers = 64;

    public static Outcome Run(OwnershipCluster cluster, int clients, int keysPerClient, int transfers, int seed)
    {
        // One counter per client, 128 bytes apart (no false sharing); the coordinator sums them.
        var progress = new long[(clients + 1) * 16];
        var lost = new ViolationLog();
        long operations = 0, reroutes = 0;
        int stop = 0;
        long transfersDone = 0;

        Workers.Run(clients + 1, worker =>
        {
            if (worker == clients)
            {
                // The coordinator: a bounded number of transfers of the clients' buckets to random other shards.
                try
                {
                    var picker = new Random(seed);
                    var deadline = DateTime.UtcNow + TimeSpan.FromSeconds(45);
                    for (int i = 0; i < transfers; i++)
                    {
                        long target = (i + 1) * OperationsBetweenTransfers;
                        var spinner = new SpinWait();
                        while (Progress(progress, clients) < target)
                        {
                            if (DateTime.UtcNow > deadline)
                                throw new TimeoutException($"The clients made no progress for the transfer {i} (45 s).");
                            spinner.SpinOnce();
                        }
                        long key = Key(picker.Next(keysPerClient), picker.Next(clients), clients);
                        ushort bucket = KeyBuckets.Of(key);
                        int owner = cluster.Directory.OwnerOf(bucket);
                        cluster.Transfer(bucket, (owner + 1 + picker.Next(cluster.ShardCount - 1)) % cluster.ShardCount);
                        transfersDone++;
                    }
                }
                finally
                {
                    Volatile.Write(ref stop, 1); // release: clients stop once the transfers are done
                }
                return;
            }

            var random = new Random(seed + 1 + worker);
            var expected = new long[keysPerClient];
            long done = 0;
            using ClusterClient client = cluster.OpenClient();
            while (Volatile.Read(ref stop) == 0) // acquire
            {
                int k = random.Next(keysPerClient);
                long key = Key(k, worker, clients);
                client.Add(key, 1);
                expected[k]++;
                client.Read(key, out long value);
                if (value != expected[k])
                    lost.Add($"Client {worker} read key {key} (bucket {KeyBuckets.Of(key)}) as {value} right after its add #{expected[k]}.");
                done += 2;
                Volatile.Write(ref progress[(worker + 1) * 16], done); // release; read by the coordinator
            }
            for (int k = 0; k < keysPerClient; k++)
            {
                long key = Key(k, worker, clients);
                client.Read(key, out long value);
                if (value != expected[k])
                    lost.Add($"Key {key} (bucket {KeyBuckets.Of(key)}) ends as {value}; its client had {expected[k]} adds acknowledged.");
            }
            Interlocked.Add(ref operations, done);
            Interlocked.Add(ref reroutes, client.Reroutes);
        }, TimeSpan.FromSeconds(60));

        return new Outcome(cluster.Directory.MisroutedOperations, lost, operations, transfersDone, reroutes);
    }

    private static long Progress(long[] progress, int clients)
    {
        long sum = 0;
        for (int c = 0; c < clients; c++)
            sum += Volatile.Read(ref progress[(c + 1) * 16]); // acquire
        return sum;
    }

    public static long Key(int index, int client, int clients) => (long)index * clients + client;
}
