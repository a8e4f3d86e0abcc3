using System;
using System.Diagnostics;
using System.IO;
using System.Threading;

namespace Epvs.Samples.OwnershipMap;

/// <summary>
/// Runs client threads against a cluster while a coordinator transfers buckets back and forth, then checks the
/// outcome: no operation executed on a shard that did not own its bucket, and no write was lost. Used by this sample's
/// Program and by the Tour.
/// </summary>
public static class OwnershipMapDemo
{
    /// <summary>What a run did and found.</summary>
    /// <param name="Operations">Client operations completed.</param>
    /// <param name="Transfers">Bucket transfers completed.</param>
    /// <param name="MigratedRecords">Records the transfers moved.</param>
    /// <param name="Reroutes">Operations refused by a shard that no longer owned the bucket (then routed again).</param>
    /// <param name="Misrouted">Operations that executed on a shard that did not own their bucket (must be 0).</param>
    /// <param name="LostWrites">Reads, during the run and of every key at its end, that missed an add acknowledged to the
    /// key's client (one lost add may count several times; must be 0).</param>
    /// <param name="Seconds">Duration of the run.</param>
    public sealed record Result(long Operations, long Transfers, long MigratedRecords, long Reroutes, long Misrouted, long LostWrites, double Seconds);

    /// <summary>Runs the demo and prints its result.</summary>
    /// <param name="output">Where to print.</param>
    /// <param name="duration">How long the clients run.</param>
    /// <param name="clients">Client threads.</param>
    /// <param name="shards">Shards.</param>
    /// <param name="keysPerClient">Keys each client owns (it is their only writer, so it knows their values).</param>
    /// <returns>The result.</returns>
    public static Result Run(TextWriter output, TimeSpan duration, int clients = 2, int shards = 3, int keysPerClient = 512)
    {
        ArgumentNullException.ThrowIfNull(output);
        using var cluster = new OwnershipCluster(shards);
        long operations = 0, reroutes = 0, lostWrites = 0;
        int stop = 0;
        Exception? failure = null;
        var threads = new Thread[clients];

        // Every client has its session before the clock starts (on two cores the first clients' loops starved the
        // thread still starting the others, and the whole duration could pass with no transfer).
        using var ready = new CountdownEvent(clients);
        using var go = new ManualResetEventSlim();
        for (int c = 0; c < clients; c++)
        {
            int client = c;
            threads[c] = new Thread(() =>
            {
                bool signalled = false;
                try
                {
                    var random = new Random(1000 + client);
                    var expected = new long[keysPerClient];
                    using ClusterClient session = cluster.OpenClient();
                    signalled = true;
                    ready.Signal();
                    go.Wait();
                    long done = 0;
                    while (Volatile.Read(ref stop) == 0) // acquire: pairs with the release below
                    {
                        int k = random.Next(keysPerClient);
                        long key = (long)k * clients + client;
                        if (random.Next(4) == 0)
                        {
                            session.Read(key, out long value);
                            if (value != expected[k])
                                Interlocked.Increment(ref lostWrites);
                        }
                        else
                        {
                            session.Add(key, 1);
                            expected[k]++;
                        }
                        done++;
                    }
                    for (int k = 0; k < keysPerClient; k++)
                    {
                        session.Read((long)k * clients + client, out long value);
                        if (value != expected[k])
                            Interlocked.Increment(ref lostWrites);
                    }
                    Interlocked.Add(ref operations, done);
                    Interlocked.Add(ref reroutes, session.Reroutes);
                }
                catch (Exception ex)
                {
                    Interlocked.CompareExchange(ref failure, ex, null);
                    if (!signalled)
                        ready.Signal(); // the coordinator must not wait for ever for a client that failed to start
                }
            })
            { IsBackground = true, Name = $"ownership client {c}" };
            threads[c].Start();
        }

        ready.Wait();
        var clock = Stopwatch.StartNew();
        go.Set();

        // The coordinator: move the buckets of random client keys to random other shards, back to back (at least one,
        // however short the run).
        var picker = new Random(7);
        do
        {
            long key = (long)picker.Next(keysPerClient) * clients + picker.Next(clients);
            ushort bucket = KeyBuckets.Of(key);
            int owner = cluster.Directory.OwnerOf(bucket);
            cluster.Transfer(bucket, (owner + 1 + picker.Next(shards - 1)) % shards);
        }
        while (clock.Elapsed < duration && Volatile.Read(ref failure) is null);
        Volatile.Write(ref stop, 1); // release
        foreach (Thread thread in threads)
        {
            if (!thread.Join(TimeSpan.FromSeconds(30)))
                throw new TimeoutException("An ownership client did not stop within 30 s.");
        }
        if (failure is not null)
            throw new InvalidOperationException("An ownership client failed.", failure);

        var result = new Result(operations, cluster.Transfers, cluster.MigratedRecords, reroutes, cluster.Directory.MisroutedOperations, lostWrites, clock.Elapsed.TotalSeconds);
        output.WriteLine($"  {shards} shards (FASTER.core FasterKV each), {clients} client threads, {clients * keysPerClient:N0} keys, {result.Seconds:0.0} s");
        output.WriteLine($"  {result.Operations:N0} operations ({result.Operations / result.Seconds / 1e6:0.00} M/s) while {result.Transfers:N0} bucket transfers moved {result.MigratedRecords:N0} records");
        output.WriteLine($"  {result.Reroutes:N0} operations refused by a former owner and rerouted");
        output.WriteLine($"  misrouted operations (executed on a shard not owning the bucket): {result.Misrouted}");
        output.WriteLine($"  lost writes (a read or the final value missing an acknowledged add): {result.LostWrites}");
        return result;
    }
}
