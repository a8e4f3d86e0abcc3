#pragma warning disable CA1031, CA1303, CA1305, CA1307, CA1310, CA2000, IDE0058, IDE0059, IDE0060
using System;
using System.Collections.Generic;
using System.IO;
using System.Threading;

namespace Epvs.Persistence.Tests;

/// <summary>
/// Child-process scenarios of the argument tests (<see cref="ArgumentTests"/>): each prints one line per call,
/// "call: outcome", and exits 0 when it ran to its end; a crash kills only the child.
/// </summary>
internal static class ArgumentsChild
{
    internal const string Role = "arguments";

    internal static int Run(string scenario, string path)
    {
        try
        {
            return scenario switch
            {
                "sim-durable-image-after-dispose" => SimAfterDispose(d => d.GetDurableImage()),
                "sim-crash-after-dispose" => SimAfterDispose(d => d.Crash(1)),
                "sim-calls-racing-dispose" => SimCallsRacingDispose(),
                "domain-persist-racing-heap-dispose" => DomainPersistRacingHeapDispose(path),
                "explore-raw" => ExploreRaw(path),
                "explore-durable" => ExploreDurable(path),
                "explore-domain" => ExploreDomain(),
                "explore-uid" => ExploreUid(path),
                "explore-options" => ExploreOptions(path),
                "explore-structures" => ExploreStructures(path),
                _ => throw new ArgumentException($"unknown scenario {scenario}"),
            };
        }
        catch (Exception e)
        {
            Console.WriteLine($"unexpected: {e}");
            return 3;
        }
    }

    internal static string Try(string name, Action action)
    {
        string outcome = Outcome(action);
        Console.WriteLine($"{name}: {outcome}");
        Console.Out.Flush();
        return outcome;
    }

    /// <summary>"ok", or the exception's type and message (<see cref="Try"/> without the printed line).</summary>
    internal static string Outcome(Action action)
    {
        try
        {
            action();
            return "ok";
        }
        catch (Exception e)
        {
            return $"{e.GetType().Name}: {e.Message}";
        }
    }

    private static int SimAfterDispose(Func<SimulatedPersistenceDomain, byte[]> call)
    {
        // 4 MiB: the native allocation is an mmap of its own, unmapped by the free.
        var domain = new SimulatedPersistenceDomain(4L << 20);
        domain.GetSpan(0, 64).Fill(0xAB);
        domain.Persist(0, 64);
        domain.Dispose();
        try
        {
            byte[] image = call(domain);
            Console.WriteLine($"returned {image.Length} bytes after Dispose (first byte 0x{image[0]:X2})");
            return 5;
        }
        catch (ObjectDisposedException e)
        {
            Console.WriteLine($"ObjectDisposedException: {e.Message}");
            return 0;
        }
    }

    /// <summary>
    /// Two threads call a bare simulated domain's public WriteBack/Fence/Persist while the main thread disposes it.
    /// The calls check IsDisposed (CheckRange, Fence) before they take the domain's gate, and the Core methods do not
    /// look again under it: a call past the check reads a line from the freed working image and copies it into the freed
    /// durable image. Bounded by time (8 s); exit 0 when every round ends with ObjectDisposedException or success.
    /// </summary>
    private static int SimCallsRacingDispose()
    {
        var clock = System.Diagnostics.Stopwatch.StartNew();
        int rounds = 0;
        while (clock.Elapsed < TimeSpan.FromSeconds(8))
        {
            var domain = new SimulatedPersistenceDomain(64L << 10);
            RaceCallsWithDispose(
                which =>
                {
                    if (which == 0)
                    {
                        domain.Persist(0, 64L << 10);
                    }
                    else
                    {
                        domain.WriteBack(0, 4096);
                        domain.Fence();
                    }
                },
                rounds % 7 * 500,
                domain.Dispose,
                _ => false);
            rounds++;
        }

        Console.WriteLine($"{rounds} rounds, no crash");
        return 0;
    }

    /// <summary>
    /// A thread calls <c>heap.Heap.File.Domain.Persist</c> (a public call that touches the mapping) while another disposes
    /// the buffered heap that owns the file. The file's Dispose waits for the heap's calls in flight, not for the domain's
    /// own public calls, and unmaps: with libpmem (PMEM_IS_PMEM_FORCE=1, or real persistent memory) pmem_flush then runs
    /// CLWB on an unmapped address (SIGSEGV); through msync the call throws IOException (ENOMEM) instead of
    /// ObjectDisposedException. 40 rounds; exit 0 when every call ended with success or ObjectDisposedException.
    /// </summary>
    private static int DomainPersistRacingHeapDispose(string path)
    {
        int other = 0;
        for (int round = 0; round < 40; round++)
        {
            string file = path + round;
            var heap = BufferedDurableHeap.Create(file, new HeapFileOptions { Size = 4L << 20, Domain = PersistenceDomainKind.Pmem }, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
            PersistenceDomain domain = heap.Heap.File.Domain;
            if (round == 0)
            {
                Console.WriteLine($"domain {domain.Kind}, persistent memory: {domain.IsPersistentMemory}");
            }

            int thisRound = round;
            RaceCallsWithDispose(
                _ => domain.Persist(4096, 65536),
                round % 10 * 3000,
                heap.Dispose,
                e =>
                {
                    Console.WriteLine($"round {thisRound}: {e.GetType().Name}: {e.Message}");
                    Interlocked.Increment(ref other);
                    return true;
                });
            File.Delete(file);
        }

        Console.WriteLine($"40 rounds, no crash; {other} calls failed with another exception than ObjectDisposedException");
        return other == 0 ? 0 : 6;
    }

    /// <summary>
    /// Two threads loop <paramref name="call"/> (given their index) until it throws <see cref="ObjectDisposedException"/>
    /// or <paramref name="onOther"/> takes another exception (returning true: stop; false: rethrow), while this thread,
    /// once both have started and after <paramref name="spins"/> spins, runs <paramref name="dispose"/>.
    /// </summary>
    private static void RaceCallsWithDispose(Action<int> call, int spins, Action dispose, Func<Exception, bool> onOther)
    {
        int stop = 0;
        int started = 0;
        var threads = new Thread[2];
        for (int t = 0; t < threads.Length; t++)
        {
            int which = t;
            threads[t] = new Thread(() =>
            {
                Interlocked.Increment(ref started);
                while (Volatile.Read(ref stop) == 0)
                {
                    try
                    {
                        call(which);
                    }
                    catch (ObjectDisposedException)
                    {
                        break;
                    }
                    catch (Exception e) when (onOther(e))
                    {
                        break;
                    }
                }
            });
            threads[t].Start();
        }

        while (Volatile.Read(ref started) < threads.Length)
        {
            Thread.Yield();
        }

        for (int spin = 0; spin < spins; spin++)
        {
            Thread.SpinWait(5);
        }

        dispose();
        Volatile.Write(ref stop, 1);
        foreach (Thread thread in threads)
        {
            thread.Join();
        }
    }

    private static int ExploreRaw(string path)
    {
        using PersistentHeap heap = PersistentHeap.Create(path, new HeapFileOptions { Size = 4L << 20, MaxSize = 8L << 20 });
        PayloadRef a = heap.Allocate(100, 1);
        PayloadRef freed = heap.Allocate(100, 1);
        heap.Free(freed);
        PayloadRef large = heap.Allocate(200_000, 1);
        long dataStart = a.Offset - (a.Offset % 65536 == 0 ? 0 : 0);
        Console.WriteLine($"a={a} large={large} MaxPayloadSize={heap.MaxPayloadSize} Size={heap.File.Size} segs={heap.File.SegmentCount}");
        var refs = new List<(string, long)>
        {
            ("zero", 0), ("negative", -1), ("long.Min", long.MinValue), ("long.Max", long.MaxValue), ("superblock", 64),
            ("table", 4096 + 8), ("a+1", a.Offset + 1), ("a+32", a.Offset + 32), ("a+8", a.Offset + 8), ("freed", freed.Offset),
            ("large+65536", large.Offset + 65536), ("large+128", large.Offset + 128), ("pastEnd", heap.File.Size), ("pastEnd+big", heap.File.Size + (1L << 40)),
        };
        foreach ((string name, long offset) in refs)
        {
            var r = new PayloadRef(offset);
            Try($"GetHeader({name})", () => heap.GetHeader(r));
            Try($"GetPayload({name})", () => heap.GetPayload(r));
            Try($"GetPayloadAddress({name})", () => heap.GetPayloadAddress(r));
            Try($"WriteBack({name})", () => heap.WriteBack(r));
            Try($"WriteBackHeader({name})", () => heap.WriteBackHeader(r));
            Try($"Persist({name})", () => heap.Persist(r));
            Try($"Free({name})", () => heap.Free(r));
        }

        foreach (int size in new[] { -1, int.MinValue, int.MaxValue, heap.MaxPayloadSize + 1, heap.MaxPayloadSize, 16352, 16353, 0 })
        {
            Try($"Allocate({size})", () => heap.Allocate(size, 1));
            Try($"TryAllocate({size})", () => heap.TryAllocate(size, 1, out _));
        }

        Try("Allocate(kind 0)", () => heap.Allocate(8, 1, kind: 0));
        Try("Allocate(kind 4)", () => heap.Allocate(8, 1, kind: (PayloadKind)4));
        Try("Allocate(kind -1)", () => heap.Allocate(8, 1, kind: (PayloadKind)(-1)));
        Try("Allocate(uid -1)", () => heap.Allocate(8, 1, uid: -1));
        Try("Allocate(typeId -1, epoch -1)", () => Console.WriteLine(heap.GetHeader(heap.Allocate(8, -1, epochTag: -1))));
        Try("Allocate(epoch long.Max)", () => Console.WriteLine(heap.GetHeader(heap.Allocate(8, int.MaxValue, epochTag: long.MaxValue))));
        Try("ForEachAllocated(0)", () => heap.ForEachAllocated((_, _) => { }, 0));
        Try("ForEachAllocated(-1)", () => heap.ForEachAllocated((_, _) => { }, -1));
        Try("ForEachAllocated(int.Max)", () => heap.ForEachAllocated((_, _) => { }, int.MaxValue));
        Try("ForEachAllocated(throwing visitor)", () => heap.ForEachAllocated((_, _) => throw new FormatException("visitor")));
        Try("ForEachAllocated(visitor frees)", () => heap.ForEachAllocated((r, _) => heap.Free(r)));
        Try("GetRoot(-1)", () => heap.File.GetRoot(-1));
        Try("GetRoot(16)", () => heap.File.GetRoot(16));
        Try("SetRoot(16)", () => heap.File.SetRoot(16, 1));
        Try("SetRoot(int.Min)", () => heap.File.SetRoot(int.MinValue, 1));
        Try("Domain.GetSpan(-1,1)", () => heap.File.Domain.GetSpan(-1, 1));
        Try("Domain.GetSpan(0,-1)", () => heap.File.Domain.GetSpan(0, -1));
        Try("Domain.Persist(Len,1)", () => heap.File.Domain.Persist(heap.File.Domain.Length, 1));
        Try("Domain.Persist(1,long.Max)", () => heap.File.Domain.Persist(1, long.MaxValue));
        Try("Domain.WriteBack(long.Max,long.Max)", () => heap.File.Domain.WriteBack(long.MaxValue, long.MaxValue));
        Try("Domain.TryGrow(-1)", () => Console.WriteLine(heap.File.Domain.TryGrow(-1)));
        Try("Domain.TryGrow(long.Max)", () => Console.WriteLine(heap.File.Domain.TryGrow(long.MaxValue)));
        Try("Domain.TryGrow(Len+1)", () => Console.WriteLine(heap.File.Domain.TryGrow(heap.File.Domain.Length + 1)));
        Console.WriteLine($"after: Size={heap.File.Size} DomainLen={heap.File.Domain.Length} Cap={heap.File.Domain.Capacity} segs={heap.File.SegmentCount}");
        Try("Allocate after", () => heap.Allocate(100, 1));
        Try("Stats", () => Console.WriteLine(heap.GetStatistics()));
        return 0;
    }

    private static int ExploreDurable(string path)
    {
        var heap = BufferedDurableHeap.Create(path, new HeapFileOptions { Size = 4L << 20 }, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
        PayloadRef a;
        using (DurableOperation op = heap.BeginOperation())
        {
            a = op.Allocate(16, 1);
            op.GetPayload(a).Fill(1);
        }

        heap.Sync();
        int max = heap.Heap.MaxPayloadSize;
        foreach ((string name, int size, int type) in new[] { ("size -1", -1, 1), ("size int.Max", int.MaxValue, 1), ("size max+1", max + 1, 1), ("type -1", 8, -1), ("type 2^24", 8, 1 << 24), ("size 0", 0, 1) })
        {
            Try($"op.Allocate({name})", () =>
            {
                using DurableOperation op = heap.BeginOperation();
                op.Allocate(size, type);
            });
        }

        foreach ((string name, long offset) in new[] { ("zero", 0L), ("neg", -8L), ("superblock", 64L), ("a+32", a.Offset + 32), ("a+1", a.Offset + 1), ("past", long.MaxValue) })
        {
            var r = new PayloadRef(offset);
            Try($"op.GetPayload({name})", () => { using DurableOperation op = heap.BeginOperation(); op.GetPayload(r); });
            Try($"op.Replace({name})", () => { using DurableOperation op = heap.BeginOperation(); op.Replace(r, 8); });
            Try($"op.Delete({name})", () => { using DurableOperation op = heap.BeginOperation(); op.Delete(r); });
        }

        Try("op.Replace(a, -1)", () => { using DurableOperation op = heap.BeginOperation(); op.Replace(a, -1); });
        Try("op.Replace(a, int.Max)", () => { using DurableOperation op = heap.BeginOperation(); op.Replace(a, int.MaxValue); });
        Try("TakeRecoveredPayloads(-1)", () => heap.TakeRecoveredPayloads(-1));
        Try("TakeRecoveredPayloads(1<<24)", () => heap.TakeRecoveredPayloads(1 << 24));
        Try("TakeRecoveredPayloads(int.Max)", () => heap.TakeRecoveredPayloads(int.MaxValue));
        Try("AdvanceVersion(-2ms)", () => heap.AdvanceVersion(TimeSpan.FromMilliseconds(-2)));
        Try("AdvanceVersion(Max)", () => heap.AdvanceVersion(TimeSpan.MaxValue));
        Try("AdvanceVersion(Min)", () => heap.AdvanceVersion(TimeSpan.MinValue));
        Try("AdvanceVersion(0)", () => heap.AdvanceVersion(TimeSpan.Zero));
        Try("Sync(Max)", () => heap.Sync(TimeSpan.MaxValue));
        Try("Sync(0)", () => heap.Sync(TimeSpan.Zero));
        Try("Sync", () => heap.Sync());
        using (DurableOperation op = heap.BeginOperation())
        {
            Console.WriteLine($"a: {heap.Heap.GetHeader(a)} first={op.GetPayload(a)[0]}");
        }

        heap.Dispose();
        using var reopened = BufferedDurableHeap.Open(path);
        Console.WriteLine($"reopen: {reopened.Recovery}");
        foreach (RecoveredPayload p in reopened.TakeRecoveredPayloads(1))
        {
            Console.WriteLine($"recovered {p.Block} {p.Header}");
        }

        return 0;
    }

    private static List<(PayloadRef Block, PayloadHeader Header)> Blocks(BufferedDurableHeap heap)
    {
        var blocks = new List<(PayloadRef, PayloadHeader)>();
        heap.Heap.ForEachAllocated((r, h) => { lock (blocks) { blocks.Add((r, h)); } });
        return blocks;
    }

    private static int ExploreOptions(string path)
    {
        var cases = new (string Name, BufferedDurableHeapOptions Options)[]
        {
            ("AdvancePeriod 1 tick", new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromTicks(1) }),
            ("MaxVersionAge 1 tick", new BufferedDurableHeapOptions { MaxVersionAge = TimeSpan.FromTicks(1) }),
            ("SyncTimeout 1 tick", new BufferedDurableHeapOptions { SyncTimeout = TimeSpan.FromTicks(1) }),
            ("ReclaimBacklogLimit 1", new BufferedDurableHeapOptions { ReclaimBacklogLimit = 1 }),
            ("ReclaimBacklogLimit long.Max", new BufferedDurableHeapOptions { ReclaimBacklogLimit = long.MaxValue }),
            ("RecoveryParallelism int.Max", new BufferedDurableHeapOptions { RecoveryParallelism = int.MaxValue }),
            ("Mode 3", new BufferedDurableHeapOptions { Mode = (DurabilityMode)3 }),
            ("Mode -1", new BufferedDurableHeapOptions { Mode = (DurabilityMode)(-1) }),
        };
        int n = 0;
        foreach ((string name, BufferedDurableHeapOptions options) in cases)
        {
            string file = path + (n++);
            Try(name, () =>
            {
                var sw = System.Diagnostics.Stopwatch.StartNew();
                using (var heap = BufferedDurableHeap.Create(file, new HeapFileOptions { Size = 4L << 20 }, options))
                {
                    var map = new PersistentHashMap<long, long>(heap, 1);
                    for (int i = 0; i < 2000; i++)
                    {
                        map.Set(i % 100, i);
                    }

                    heap.Sync();
                    Console.WriteLine($"  {name}: ran in {sw.ElapsedMilliseconds} ms, version {heap.CurrentVersion}");
                }

                using (var heap = BufferedDurableHeap.Open(file, null, options))
                {
                    var map = new PersistentHashMap<long, long>(heap, 1);
                    Console.WriteLine($"  reopened count {map.Count}");
                }
            });
        }

        foreach ((string name, HeapFileOptions fo) in new[]
        {
            ("Size 0", new HeapFileOptions { Size = 0 }), ("Size -1", new HeapFileOptions { Size = -1 }), ("Size long.Max", new HeapFileOptions { Size = long.MaxValue }),
            ("MaxSize -1", new HeapFileOptions { MaxSize = -1 }), ("Domain 9", new HeapFileOptions { Domain = (PersistenceDomainKind)9 }), ("Domain Simulated", new HeapFileOptions { Domain = PersistenceDomainKind.Simulated }),
            ("WriteBack 7", new HeapFileOptions { MappedFileWriteBack = (MappedFileWriteBack)7 }), ("Pmem lib empty", new HeapFileOptions { Domain = PersistenceDomainKind.Pmem, PmemLibraryName = "" }),
            ("Pmem lib null", new HeapFileOptions { Domain = PersistenceDomainKind.Pmem, PmemLibraryName = null }), ("Pmem lib bogus path", new HeapFileOptions { Domain = PersistenceDomainKind.Pmem, PmemLibraryName = "/etc/passwd" }),
            ("Size 73728", new HeapFileOptions { Size = 73728 }), ("Size 73727", new HeapFileOptions { Size = 73727 }), ("Size 1TiB sparse", new HeapFileOptions { Size = 1L << 40 }),
        })
        {
            string file = path + (n++);
            Try($"HeapFile.Create({name})", () => HeapFile.Create(file, fo).Dispose());
            Try($"PersistentHeap.Create({name})", () => PersistentHeap.Create(file + "p", fo).Dispose());
        }

        Try("HeapFile.Create(\"\")", () => HeapFile.Create(string.Empty).Dispose());
        Try("HeapFile.Open(nonexistent)", () => HeapFile.Open(path + "nope").Dispose());
        Try("HeapFile.Create(null!)", () => HeapFile.Create((string)null!).Dispose());
        Try("PersistentHeapOptions.RecoveryParallelism -5", () =>
        {
            string file = path + (n++);
            PersistentHeap.Create(file, new HeapFileOptions { Size = 4L << 20 }).Dispose();
            PersistentHeap.Open(file, null, new PersistentHeapOptions { RecoveryParallelism = -5 }).Dispose();
            PersistentHeap.Open(file, null, new PersistentHeapOptions { RecoveryParallelism = int.MaxValue }).Dispose();
        });
        return 0;
    }

    private static int ExploreStructures(string path)
    {
        using var heap = BufferedDurableHeap.Create(path, new HeapFileOptions { Size = 4L << 20, MaxSize = 8L << 20 }, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
        var bytes = new PersistentByteMap<long>(heap, 1);
        int max = heap.Heap.MaxPayloadSize - 8;
        Try("bytes.Set(empty)", () => bytes.Set(1, ReadOnlySpan<byte>.Empty));
        Try("bytes.Get(empty)", () => Console.WriteLine(bytes.Get(1)?.Length));
        Try("bytes.TryCopyValue(empty dest)", () => Console.WriteLine(bytes.TryCopyValue(1, Span<byte>.Empty)));
        Try("bytes.Set(max+1)", () => bytes.Set(2, new byte[max + 1]));
        Try("bytes.Set(max)", () => bytes.Set(2, new byte[max]));
        Try("bytes.Set(16345)", () => bytes.Set(3, new byte[16345]));
        Try("bytes.TryCopyValue(small dest)", () => Console.WriteLine(bytes.TryCopyValue(3, new byte[10])));
        Try("bytes.Set(4MiB)", () => bytes.Set(4, new byte[4 << 20]));
        Try("bytes.Set(4, small)", () => bytes.Set(4, new byte[3]));
        Try("bytes.Remove(2)", () => bytes.Remove(2));
        Try("Sync", () => heap.Sync());
        Try("bytes.Set(2, max)", () => bytes.Set(2, new byte[max]));
        Try("Sync", () => heap.Sync());
        Console.WriteLine($"count={bytes.Count} {heap.Heap.GetStatistics()}");
        Try("new ByteMap(-1)", () => new PersistentByteMap<long>(heap, -1));
        Try("new ByteMap(1<<24)", () => new PersistentByteMap<long>(heap, 1 << 24));
        Try("new ByteMap(1) again", () => new PersistentByteMap<long>(heap, 1));
        Try("new HashMap(1) same id", () => new PersistentHashMap<long, long>(heap, 1));
        var map = new PersistentHashMap<int, long>(heap, 2);
        Try("SetMany(empty)", () => Console.WriteLine(map.SetMany(ReadOnlySpan<KeyValuePair<int, long>>.Empty)));
        var many = new KeyValuePair<int, long>[200_000];
        for (int i = 0; i < many.Length; i++)
        {
            many[i] = new(i % 1000, i);
        }

        Try("SetMany(200k, 1000 keys)", () => Console.WriteLine(map.SetMany(many)));
        var huge = new KeyValuePair<int, long>[300_000];
        for (int i = 0; i < huge.Length; i++)
        {
            huge[i] = new(i, i);
        }

        Try("SetMany(300k distinct: heap too small)", () => Console.WriteLine(map.SetMany(huge)));
        Console.WriteLine($"map count={map.Count}");
        Try("Sync", () => heap.Sync());
        Try("map.Set after", () => map.Set(-1, -1));
        Try("bytes.Set after", () => bytes.Set(99, new byte[10]));
        var queue = new PersistentQueue<Guid>(heap, 3);
        Try("queue.Enqueue", () => queue.Enqueue(Guid.NewGuid()));
        Try("Sync", () => heap.Sync());
        Console.WriteLine($"final map count={map.Count} bytes={bytes.Count} q={queue.Count}");
        return 0;
    }

    private static int ExploreUid(string path)
    {
        using (PersistentHeap heap = PersistentHeap.Create(path, new HeapFileOptions { Size = 4L << 20 }))
        {
            PayloadRef b = heap.Allocate(8, 1, uid: long.MaxValue);
            heap.Persist(b);
            Try("NewUid", () => Console.WriteLine(heap.NewUid()));
            Try("Allocate uid 0", () => heap.Allocate(8, 1));
            Try("Allocate uid Max again", () => Console.WriteLine(heap.GetHeader(heap.Allocate(8, 1, uid: long.MaxValue))));
        }

        Try("reopen", () =>
        {
            using PersistentHeap heap = PersistentHeap.Open(path);
            Console.WriteLine($"saved={heap.OpenedFromSavedState} {heap.SavedStateRejection}");
            Try("NewUid", () => Console.WriteLine(heap.NewUid()));
            Try("Allocate", () => heap.Allocate(8, 1));
            heap.ForEachAllocated((r, h) => Console.WriteLine($"{r} {h}"));
        });
        return 0;
    }

    private static int ExploreDomain()
    {
        foreach ((long length, long capacity) in new[] { (0L, 0L), (-64L, 0L), (63L, 0L), (64L, 32L), (64L, 65L), (64L, long.MaxValue & ~63L), (1L << 40, 0L), (64L, -64L) })
        {
            Try($"new Simulated({length}, {capacity})", () => new SimulatedPersistenceDomain(length, capacity).Dispose());
        }

        Try("FromImage(empty)", () => SimulatedPersistenceDomain.FromImage(ReadOnlySpan<byte>.Empty));
        Try("FromImage(100 bytes)", () => SimulatedPersistenceDomain.FromImage(new byte[100]));
        Try("FromImage(128, cap 64)", () => SimulatedPersistenceDomain.FromImage(new byte[128], 64));
        using var d = new SimulatedPersistenceDomain(1 << 16, 1 << 17);
        Try("ArmCrash(-1)", () => d.ArmCrash(-1, 0));
        Try("GetSpan(0, int.Max)", () => d.GetSpan(0, int.MaxValue));
        Try("GetSpan(65536, 0)", () => d.GetSpan(65536, 0));
        Try("GetSpan(65537, 0)", () => d.GetSpan(65537, 0));
        Try("WriteBack(65535, 1)", () => d.WriteBack(65535, 1));
        Try("WriteBack(0, 0)", () => d.WriteBack(0, 0));
        Try("Persist(-64, 128)", () => d.Persist(-64, 128));
        Try("TryGrow(65536+1)", () => Console.WriteLine(d.TryGrow(65537)));
        Try("TryGrow(1<<17)", () => Console.WriteLine(d.TryGrow(1 << 17)));
        Try("TryGrow((1<<17)+64)", () => Console.WriteLine(d.TryGrow((1 << 17) + 64)));
        Try("Crash(0)", () => Console.WriteLine(d.Crash(0).Length));
        Try("HeapFile.Create(d, -1)", () => HeapFile.Create(d, -1).Dispose());
        Try("HeapFile.Create(d, 1)", () => HeapFile.Create(d, 1).Dispose());
        Try("HeapFile.Create(d, long.Max)", () => HeapFile.Create(d, long.MaxValue).Dispose());
        Try("HeapFile.Open(unformatted d)", () => HeapFile.Open(d).Dispose());
        using var small = new SimulatedPersistenceDomain(4096);
        Try("HeapFile.Create(small)", () => HeapFile.Create(small).Dispose());
        return 0;
    }
}
