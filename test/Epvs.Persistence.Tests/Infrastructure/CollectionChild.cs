using System;
using System.Collections.Concurrent;
using System.Collections.Generic;
using System.Diagnostics;
using System.Linq;
using System.Runtime.CompilerServices;
using System.Threading;
using System.Threading.Tasks;

namespace Epvs.Persistence.Tests;

/// <summary>
/// Child-process scenarios of the garbage-collection probe (a heap never disposed is collected): a crash (SIGSEGV from
/// a finalizer's unmapping, an exception on the finalizer thread) kills only the child. Each scenario prints what it saw
/// and returns <see cref="Survived"/>, or <see cref="WrongOutcome"/> / <see cref="Hung"/>.
/// </summary>
internal static class CollectionChild
{
    internal const string Role = "collection";
    internal const int Survived = 0;
    internal const int WrongOutcome = 3;
    internal const int Hung = 5;

    /// <summary>Makes the progress a bounded wait here waits for: a full collection and the finalizers it queued (what frees an unreachable heap and, after it, its file lock).</summary>
    private static void CollectNow()
    {
        GC.Collect();
        GC.WaitForPendingFinalizers();
    }

    internal static int Run(string scenario, string path, string domain)
    {
        try
        {
            return scenario switch
            {
                "quarantine-under-file-call" => QuarantineUnderFileCall(path, domain),
                "task-only" => TaskOnly(path),
                "foreach-last-use" => ForEachLastUse(path),
                "simulated" => Simulated(),
                "syncasync-unrooted" => SyncAsyncUnrooted(path),
                "stress" => Stress(path, domain),
                "straggler-then-gc" => StragglerThenGc(path),
                "invalid-options-then-gc" => InvalidOptionsThenGc(path),
                "uninitialized-heap-finalized" => UninitializedHeapFinalized(),
                _ => throw new ArgumentException($"unknown scenario {scenario}"),
            };
        }
        catch (Exception e)
        {
            Console.Error.WriteLine($"unexpected: {e}");
            return WrongOutcome;
        }
    }

    /// <summary>
    /// The finalizer of a heap whose constructor threw before it made anything (no link, no waiters' gate): it must return
    /// without touching them (an exception on the finalizer thread kills the process). The object is made without its
    /// constructor, as such a half-made heap is.
    /// </summary>
    private static int UninitializedHeapFinalized()
    {
        MakeUninitialized();
        for (int i = 0; i < 3; i++)
        {
            GC.Collect(2, GCCollectionMode.Forced, blocking: true);
            GC.WaitForPendingFinalizers();
        }

        Console.WriteLine("survived");
        return Survived;
    }

    [MethodImpl(MethodImplOptions.NoInlining)]
    private static void MakeUninitialized() => _ = RuntimeHelpers.GetUninitializedObject(typeof(BufferedDurableHeap));

    /// <summary>
    /// A review: an Open refused for its options (checked in the constructor, after the object existed) left an object
    /// whose finalizer dereferenced the background link it never made: a NullReferenceException on the finalizer thread
    /// killed the process at the next collection. Open now checks the options first, and the finalizer tolerates a
    /// missing link.
    /// </summary>
    private static int InvalidOptionsThenGc(string path)
    {
        BufferedDurableHeap.Create(path, new HeapFileOptions { Size = 4L << 20, Domain = PersistenceDomainKind.MappedFile }).Dispose();
        foreach (bool owned in new[] { true, false })
        {
            try
            {
                if (owned)
                {
                    BufferedDurableHeap.Open(path, null, new BufferedDurableHeapOptions { SyncTimeout = TimeSpan.FromMilliseconds(-5) }).Dispose();
                }
                else
                {
                    using HeapFile file = HeapFile.Open(path);
                    BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { SyncTimeout = TimeSpan.FromMilliseconds(-5) }).Dispose();
                }

                Console.Error.WriteLine("the open was not refused");
                return WrongOutcome;
            }
            catch (ArgumentOutOfRangeException)
            {
            }
        }

        for (int i = 0; i < 3; i++)
        {
            GC.Collect(2, GCCollectionMode.Forced, blocking: true);
            GC.WaitForPendingFinalizers();
        }

        // The file was not left open by the refused opens.
        BufferedDurableHeap.Open(path).Dispose();
        Console.WriteLine("survived");
        return Survived;
    }

    private static HeapFileOptions FileOptions(string domain) => new()
    {
        Size = 4L << 20,
        Domain = domain == "pmem" ? PersistenceDomainKind.Pmem : PersistenceDomainKind.MappedFile,
    };

    /// <summary>A side thread collecting in a loop until stopped.</summary>
    private sealed class GcStress : IDisposable
    {
        private readonly Thread _thread;
        private volatile bool _stop;

        internal GcStress()
        {
            _thread = new Thread(() =>
            {
                while (!_stop)
                {
                    GC.Collect(2, GCCollectionMode.Forced, blocking: true);
                    GC.WaitForPendingFinalizers();
                    Thread.Yield();
                }
            })
            { IsBackground = true, Name = "gc-stress" };
            _thread.Start();
        }

        public void Dispose()
        {
            _stop = true;
            _thread.Join();
        }
    }

    /// <summary>
    /// A Dispose that times out behind a thread inside an operation quarantines the mapping and frees it once the
    /// threads inside the heap's version scheme have left (ReleaseQuarantineOnceLeft on the scheme's epoch). A thread
    /// inside a call of the heap's file (a <see cref="PersistentHeap.ForEachAllocated"/> scan of <see cref="BufferedDurableHeap.Heap"/>,
    /// protected by the file's own epoch, not the scheme's) is not waited for: when the straggler leaves, the quarantined
    /// memory is unmapped under the scan, which reads the next header on return from its visitor.
    /// </summary>
    private static int QuarantineUnderFileCall(string path, string domain)
    {
        var heap = BufferedDurableHeap.Create(path, FileOptions(domain), new BufferedDurableHeapOptions { SyncTimeout = TimeSpan.FromMilliseconds(300) });
        var map = new PersistentHashMap<long, long>(heap, typeId: 1);
        for (long i = 0; i < 500; i++)
        {
            map.Set(i, i);
        }

        // Its own timeout: the heap's short default is for the Dispose behind the thread below, and this Sync, with
        // nothing held, may take longer on a loaded machine (a full test run beside other work timed out here).
        heap.Sync(TimeSpan.FromSeconds(30));
        using var inOperation = new ManualResetEventSlim();
        using var leaveOperation = new ManualResetEventSlim();
        using var inVisitor = new ManualResetEventSlim();
        using var leaveVisitor = new ManualResetEventSlim();
        var straggler = new Thread(() =>
        {
            using (heap.BeginOperation())
            {
                inOperation.Set();
                leaveOperation.Wait();
            }
        });
        int visited = 0;
        string scanOutcome = "none";
        var scanner = new Thread(() =>
        {
            try
            {
                heap.Heap.ForEachAllocated((_, _) =>
                {
                    if (Interlocked.Increment(ref visited) == 1)
                    {
                        inVisitor.Set();
                        leaveVisitor.Wait();
                    }
                });
                scanOutcome = $"returned after {visited} blocks";
            }
            catch (Exception e)
            {
                scanOutcome = $"threw {e.GetType().Name}";
            }
        });
        straggler.Start();
        inOperation.Wait();
        scanner.Start();
        inVisitor.Wait();
        try
        {
            heap.Dispose();
            Console.WriteLine("dispose returned");
        }
        catch (Exception e)
        {
            Console.WriteLine($"dispose threw {e.GetType().Name}");
        }

        Console.WriteLine($"quarantined before the straggler left: {heap.Heap.File.Domain.HoldsQuarantinedMemory}");
        leaveOperation.Set();
        straggler.Join();
        Console.WriteLine($"quarantined after the straggler left: {heap.Heap.File.Domain.HoldsQuarantinedMemory}");
        Console.Out.Flush();

        // The scan goes on from its visitor.
        leaveVisitor.Set();
        if (!scanner.Join(TimeSpan.FromSeconds(30)))
        {
            return Hung;
        }

        Console.WriteLine($"scan {scanOutcome}");
        return Survived;
    }

    /// <summary>
    /// Fire-and-forget writers that await SyncAsync on a heap nothing else references (the advancer holds it weakly).
    /// Each continuation counts itself; every heap is eventually collected. Counts how many awaits never resumed.
    /// </summary>
    private static int SyncAsyncUnrooted(string path)
    {
        const int Writers = 150;
        int resumed = 0, faulted = 0;
        var heaps = new List<WeakReference>();
        using (new GcStress())
        {
            for (int i = 0; i < Writers; i++)
            {
                heaps.Add(StartWriter($"{path}.{i}", () => Interlocked.Increment(ref resumed), () => Interlocked.Increment(ref faulted)));
            }

            var watch = Stopwatch.StartNew();
            while (heaps.Exists(h => h.IsAlive) && watch.Elapsed < TimeSpan.FromSeconds(60))
            {
                CollectNow();
            }

            // Whatever was going to resume has had ample time.
            while (Volatile.Read(ref resumed) + Volatile.Read(ref faulted) < Writers && watch.Elapsed < TimeSpan.FromSeconds(70))
            {
                Thread.Yield();
            }
        }

        int lost = Writers - resumed - faulted;
        Console.WriteLine($"writers {Writers}, resumed {resumed}, faulted {faulted}, never resumed {lost}, heaps alive {heaps.FindAll(h => h.IsAlive).Count}");
        return lost == 0 ? Survived : Hung;
    }

    [MethodImpl(MethodImplOptions.NoInlining)]
    private static WeakReference StartWriter(string path, Action resumed, Action faulted)
    {
        var heap = BufferedDurableHeap.Create(path, FileOptions("mapped"), new BufferedDurableHeapOptions { SyncTimeout = Timeout.InfiniteTimeSpan, AdvancePeriod = TimeSpan.FromMilliseconds(50) });
        var map = new PersistentHashMap<long, long>(heap, typeId: 1);
        map.Set(1, 1);
        _ = WriteAndSync(map, heap, resumed, faulted);
        return new WeakReference(heap);
    }

    private static async Task WriteAndSync(PersistentHashMap<long, long> map, BufferedDurableHeap heap, Action resumed, Action faulted)
    {
        map.Set(2, 2);
        try
        {
            await heap.SyncAsync().ConfigureAwait(false);
            resumed();
        }
        catch (Exception)
        {
            faulted();
        }
    }

    /// <summary>
    /// JIT liveness: a scan of heap.Heap is the last use of an undisposed heap; its visitor collects. The scan keeps
    /// reading the mapping after each visit, so something it still uses must keep the mapping alive.
    /// </summary>
    private static int ForEachLastUse(string path)
    {
        int visits = ScanAsLastUse(path);
        Console.WriteLine($"scan as last use survived {visits} collections");
        return Survived;
    }

    [MethodImpl(MethodImplOptions.NoInlining)]
    private static int ScanAsLastUse(string path)
    {
        var heap = BufferedDurableHeap.Create(path, FileOptions("mapped"), new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromMilliseconds(1) });
        var map = new PersistentHashMap<long, long>(heap, typeId: 1);
        for (long k = 0; k < 300; k++)
        {
            map.Set(k, k);
        }

        heap.Sync();
        int visits = 0;
        heap.Heap.ForEachAllocated((_, _) =>
        {
            visits++;
            GC.Collect(2, GCCollectionMode.Forced, blocking: true);
            GC.WaitForPendingFinalizers();
            GC.Collect(2, GCCollectionMode.Forced, blocking: true);
        });
        return visits;
    }

    /// <summary>Only the task of a pending SyncAsync is kept (infinite SyncTimeout), under GC stress: it must complete.</summary>
    private static int TaskOnly(string path)
    {
        using (new GcStress())
        {
            for (int i = 0; i < 100; i++)
            {
                Task task = PendingSync($"{path}.{i}");
                if (!task.Wait(TimeSpan.FromSeconds(30)))
                {
                    Console.WriteLine($"round {i}: the SyncAsync task never completed");
                    return Hung;
                }
            }
        }

        Console.WriteLine("every SyncAsync task completed");
        return Survived;
    }

    [MethodImpl(MethodImplOptions.NoInlining)]
    private static Task PendingSync(string path)
    {
        var heap = BufferedDurableHeap.Create(path, FileOptions("mapped"), new BufferedDurableHeapOptions { SyncTimeout = Timeout.InfiniteTimeSpan, AdvancePeriod = TimeSpan.FromMilliseconds(50) });
        var map = new PersistentHashMap<long, long>(heap, typeId: 1);
        map.Set(1, 1);
        return heap.SyncAsync();
    }

    /// <summary>
    /// Heaps on caller-owned simulated domains: the domain kept (for its durable image) with heap and file dropped, or
    /// nothing kept at all, under GC stress; the image taken afterwards must hold what Sync acknowledged.
    /// </summary>
    private static int Simulated()
    {
        using (new GcStress())
        {
            for (int i = 0; i < 20; i++)
            {
                SimulatedPersistenceDomain domain = SimulatedAbandon(i % 2 == 0, out WeakReference heap);
                var watch = Stopwatch.StartNew();
                while (heap.IsAlive && watch.Elapsed < TimeSpan.FromMilliseconds(200))
                {
                    CollectNow();
                }

                byte[] image = domain.GetDurableImage();
                using var copy = SimulatedPersistenceDomain.FromImage(image, 8L << 20);
                using var file = HeapFile.Open(copy);
                using var reopened = BufferedDurableHeap.Open(file);
                var map = new PersistentHashMap<long, long>(reopened, typeId: 1);
                for (long k = 0; k < 100; k++)
                {
                    if (!map.TryGetValue(k, out long v) || v != k)
                    {
                        Console.WriteLine($"round {i}: acknowledged key {k} lost (heap collected: {!heap.IsAlive})");
                        return WrongOutcome;
                    }
                }

                GC.KeepAlive(domain);
            }
        }

        Console.WriteLine("simulated: every image held what Sync acknowledged");
        return Survived;
    }

    [MethodImpl(MethodImplOptions.NoInlining)]
    private static SimulatedPersistenceDomain SimulatedAbandon(bool alsoAnUnreferencedOne, out WeakReference weak)
    {
        if (alsoAnUnreferencedOne)
        {
            var lost = new SimulatedPersistenceDomain(4L << 20, 8L << 20);
            var lostHeap = BufferedDurableHeap.Open(HeapFile.Create(lost), new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromMilliseconds(1) });
            new PersistentHashMap<long, long>(lostHeap, typeId: 1).Set(1, 1);
        }

        var domain = new SimulatedPersistenceDomain(4L << 20, 8L << 20);
        var heap = BufferedDurableHeap.Open(HeapFile.Create(domain), new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromMilliseconds(1) });
        var map = new PersistentHashMap<long, long>(heap, typeId: 1);
        for (long k = 0; k < 100; k++)
        {
            map.Set(k, k);
        }

        heap.Sync();
        map.Set(500, 500);
        weak = new WeakReference(heap);
        return domain;
    }

    [MethodImpl(MethodImplOptions.NoInlining)]
    private static Span<byte> SpanOfAbandonedHeap(string path, out WeakReference weak)
    {
        var heap = BufferedDurableHeap.Create(path, FileOptions("mapped"), new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromMilliseconds(5) });
        PayloadRef block;
        using (DurableOperation op = heap.BeginOperation())
        {
            block = op.Allocate(64, 7);
        }

        weak = new WeakReference(heap);
        return heap.Heap.GetPayload(block);
    }

    /// <summary>
    /// A Dispose that times out behind a straggler, the straggler leaves, everything is dropped and collected: no crash,
    /// and the file reopens with what Sync acknowledged.
    /// </summary>
    private static int StragglerThenGc(string path)
    {
        using (new GcStress())
        {
            for (int round = 0; round < 20; round++)
            {
                string file = $"{path}.{round}";
                long acknowledged = StragglerRound(file);
                BufferedDurableHeap? reopened = null;
                var watch = Stopwatch.StartNew();
                while (reopened is null)
                {
                    try
                    {
                        reopened = BufferedDurableHeap.Open(file, FileOptions("mapped"));
                    }
                    catch (HeapFileException e) when (e.Error == HeapFileError.AlreadyOpen && watch.Elapsed < TimeSpan.FromSeconds(30))
                    {
                        CollectNow();
                    }
                }

                using (reopened)
                {
                    var map = new PersistentHashMap<long, long>(reopened, typeId: 1);
                    for (long k = 0; k < acknowledged; k++)
                    {
                        if (!map.TryGetValue(k, out long v) || v != k)
                        {
                            Console.WriteLine($"round {round}: key {k} of {acknowledged} acknowledged lost");
                            return WrongOutcome;
                        }
                    }
                }
            }
        }

        Console.WriteLine("all rounds recovered what Sync acknowledged");
        return Survived;
    }

    [MethodImpl(MethodImplOptions.NoInlining)]
    private static long StragglerRound(string file)
    {
        var heap = BufferedDurableHeap.Create(file, FileOptions("mapped"), new BufferedDurableHeapOptions { SyncTimeout = TimeSpan.FromMilliseconds(200), AdvancePeriod = TimeSpan.FromMilliseconds(5) });
        var map = new PersistentHashMap<long, long>(heap, typeId: 1);
        long n = 100;
        for (long i = 0; i < n; i++)
        {
            map.Set(i, i);
        }

        // Its own timeout: the heap's short default is for the Dispose behind the thread below, and this Sync, with
        // nothing held, may take longer on a loaded machine (a full test run beside other work timed out here).
        heap.Sync(TimeSpan.FromSeconds(30));
        using var inOperation = new ManualResetEventSlim();
        using var leave = new ManualResetEventSlim();
        var straggler = new Thread(() =>
        {
            using (DurableOperation op = heap.BeginOperation())
            {
                PayloadRef r = op.Allocate(128, 3);
                inOperation.Set();
                leave.Wait();
                try
                {
                    op.GetPayload(r).Fill(7);
                }
                catch (ObjectDisposedException)
                {
                    // The heap closed under the operation (quarantined): failing cleanly is allowed.
                }
            }
        });
        straggler.Start();
        inOperation.Wait();
        try
        {
            heap.Dispose();
        }
        catch (TimeoutException)
        {
        }

        leave.Set();
        straggler.Join();
        return n;
    }

    /// <summary>
    /// Heaps abandoned in many ways while one heap is in heavy use by several threads; each abandoned heap that a Sync
    /// acknowledged is reopened once collected and must show that data.
    /// </summary>
    private static int Stress(string path, string domain)
    {
        HeapFileOptions fileOptions = FileOptions(domain);
        var failures = new ConcurrentQueue<string>();
        using var gc = new GcStress();
        using var busy = BufferedDurableHeap.Create(path + ".busy", fileOptions, new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromMilliseconds(2) });
        var busyMap = new PersistentHashMap<long, long>(busy, typeId: 1);
        var busyQueue = new PersistentQueue<long>(busy, typeId: 2);
        using var stop = new CancellationTokenSource();
        var workers = new List<Thread>();
        for (int w = 0; w < 3; w++)
        {
            int id = w;
            var t = new Thread(() =>
            {
                var random = new Random(id);
                long i = 0;
                var items = new KeyValuePair<long, long>[16];
                try
                {
                    while (!stop.IsCancellationRequested)
                    {
                        i++;
                        long key = (id * 1_000_000) + (i % 5000);
                        switch (random.Next(8))
                        {
                            case 0: busyMap.Set(key, i); break;
                            case 1: busyMap.Remove(key); break;
                            case 2:
                                for (int j = 0; j < items.Length; j++)
                                {
                                    items[j] = new(key + j, i);
                                }

                                busyMap.SetMany(items);
                                break;
                            case 3: busyQueue.Enqueue(i); break;
                            case 4: busyQueue.TryDequeue(out _); break;
                            case 5: if (i % 50 == 0) { busy.Sync(); } break;
                            case 6: if (i % 50 == 0) { busy.SyncAsync().Wait(); } break;
                            default: if (i % 50 == 0) { busy.AdvanceVersion(TimeSpan.FromSeconds(30)); } break;
                        }
                    }
                }
                catch (Exception e)
                {
                    failures.Enqueue($"worker {id}: {e}");
                }
            })
            { Name = $"busy-{w}" };
            t.Start();
            workers.Add(t);
        }

        // In a method of its own: its locals (the last objects kept) must not keep heaps alive through the collection below.
        List<(string File, WeakReference Heap, long Acknowledged, object? Kept)> abandoned = AbandonWhileBusy(path, fileOptions, failures);

        stop.Cancel();
        foreach (Thread t in workers)
        {
            if (!t.Join(TimeSpan.FromSeconds(60)))
            {
                Console.WriteLine($"worker {t.Name} hung");
                return Hung;
            }
        }

        for (int i = 0; i < abandoned.Count; i++)
        {
            abandoned[i] = (abandoned[i].File, abandoned[i].Heap, abandoned[i].Acknowledged, null);
        }

        var collect = Stopwatch.StartNew();
        while (abandoned.Exists(a => a.Heap.IsAlive) && collect.Elapsed < TimeSpan.FromSeconds(30))
        {
            CollectNow();
        }

        int alive = abandoned.FindAll(a => a.Heap.IsAlive).Count;
        int reopened = 0;
        foreach ((string file, WeakReference heapRef, long acknowledged, _) in abandoned)
        {
            if (heapRef.IsAlive)
            {
                continue;
            }

            BufferedDurableHeap? heap = null;
            var w = Stopwatch.StartNew();
            while (heap is null)
            {
                try
                {
                    heap = BufferedDurableHeap.Open(file, fileOptions);
                }
                catch (HeapFileException e) when (e.Error == HeapFileError.AlreadyOpen && w.Elapsed < TimeSpan.FromSeconds(20))
                {
                    CollectNow();
                }
            }

            using (heap)
            {
                reopened++;
                var map = new PersistentHashMap<long, long>(heap, typeId: 1);
                for (long k = 0; k < acknowledged; k++)
                {
                    if (!map.TryGetValue(k, out long v) || v != k * 3)
                    {
                        failures.Enqueue($"{file}: acknowledged key {k} of {acknowledged} lost");
                        break;
                    }
                }
            }
        }

        Console.WriteLine($"abandoned {abandoned.Count}, still alive {alive} (kinds {string.Join(",", abandoned.Select((a, i) => (a, i)).Where(x => x.a.Heap.IsAlive).Select(x => x.i % 8))}), reopened {reopened}, failures {failures.Count}");
        foreach (string f in failures)
        {
            Console.WriteLine(f);
        }

        return failures.IsEmpty ? Survived : WrongOutcome;
    }

    /// <summary>The stress's abandonments, for the time asked (see <see cref="Stress"/>), each in one of <see cref="Abandon"/>'s ways.</summary>
    [MethodImpl(MethodImplOptions.NoInlining)]
    private static List<(string File, WeakReference Heap, long Acknowledged, object? Kept)> AbandonWhileBusy(string path, HeapFileOptions fileOptions, ConcurrentQueue<string> failures)
    {
        var abandoned = new List<(string File, WeakReference Heap, long Acknowledged, object? Kept)>();
        var watch = Stopwatch.StartNew();
        int n = 0;
        // 4 s by default (the suite's budget); EPVS_COLLECTION_STRESS_SECONDS for longer runs (the probe ran 25 s).
        double seconds = double.TryParse(Environment.GetEnvironmentVariable("EPVS_COLLECTION_STRESS_SECONDS"), System.Globalization.NumberStyles.Float, System.Globalization.CultureInfo.InvariantCulture, out double d) && d > 0 ? d : 4;
        while (watch.Elapsed < TimeSpan.FromSeconds(seconds))
        {
            string file = $"{path}.a{n}";
            (WeakReference heap, long acknowledged, object? kept) = Abandon(file, fileOptions, n % 8);
            abandoned.Add((file, heap, acknowledged, kept));
            n++;

            // Use what was kept: it must keep the heap alive (or fail cleanly), never crash.
            foreach ((_, _, _, object? k) in abandoned)
            {
                UseKept(k, failures);
            }

            // Drop the kept objects of older ones now and then.
            if (n % 5 == 0)
            {
                for (int i = 0; i < abandoned.Count; i++)
                {
                    abandoned[i] = (abandoned[i].File, abandoned[i].Heap, abandoned[i].Acknowledged, null);
                }
            }
        }

        return abandoned;
    }

    [MethodImpl(MethodImplOptions.NoInlining)]
    private static (WeakReference Heap, long Acknowledged, object? Kept) Abandon(string file, HeapFileOptions fileOptions, int how)
    {
        var heap = BufferedDurableHeap.Create(file, fileOptions, new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromMilliseconds(how % 2 == 0 ? 1 : 20) });
        var weak = new WeakReference(heap);
        if (how == 0)
        {
            // Right after Create.
            return (weak, 0, null);
        }

        var map = new PersistentHashMap<long, long>(heap, typeId: 1);
        long n = 50 + (how * 10);
        for (long k = 0; k < n; k++)
        {
            map.Set(k, k * 3);
        }

        heap.Sync();
        for (long k = n; k < n + 20; k++)
        {
            map.Set(k, k * 3); // not acknowledged
        }

        switch (how)
        {
            case 1: return (weak, n, map); // the structure still referenced
            case 2: return (weak, n, heap.VersionScheme);
            case 3: return (weak, n, heap.Heap);
            case 4: return (weak, n, heap.Heap.File);
            case 5: return (weak, n, heap.SyncAsync()); // a SyncAsync still pending
            case 6:
                // Mid-Sync on another thread: the heap reachable only from that thread's frame.
                var t = new Thread(() => { try { heap.Sync(); } catch (ObjectDisposedException) { } });
                t.Start();
                return (weak, n, null);
            default: return (weak, n, null);
        }
    }

    private static void UseKept(object? kept, ConcurrentQueue<string> failures)
    {
        try
        {
            switch (kept)
            {
                case PersistentHashMap<long, long> map:
                    map.Set(1_000_000, 1);
                    _ = map.TryGetValue(0, out _);
                    break;
                case EpochProtectedVersionScheme scheme:
                    _ = scheme.CurrentState;
                    _ = scheme.GetThreadsBlockingTransition();
                    break;
                case PersistentHeap heap:
                    _ = heap.GetStatistics();
                    heap.ForEachAllocated((_, _) => { });
                    break;
                case HeapFile file:
                    _ = file.DurableFrontier;
                    _ = file.EpochClock;
                    break;
                case Task task:
                    _ = task.IsCompleted;
                    break;
            }
        }
        catch (ObjectDisposedException)
        {
            // Failing cleanly is allowed.
        }
        catch (Exception e)
        {
            failures.Enqueue($"using a kept {kept?.GetType().Name}: {e}");
        }
    }
}
