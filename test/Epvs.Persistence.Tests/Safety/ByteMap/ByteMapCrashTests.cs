using System;
using System.Collections.Concurrent;
using System.Collections.Generic;
using System.Linq;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// A probe's crash checks of <see cref="PersistentByteMap{TKey}"/>, kept as regression tests: crash images taken at
/// random points under threads with throwing keys recover, per thread, a prefix of its operations covering every Sync that
/// returned.
/// </summary>
public sealed class ByteMapCrashTests
{
    private const long Capacity = 32L << 20;
    private readonly ITestOutputHelper _output;

    public ByteMapCrashTests(ITestOutputHelper output) => _output = output;

    private static readonly int[] Sizes = { 0, 3, 50, 700, 5000 };

    /// <summary>The most crash points one run arms (and so captures: each image copies the whole domain).</summary>
    private const int MaxArmed = 40;

    [Theory]
    [InlineData(11, 50)]
    [InlineData(13, 150)]
    public void Crash_ManyThreadsWithThrowingKeys_EachThreadRecoversAPrefixCoveringItsSyncs(int seed, int perMille)
    {
        const int workers = 4, ownKeys = 30;
        var logs = new List<(long Key, byte[]? Value)>[workers];
        var counts = new int[workers];
        var promises = new List<(long Point, int[] Counts)>();
        var failures = new ConcurrentQueue<string>();
        List<SimulatedCrash> captured;
        using (var domain = new SimulatedPersistenceDomain(Capacity))
        {
            using (HeapFile file = HeapFile.Create(domain))
            using (BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromMilliseconds(2) }))
            {
                var map = new PersistentByteMap<ProbeKey>(heap, 21);
                using var stop = new CancellationTokenSource(TimeSpan.FromSeconds(3));
                var threads = new List<Thread>();
                for (int t = 0; t < workers; t++)
                {
                    int id = t;
                    logs[id] = new List<(long, byte[]?)>();
                    threads.Add(new Thread(() =>
                    {
                        var random = new Random(seed * 10 + id);
                        long seq = 0;
                        try
                        {
                            while (!stop.IsCancellationRequested)
                            {
                                long k = id * 1000 + random.Next(ownKeys);
                                var key = new ProbeKey(k, random.Next(2));
                                ProbeKey.ThrowPerMille = perMille;
                                try
                                {
                                    if (random.Next(10) < 7)
                                    {
                                        byte[] value = ByteMapConcurrencyTests.ValueOf(k, ++seq, Sizes[random.Next(Sizes.Length)]);
                                        map.Set(key, value);
                                        logs[id].Add((k, value));
                                    }
                                    else if (map.Remove(key))
                                    {
                                        logs[id].Add((k, null));
                                    }
                                }
                                catch (ProbeKeyException)
                                {
                                }
                                finally
                                {
                                    ProbeKey.ThrowPerMille = 0;
                                }

                                Volatile.Write(ref counts[id], logs[id].Count);
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
                    int armed = 0;
                    var running = System.Diagnostics.Stopwatch.StartNew();
                    try
                    {
                        while (!stop.IsCancellationRequested)
                        {
                            int[] snapshot = new int[workers];
                            for (int i = 0; i < workers; i++)
                            {
                                snapshot[i] = Volatile.Read(ref counts[i]);
                            }

                            if (random.Next(3) == 0)
                            {
                                heap.AdvanceVersion(TimeSpan.FromSeconds(30));
                            }
                            else
                            {
                                heap.Sync(TimeSpan.FromSeconds(30));
                                lock (promises)
                                {
                                    promises.Add((domain.CrashPointCount, snapshot));
                                }
                            }

                            // Arm a crash a little ahead, up to MaxArmed: each captured image is a copy of the
                            // 32 MiB domain, and arming for the whole 3 s captured hundreds of them (9 GB of the test
                            // host's memory, of which only about 60 were ever checked: a CI run's host was killed for
                            // want of memory).
                            // Spread over the run (one arm per 3 s / MaxArmed), so late states are checked too.
                            try
                            {
                                if (armed < MaxArmed && running.Elapsed.TotalMilliseconds >= 3000.0 * armed / MaxArmed)
                                {
                                    domain.ArmCrash(domain.CrashPointCount + 200 + random.Next(3000), random.Next());
                                    armed++;
                                }
                            }
                            catch (ArgumentOutOfRangeException)
                            {
                                // The point passed meanwhile (other threads write back).
                            }
                        }
                    }
                    catch (Exception e)
                    {
                        failures.Enqueue($"syncer: {e}");
                    }
                }));

                Workers.StartAndJoin(threads, TimeSpan.FromSeconds(120));

                Assert.Empty(failures);
                Assert.Equal(map.Count, map.ToList().Count);
            }

            captured = domain.CapturedCrashes.ToList();
        }

        var violations = new List<string>();
        int checkedImages = 0;
        foreach (SimulatedCrash crash in captured.Where((_, i) => i % Math.Max(1, captured.Count / 60) == 0))
        {
            checkedImages++;
            using var domain = SimulatedPersistenceDomain.FromImage(crash.Image, Capacity);
            using HeapFile file = HeapFile.Open(domain);
            Dictionary<long, byte[]> recovered;
            long count;
            try
            {
                using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
                var map = new PersistentByteMap<ProbeKey>(heap, 21);
                var list = map.ToList();
                count = map.Count;
                recovered = list.ToDictionary(p => p.Key.Value, p => p.Value);
                if (count != list.Count)
                {
                    violations.Add($"point {crash.Point}: Count {count} != {list.Count}");
                }
            }
            catch (Exception e)
            {
                violations.Add($"point {crash.Point}: open failed: {e.GetType().Name} {e.Message}");
                continue;
            }

            int[] promised = new int[workers];
            foreach (var p in promises.Where(p => p.Point <= crash.Point))
            {
                for (int i = 0; i < workers; i++)
                {
                    promised[i] = Math.Max(promised[i], p.Counts[i]);
                }
            }

            for (int t = 0; t < workers; t++)
            {
                var mine = recovered.Where(p => p.Key / 1000 == t).ToDictionary(p => p.Key, p => p.Value);
                if (Prefix(logs[t], mine, promised[t]) < 0)
                {
                    violations.Add($"point {crash.Point} seed {crash.Seed}: thread {t}'s keys ({mine.Count}) are no prefix of its {logs[t].Count} ops at or after {promised[t]}");
                }
            }
        }

        _output.WriteLine($"{captured.Count} images, {checkedImages} checked, ops {string.Join(",", logs.Select(l => l.Count))}, promises {promises.Count}");
        Assert.True(checkedImages >= 5, $"only {checkedImages} images");
        Assert.Empty(violations);
    }

    private static int Prefix(List<(long Key, byte[]? Value)> log, Dictionary<long, byte[]> recovered, int promised)
    {
        var running = new Dictionary<long, byte[]>();
        bool Same(long k) => running.TryGetValue(k, out byte[]? a) ? recovered.TryGetValue(k, out byte[]? b) && a.AsSpan().SequenceEqual(b) : !recovered.ContainsKey(k);
        int diff = recovered.Count;
        for (int n = 0; ; n++)
        {
            if (n >= promised && diff == 0)
            {
                return n;
            }

            if (n == log.Count)
            {
                return -1;
            }

            var (key, value) = log[n];
            bool before = Same(key);
            if (value == null)
            {
                running.Remove(key);
            }
            else
            {
                running[key] = value;
            }

            diff += (before ? 1 : 0) - (Same(key) ? 1 : 0);
        }
    }
}
