using System;
using System.Collections.Concurrent;
using System.Collections.Generic;
using System.Diagnostics;
using System.Linq;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// A probe's model checks of <see cref="PersistentByteMap{TKey}"/> under concurrency, kept as regression tests: threads
/// setting, removing and reading their own and shared keys, whose GetHashCode and Equals throw now and then, beside the
/// background advancer, Syncs and a reader of the whole map (or interrupts): every call that returned is reflected, one
/// that threw changed nothing, Count agrees with the entries, and a reopen after Dispose equals the running map.
/// </summary>
public sealed class ByteMapConcurrencyTests
{
    private readonly ITestOutputHelper _output;

    public ByteMapConcurrencyTests(ITestOutputHelper output) => _output = output;

    private static readonly int[] Sizes = { 0, 3, 50, 700, 5000, 40_000 };

    internal static byte[] ValueOf(long key, long seq, int size)
    {
        var v = new byte[size];
        var r = new Random(HashCode.Combine(key, seq));
        r.NextBytes(v);
        if (size >= 16)
        {
            BitConverter.TryWriteBytes(v.AsSpan(0, 8), key);
            BitConverter.TryWriteBytes(v.AsSpan(8, 8), seq);
        }

        return v;
    }

    [Theory]
    [InlineData(1, 30, false)]
    [InlineData(4, 30, true)]
    public void ManyThreads_ThrowingKeys_AdvancerAndSyncs_MapMatchesModelAndReopen(int seed, int perMille, bool full) => Run(seed, perMille, full, interrupt: false);

    [Theory]
    [InlineData(6, 30)]
    public void ManyThreads_Interrupted_MapMatchesModelAndReopenByValue(int seed, int perMille) => Run(seed, perMille, full: false, interrupt: true);

    private void Run(int seed, int perMille, bool full, bool interrupt)
    {
        long interrupted = 0;
        using var dir = new TempDirectory();
        string path = dir.File("m.heap");
        var fileOptions = full
            ? new HeapFileOptions { Size = 3L << 20, MaxSize = 3L << 20, Domain = PersistenceDomainKind.MappedFile }
            : new HeapFileOptions { Size = 64L << 20, Domain = PersistenceDomainKind.MappedFile };
        long full_ = 0;
        const int workers = 6, ownKeys = 40;
        var models = new Dictionary<long, byte[]>[workers];
        var failures = new ConcurrentQueue<string>();
        long ops = 0, thrown = 0;
        Dictionary<long, (long Tag, byte[] Value)> running;
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, fileOptions, new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromMilliseconds(1) }))
        {
            var map = new PersistentByteMap<ProbeKey>(heap, 9);
            using var stop = new CancellationTokenSource(TimeSpan.FromSeconds(4));
            var threads = new List<Thread>();
            for (int t = 0; t < workers; t++)
            {
                int id = t;
                models[id] = new Dictionary<long, byte[]>();
                threads.Add(new Thread(() =>
                {
                    var random = new Random(seed * 100 + id);
                    var model = models[id];
                    long seq = 0;
                    try
                    {
                        while (!stop.IsCancellationRequested)
                        {
                            bool shared = random.Next(10) == 0;
                            long k = shared ? 100_000 + random.Next(10) : id * 1000 + random.Next(ownKeys);
                            var key = new ProbeKey(k, tag: random.Next(3));
                            int what = random.Next(10);
                            ProbeKey.ThrowPerMille = perMille;
                            try
                            {
                                if (what < 6)
                                {
                                    byte[] value = ValueOf(k, ++seq, Sizes[random.Next(Sizes.Length)]);
                                    bool added = map.Set(key, value);
                                    if (!shared)
                                    {
                                        if (added == model.ContainsKey(k))
                                        {
                                            failures.Enqueue($"Set {k}: added={added} but model has={model.ContainsKey(k)}");
                                        }

                                        model[k] = value;
                                    }
                                }
                                else if (what < 9)
                                {
                                    bool removed = map.Remove(key);
                                    if (!shared)
                                    {
                                        if (removed != model.Remove(k))
                                        {
                                            failures.Enqueue($"Remove {k}: removed={removed} disagrees with the model");
                                        }
                                    }
                                }
                                else
                                {
                                    byte[]? got = map.Get(key);
                                    if (!shared)
                                    {
                                        byte[]? want = model.TryGetValue(k, out byte[]? w) ? w : null;
                                        if (!(got == null ? want == null : want != null && got.AsSpan().SequenceEqual(want)))
                                        {
                                            failures.Enqueue($"Get {k}: {got?.Length} vs model {want?.Length}");
                                        }
                                    }
                                }
                            }
                            catch (ProbeKeyException)
                            {
                                Interlocked.Increment(ref thrown);
                            }
                            catch (InsufficientMemoryException) when (full)
                            {
                                Interlocked.Increment(ref full_);
                            }
                            catch (ThreadInterruptedException) when (interrupt && !shared)
                            {
                                // Outcome unknown: adopt what the running map shows (the reopen is then checked against it).
                                Interlocked.Increment(ref interrupted);
                                ProbeKey.ThrowPerMille = 0;
                                byte[]? now = null;
                                for (int attempt = 0; ; attempt++)
                                {
                                    try
                                    {
                                        now = map.Get(new ProbeKey(k));
                                        break;
                                    }
                                    catch (ThreadInterruptedException)
                                    {
                                    }
                                }

                                if (now == null)
                                {
                                    model.Remove(k);
                                }
                                else
                                {
                                    model[k] = now;
                                }
                            }
                            catch (ThreadInterruptedException) when (interrupt)
                            {
                                Interlocked.Increment(ref interrupted);
                            }
                            finally
                            {
                                ProbeKey.ThrowPerMille = 0;
                            }

                            Interlocked.Increment(ref ops);
                            if (!shared)
                            {
                                // After any op (thrown or not) the key holds the model's value.
                                byte[]? got;
                                while (true)
                                {
                                    try
                                    {
                                        got = map.Get(new ProbeKey(k));
                                        break;
                                    }
                                    catch (ThreadInterruptedException) when (interrupt)
                                    {
                                    }
                                }

                                byte[]? want = model.TryGetValue(k, out byte[]? w) ? w : null;
                                if (!(got == null ? want == null : want != null && got.AsSpan().SequenceEqual(want)))
                                {
                                    failures.Enqueue($"after op {what} on {k}: {got?.Length} vs model {want?.Length}");
                                }
                            }
                        }
                    }
                    catch (Exception e)
                    {
                        failures.Enqueue($"worker {id}: {e}");
                    }
                }));
            }

            threads.Add(new Thread(() =>
            {
                var random = new Random(seed);
                try
                {
                    while (!stop.IsCancellationRequested)
                    {
                        if (random.Next(2) == 0)
                        {
                            heap.Sync(TimeSpan.FromSeconds(30));
                        }
                        else
                        {
                            heap.AdvanceVersion(TimeSpan.FromSeconds(30));
                        }
                    }
                }
                catch (Exception e)
                {
                    failures.Enqueue($"syncer: {e}");
                }
            }));
            if (interrupt)
            {
                var victims = threads.Take(workers).ToArray();
                threads.Add(new Thread(() =>
                {
                    var random = new Random(seed);
                    while (!stop.IsCancellationRequested)
                    {
                        victims[random.Next(victims.Length)].Interrupt();
                        Thread.SpinWait(2000 + random.Next(20000));
                    }
                }));
            }

            threads.Add(new Thread(() =>
            {
                try
                {
                    while (!stop.IsCancellationRequested)
                    {
                        var list = map.ToList();
                        if (list.Select(p => p.Key.Value).Distinct().Count() != list.Count)
                        {
                            failures.Enqueue("ToList has a key twice");
                        }

                        long c = map.Count;
                        if (c < 0 || c > workers * ownKeys + 10)
                        {
                            failures.Enqueue($"Count {c} out of range");
                        }
                    }
                }
                catch (Exception e)
                {
                    failures.Enqueue($"reader: {e}");
                }
            }));

            Workers.StartAndJoin(threads, TimeSpan.FromSeconds(120));

            // Pending interrupts of finished threads are harmless; the test thread was never interrupted.

            Assert.Empty(failures);
            var list = map.ToList();
            Assert.Equal(map.Count, list.Count);
            running = list.ToDictionary(p => p.Key.Value, p => (p.Key.Tag, p.Value));
            for (int t = 0; t < workers; t++)
            {
                foreach (var (k, v) in models[t])
                {
                    Assert.True(running.TryGetValue(k, out var r), $"key {k} missing");
                    Assert.Equal(v, r.Value);
                }

                Assert.Equal(models[t].Count, running.Keys.Count(k => k / 1000 == t && k < 100_000));
            }

            heap.Sync();
        }

        _output.WriteLine($"ops {ops}, thrown {thrown}, full {full_}, interrupted {interrupted}, live {running.Count}");
        using BufferedDurableHeap reopened = BufferedDurableHeap.Open(path, fileOptions, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
        Assert.True(reopened.Heap.File.WasCleanShutdown);
        var again = new PersistentByteMap<ProbeKey>(reopened, 9);
        var list2 = again.ToList();
        Assert.Equal(again.Count, list2.Count);
        Assert.Equal(running.Count, list2.Count);
        foreach (var p in list2)
        {
            Assert.True(running.TryGetValue(p.Key.Value, out var r), $"reopened has extra key {p.Key}");
            Assert.Equal(r.Value, p.Value);
            if (!interrupt)
            {
                Assert.Equal(r.Tag, p.Key.Tag);
            }
        }
    }
}
