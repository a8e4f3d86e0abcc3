using System;
using System.Collections.Generic;
using System.Linq;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// A probe's check that held (kept as a regression test): writers of all three structures racing the heap's Dispose: each writer owns its keys and records every call that
/// returned; a call that threw leaves its one key (or the batch's keys) uncertain. After the Dispose the reopened heap
/// must hold exactly the recorded state (a clean Dispose makes every completed call durable), no thread may hang, and
/// calls after the Dispose must throw ObjectDisposedException (or InvalidOperationException).
/// </summary>
public sealed class DisposeRaceStructureTests
{
    private readonly ITestOutputHelper _output;

    public DisposeRaceStructureTests(ITestOutputHelper output) => _output = output;

    [Theory]
    [InlineData(1)]
    [InlineData(2)]
    [InlineData(3)]
    [InlineData(4)]
    [InlineData(5)]
    [InlineData(6)]
    public void Writers_RacingDispose_ReopenHoldsExactlyTheCompletedCalls(int seed)
    {
        using var dir = new TempDirectory();
        string path = dir.File("race.heap");
        var options = new HeapFileOptions { Size = 32L << 20, Domain = PersistenceDomainKind.MappedFile };
        const int Threads = 3;
        var expectedMap = new Dictionary<long, long>[Threads];
        var uncertainMap = new HashSet<long>[Threads];
        var expectedBytes = new Dictionary<long, byte>[Threads];
        var uncertainBytes = new HashSet<long>[Threads];
        var errors = new List<string>();
        long queueEnqueued = 0, queueDequeued = 0, queueUncertain = 0;
        long calls = 0;
        BufferedDurableHeap heap = BufferedDurableHeap.Create(path, options, new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromMilliseconds(2) });
        var map = new PersistentHashMap<long, long>(heap, typeId: 1);
        var bytes = new PersistentByteMap<long>(heap, typeId: 2);
        var queue = new PersistentQueue<long>(heap, typeId: 3);
        using var started = new CountdownEvent(Threads);
        var threads = new Thread[Threads];
        for (int t = 0; t < Threads; t++)
        {
            int id = t;
            expectedMap[id] = new();
            uncertainMap[id] = new();
            expectedBytes[id] = new();
            uncertainBytes[id] = new();
            threads[id] = new Thread(() =>
            {
                var random = new Random(seed * 31 + id);
                var batch = new KeyValuePair<long, long>[100];
                started.Signal();
                long step = 0;
                while (true)
                {
                    step++;
                    Interlocked.Increment(ref calls);
                    long key = (id * 1_000_000L) + random.Next(2000);
                    int what = random.Next(7);
                    try
                    {
                        switch (what)
                        {
                            case 0:
                                map.Set(key, step);
                                expectedMap[id][key] = step;
                                break;
                            case 1:
                                map.Remove(key);
                                expectedMap[id].Remove(key);
                                break;
                            case 2:
                                for (int i = 0; i < batch.Length; i++)
                                {
                                    batch[i] = new((id * 1_000_000L) + random.Next(2000), step * 1000 + i);
                                }

                                map.SetMany(batch);
                                foreach (var item in batch)
                                {
                                    expectedMap[id][item.Key] = item.Value;
                                }

                                break;
                            case 3:
                                bytes.Set(key, new byte[1 + (int)(step % 300)].AsSpan());
                                expectedBytes[id][key] = (byte)(1 + (int)(step % 300) % 256);
                                break;
                            case 4:
                                bytes.Remove(key);
                                expectedBytes[id].Remove(key);
                                break;
                            case 5:
                                queue.Enqueue(step);
                                Interlocked.Increment(ref queueEnqueued);
                                break;
                            default:
                                if (queue.TryDequeue(out _))
                                {
                                    Interlocked.Increment(ref queueDequeued);
                                }

                                break;
                        }
                    }
                    catch (Exception e) when (e is ObjectDisposedException || e is InvalidOperationException)
                    {
                        switch (what)
                        {
                            case 0 or 1: uncertainMap[id].Add(key); break;
                            case 2: foreach (var item in batch) { uncertainMap[id].Add(item.Key); } break;
                            case 3 or 4: uncertainBytes[id].Add(key); break;
                            default: Interlocked.Increment(ref queueUncertain); break;
                        }

                        if (e is not ObjectDisposedException)
                        {
                            lock (errors) { errors.Add($"thread {id}: {e.Message}"); }
                        }

                        return;
                    }
                    catch (Exception e)
                    {
                        lock (errors) { errors.Add($"thread {id}: unexpected {e}"); }
                        return;
                    }
                }
            })
            { IsBackground = true };
            threads[id].Start();
        }

        started.Wait();

        // Dispose once the writers have made a seed-dependent number of calls between them (a different point per seed).
        long target = 500 + (seed * 700);
        var spinner = new SpinWait();
        while (Interlocked.Read(ref calls) < target && threads.Any(t => t.IsAlive))
        {
            spinner.SpinOnce();
        }

        Exception? dispose = Record.Exception(heap.Dispose);
        foreach (Thread thread in threads)
        {
            Assert.True(thread.Join(TimeSpan.FromSeconds(30)), "a writer hung after Dispose");
        }

        Assert.Null(dispose);
        Assert.Empty(errors);

        using BufferedDurableHeap reopened = BufferedDurableHeap.Open(path, options);
        Dictionary<long, long> gotMap = new PersistentHashMap<long, long>(reopened, typeId: 1).ToDictionary();
        var gotBytes = new PersistentByteMap<long>(reopened, typeId: 2).ToList().ToDictionary(e => e.Key, e => e.Value);
        long gotQueue = new PersistentQueue<long>(reopened, typeId: 3).Count;
        var problems = new List<string>();
        for (int id = 0; id < Threads; id++)
        {
            foreach (long key in expectedMap[id].Keys.Union(gotMap.Keys.Where(k => k / 1_000_000 == id)))
            {
                if (uncertainMap[id].Contains(key))
                {
                    continue;
                }

                bool e = expectedMap[id].TryGetValue(key, out long ev);
                bool g = gotMap.TryGetValue(key, out long gv);
                if (e != g || ev != gv)
                {
                    problems.Add($"map key {key}: expected {(e ? ev : "absent")}, reopened {(g ? gv : "absent")}");
                }
            }

            foreach (long key in expectedBytes[id].Keys.Union(gotBytes.Keys.Where(k => k / 1_000_000 == id)))
            {
                if (uncertainBytes[id].Contains(key))
                {
                    continue;
                }

                bool e = expectedBytes[id].ContainsKey(key);
                bool g = gotBytes.ContainsKey(key);
                if (e != g)
                {
                    problems.Add($"byte map key {key}: expected {(e ? "present" : "absent")}, reopened {(g ? "present" : "absent")}");
                }
            }
        }

        long expectedQueue = queueEnqueued - queueDequeued;
        if (Math.Abs(gotQueue - expectedQueue) > queueUncertain)
        {
            problems.Add($"queue: expected {expectedQueue} ± {queueUncertain}, reopened {gotQueue}");
        }

        _output.WriteLine($"map {gotMap.Count}, bytes {gotBytes.Count}, queue {gotQueue}; fast reopen {reopened.Recovery.FastReopen}");
        Assert.True(problems.Count == 0, string.Join("\n", problems.Take(20)));
    }
}
