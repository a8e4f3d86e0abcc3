using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.IO;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// Child-process scenarios for the crash-safety tests: each either ends with <see cref="Survived"/> or a specific
/// failure code, and a crash (SIGSEGV, SIGBUS) kills only the child, so the test sees an exit code instead of losing
/// its host. Test hooks are switched on by the "control" argument.
/// </summary>
internal static class SafetyChild
{
    internal const string Role = "safety";
    internal const int Survived = 0;
    internal const int WrongOutcome = 3;
    internal const int Inconclusive = 4;

    /// <summary>
    /// Runs <paramref name="scenario"/>'s control (the "control" argument) in up to <paramref name="children"/> child
    /// processes, each on a heap of its own in <paramref name="dir"/>, stopping at the first that does not survive:
    /// whether a control's defect strikes is timing. Writes each child's exit to <paramref name="output"/>.
    /// </summary>
    /// <returns>The last child's exit code and output (<see cref="Survived"/> when none died) and how many ran.</returns>
    internal static (int ExitCode, string Output, int Children) RunControlUntilItDies(string scenario, TempDirectory dir, ITestOutputHelper output, int children)
    {
        int code = Survived;
        string text = string.Empty;
        int ran = 0;
        while (code == Survived && ran < children)
        {
            ran++;
            (code, text) = TestProgram.RunChild(new Dictionary<string, string>(), Role, scenario, dir.File($"control{ran}.heap"), "control");
            output.WriteLine($"control of {scenario}, child {ran}: exit {code}: {text}");
        }

        return (code, text, ran);
    }

    internal static int Run(string scenario, string path, bool control)
    {
        try
        {
            return scenario switch
            {
                "raw-use-after-dispose" => RawUseAfterDispose(path),
                "raw-dispose-during-calls" => RawDisposeDuringCalls(path, control),
                "durable-dispose-during-operation" => DurableDisposeDuringOperation(path, control),
                "durable-allocate-after-dispose" => DurableAllocateAfterDispose(path, control),
                "open-sparse-on-full-disk" => OpenSparseOnFullDisk(path, control),
                "open-out-of-descriptors" => OpenOutOfDescriptors(path),
                "open-mmap-fails" => OpenMmapFails(path),
                "open-pmem-sparse-tail-on-full-disk" => OpenPmemSparseTailOnFullDisk(path, control),
                "pmem-map-refused" => PmemMapRefused(path),
                "create-directory-sync-fails" => CreateDirectorySyncFails(path),
                "create-removal-fails" => CreateRemovalFails(path),
                "open-buffered" => OpenBuffered(path),
                "open-interrupted" => OpenInterrupted(path, control),
                "visitor-interrupts-its-loop" => VisitorInterruptsItsLoop(path, control),
                "widest-keys-on-a-small-stack" => WidestKeysOnASmallStack(),
                "wide-values-on-a-small-stack" => WideValuesOnASmallStack(path),
                "wide-dequeue-on-a-small-stack" => WideDequeueOnASmallStack(),
                "widest-keys-set-many-on-a-96k-stack" => WidestKeysSetManyOnA96KStack(),
                "largest-entries-to-dictionary-on-a-128k-stack" => LargestEntriesToDictionaryOnA128KStack(),
                "open-twice-without-runtime-locking" => OpenTwiceWithoutRuntimeLocking(path, control),
                "create-in-place-loses-the-lock" => CreateInPlaceLosesTheLock(path),
                "buffered-file-disposed-first" => BufferedFileDisposedFirst(path),
                "domain-disposed-under-file" => DomainDisposedUnderFile(path),
                "file-size-limit" => FileSizeLimit(path, control),
                "file-size-limit-lowered-after-open" => FileSizeLimitLoweredAfterOpen(path),
                "file-size-limit-lowered-below-file" => FileSizeLimitLoweredBelowTheFile(path),
                "open-under-address-space-limit" => OpenUnderAddressSpaceLimit(path),
                "create-killed" => CreateKilled(path, control),
                "structures-after-dispose" => StructuresAfterDispose(path),
                "dispose-in-fault-handler-advancer" => DisposeInFaultHandler(path, FaultedStepRunsOn.Advancer),
                "dispose-in-fault-handler-sync" => DisposeInFaultHandler(path, FaultedStepRunsOn.SyncCaller),
                "dispose-in-fault-handler-leave" => DisposeInFaultHandler(path, FaultedStepRunsOn.LeavingOperation),
                "raw-calls-outlive-dispose-wait" => RawCallsOutliveDisposeWait(path, control),
                _ => throw new ArgumentException($"unknown scenario {scenario}"),
            };
        }
        catch (Exception e)
        {
            Console.Error.WriteLine($"unexpected: {e}");
            return WrongOutcome;
        }
    }

    /// <summary>Which thread runs the faulting critical section, and so the <see cref="EpochProtectedVersionScheme.StateMachineFaulted"/> handler.</summary>
    internal enum FaultedStepRunsOn
    {
        /// <summary>The background advancer, inside its cycle.</summary>
        Advancer,

        /// <summary>The thread calling Sync, inside the cycle it runs.</summary>
        SyncCaller,

        /// <summary>A thread ending an operation, which runs the transition that waited for it.</summary>
        LeavingOperation,
    }

    /// <summary>
    /// A <see cref="EpochProtectedVersionScheme.StateMachineFaulted"/> handler (subscribed through the heap's public
    /// <see cref="BufferedDurableHeap.VersionScheme"/>) disposes the heap when the transition's critical section fails.
    /// The handler runs on whichever thread ran the section: the advancer inside its cycle, a Sync caller inside the cycle
    /// it runs, or a thread ending an operation. Its Dispose must return or throw InvalidOperationException at once
    /// (never wait for the cycle it runs inside, never crash); the heap is then disposable from the main thread, within
    /// bounded waits, and the file reopens (recovery up to the frontier).
    /// </summary>
    private static int DisposeInFaultHandler(string path, FaultedStepRunsOn where)
    {
        var fileOptions = new HeapFileOptions { Size = 4L << 20, Domain = PersistenceDomainKind.MappedFile };
        var options = new BufferedDurableHeapOptions
        {
            AdvancePeriod = where == FaultedStepRunsOn.Advancer ? TimeSpan.FromMilliseconds(5) : Timeout.InfiniteTimeSpan,
            SyncTimeout = TimeSpan.FromSeconds(20),
        };
        BufferedDurableHeap heap = BufferedDurableHeap.Create(path, fileOptions, options);
        var map = new PersistentHashMap<long, long>(heap, typeId: 1);
        map.Set(1, 10);
        if (where != FaultedStepRunsOn.Advancer)
        {
            heap.Sync();
        }

        using var handled = new ManualResetEventSlim();
        Exception? handlerDispose = null;
        bool handlerReturned = false;
        int handlerThread = 0;
        heap.VersionScheme.StateMachineFaulted += (_, _) =>
        {
            handlerThread = Environment.CurrentManagedThreadId;
            try
            {
                heap.Dispose();
                handlerReturned = true;
            }
            catch (Exception e)
            {
                handlerDispose = e;
            }
            finally
            {
                handled.Set();
            }
        };

        int sections = 0;
        heap.InsideCriticalSectionForTesting = () =>
        {
            if (Interlocked.Increment(ref sections) == 1)
            {
                throw new IOException("simulated failure in the critical section");
            }
        };

        Exception? caller = null;
        int expectedThread;
        switch (where)
        {
            case FaultedStepRunsOn.Advancer:
                expectedThread = heap.AdvancerForTesting!.ManagedThreadId;

                // (The transition of the unsynced write above may have faulted already: the heap then refuses.)
                AdvancerCycles.AskForOne(heap);
                break;
            case FaultedStepRunsOn.SyncCaller:
                expectedThread = Environment.CurrentManagedThreadId;
                caller = Record(() => heap.Sync());
                break;
            default:
                using (var inside = new ManualResetEventSlim())
                using (var leave = new ManualResetEventSlim())
                {
                    var worker = new Thread(() =>
                    {
                        using (DurableOperation op = heap.BeginOperation())
                        {
                            inside.Set();
                            leave.Wait(TimeSpan.FromSeconds(30));
                        }
                    });
                    worker.Start();
                    expectedThread = worker.ManagedThreadId;
                    inside.Wait(TimeSpan.FromSeconds(30));

                    // The transition waits for the worker's operation; the short timeout leaves it in flight, to be run
                    // by the worker when it leaves.
                    caller = Record(() => heap.AdvanceVersion(TimeSpan.FromMilliseconds(50)));
                    leave.Set();
                    if (!worker.Join(TimeSpan.FromSeconds(60)))
                    {
                        Console.Error.WriteLine("the worker did not end its operation within 60 s");
                        return WrongOutcome;
                    }
                }

                break;
        }

        if (!handled.Wait(TimeSpan.FromSeconds(60)))
        {
            Console.Error.WriteLine("the handler's Dispose did not return within 60 s");
            return WrongOutcome;
        }

        Console.WriteLine($"caller: {caller?.GetType().Name}: {caller?.Message}");
        Console.WriteLine($"handler on thread {handlerThread} (expected {expectedThread}): returned {handlerReturned}, threw {handlerDispose?.GetType().Name}: {handlerDispose?.Message}");
        if (handlerThread != expectedThread)
        {
            Console.Error.WriteLine("inconclusive: the critical section ran on another thread");
            return Inconclusive;
        }

        bool clear = handlerReturned || handlerDispose is InvalidOperationException;
        Exception? last = Record(heap.Dispose);
        Console.WriteLine($"main Dispose: {last?.GetType().Name}: {last?.Message}");
        if (!clear || last is not (null or InvalidOperationException))
        {
            return WrongOutcome;
        }

        using BufferedDurableHeap reopened = BufferedDurableHeap.Open(path, fileOptions, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
        bool kept = new PersistentHashMap<long, long>(reopened, typeId: 1).TryGetValue(1, out long value) && value == 10;
        Console.WriteLine($"reopened: clean {reopened.Recovery.WasCleanShutdown}, key kept {kept}");
        return kept || where == FaultedStepRunsOn.Advancer ? Survived : WrongOutcome;

        static Exception? Record(Action call)
        {
            try
            {
                call();
                return null;
            }
            catch (Exception e)
            {
                return e;
            }
        }
    }

    /// <summary>
    /// A structure opened on a disposed heap that recovered its payloads throws ObjectDisposedException (its rebuild
    /// read the payloads in the unmapped file: an access violation).
    /// </summary>
    private static int StructuresAfterDispose(string path)
    {
        var fileOptions = new HeapFileOptions { Size = 4L << 20 };
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, fileOptions))
        {
            var queue = new PersistentQueue<long>(heap, typeId: 1);
            var bytes = new PersistentByteMap<long>(heap, typeId: 2);
            var values = new PersistentHashMap<long, long>(heap, typeId: 3);
            for (int i = 0; i < 1000; i++)
            {
                queue.Enqueue(i);
                bytes.Set(i, new byte[100]);
                values.Set(i, i);
            }
        }

        var opens = new List<(string, Action<BufferedDurableHeap>)>
        {
            ("PersistentQueue", heap => _ = new PersistentQueue<long>(heap, typeId: 1)),
            ("PersistentByteMap", heap => _ = new PersistentByteMap<long>(heap, typeId: 2)),
            ("PersistentHashMap", heap => _ = new PersistentHashMap<long, long>(heap, typeId: 3)),
        };
        int wrong = 0;
        foreach ((string name, Action<BufferedDurableHeap> open) in opens)
        {
            BufferedDurableHeap heap = BufferedDurableHeap.Open(path, fileOptions);
            heap.Dispose();
            try
            {
                open(heap);
                Console.Error.WriteLine($"{name}: opened on a disposed heap");
                wrong++;
            }
            catch (ObjectDisposedException)
            {
                Console.WriteLine($"{name}: ObjectDisposedException");
            }
        }

        return wrong == 0 ? Survived : WrongOutcome;
    }

    /// <summary>
    /// Run under a file size limit (RLIMIT_FSIZE, <see cref="FileSizeLimitBytes"/>), where a pwrite, ftruncate or
    /// posix_fallocate past the limit raises SIGXFSZ (by default fatal): a private-mapping heap grows up to the limit and
    /// is then full (what it holds reopens intact); creating a heap larger than the limit is refused; an existing file
    /// larger than the limit (<paramref name="path"/>.big, made by the parent) is refused a private mapping, and Auto maps
    /// it shared, where it works whole. The control ignores the limit: SIGXFSZ kills the child at the growth.
    /// </summary>
    private static int FileSizeLimit(string path, bool control)
    {
        HeapFileTestHooks.IgnoreFileSizeLimit = control;
        var grow = new HeapFileOptions { Size = 2L << 20, MaxSize = 64L << 20, MappedFileWriteBack = MappedFileWriteBack.PrivateMapping, Domain = PersistenceDomainKind.MappedFile };
        int n = FillUntilFull(path, grow, count: 100_000);
        Console.WriteLine($"grown to {new FileInfo(path).Length} bytes: full after {n} values");
        if (new FileInfo(path).Length > FileSizeLimitBytes || !ReopenHolds(path, grow, n, rewrite: false))
        {
            return WrongOutcome;
        }

        HeapFileException refused = ExpectHeapFileError(() => BufferedDurableHeap.Create(path + ".new", new HeapFileOptions { Size = 8L << 20, Domain = PersistenceDomainKind.MappedFile }).Dispose(), HeapFileError.InsufficientSpace);
        Console.WriteLine($"create refused: {refused.Message}");
        string big = path + ".big";
        refused = ExpectHeapFileError(() => BufferedDurableHeap.Open(big, new HeapFileOptions { MappedFileWriteBack = MappedFileWriteBack.PrivateMapping, Domain = PersistenceDomainKind.MappedFile }).Dispose(), HeapFileError.DomainUnavailable);
        Console.WriteLine($"private mapping refused: {refused.Message}");
        var auto = new HeapFileOptions { Domain = PersistenceDomainKind.MappedFile };
        return ReopenHolds(big, auto, BigFileValues, rewrite: true) && ReopenHolds(big, auto, BigFileValues, rewrite: false) ? Survived : WrongOutcome;
    }

    [System.Runtime.InteropServices.DllImport("libc", EntryPoint = "setrlimit", SetLastError = true)]
    private static extern unsafe int SetRlimit(int resource, long* limit);

    /// <summary>Sets the soft limit of <paramref name="resource"/> (RLIMIT_FSIZE 1, RLIMIT_AS 9), the hard one unlimited.</summary>
    private static unsafe void SetSoftLimit(int resource, long soft)
    {
        long* limit = stackalloc long[2];
        limit[0] = soft;
        limit[1] = -1;
        if (SetRlimit(resource, limit) != 0)
        {
            throw new InvalidOperationException($"setrlimit({resource}) failed: errno {System.Runtime.InteropServices.Marshal.GetLastPInvokeError()}");
        }
    }

    /// <summary>
    /// The file size limit (RLIMIT_FSIZE) lowered while a heap is open (by the process itself, or by <c>prlimit --pid</c>):
    /// the heap must stop growing at it (full, as when the limit was set before the open) instead of the growth's
    /// posix_fallocate or a write-back's pwrite past it raising SIGXFSZ, which kills the process. Before the fix: killed (exit 153).
    /// </summary>
    private static int FileSizeLimitLoweredAfterOpen(string path)
    {
        var grow = new HeapFileOptions { Size = 2L << 20, MaxSize = 64L << 20, MappedFileWriteBack = MappedFileWriteBack.PrivateMapping, Domain = PersistenceDomainKind.MappedFile };
        int n = 0;
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, grow))
        {
            SetSoftLimit(1, FileSizeLimitBytes);
            var map = new PersistentByteMap<long>(heap, typeId: 1);
            byte[] value = new byte[3000];
            try
            {
                for (; n < 100_000; n++)
                {
                    value.AsSpan().Fill((byte)n);
                    map.Set(n, value);
                }
            }
            catch (InsufficientMemoryException)
            {
                // Full at the limit.
            }

            heap.Sync();
        }

        SetSoftLimit(1, -1);
        Console.WriteLine($"grown to {new FileInfo(path).Length} bytes: full after {n} values");
        return ReopenHolds(path, grow, n, rewrite: false) ? Survived : WrongOutcome;
    }

    /// <summary>
    /// The file size limit lowered below the heap file's own size while it is open: a write-back past the limit would
    /// raise SIGXFSZ (the kernel checks every pwrite against the limit, whatever the file's length), which kills the
    /// process. The heap fails instead (IOException from Sync, fail-stop), and the file reopens, once the limit is raised,
    /// with everything a Sync acknowledged before. Before the fix: killed (exit 153).
    /// </summary>
    private static int FileSizeLimitLoweredBelowTheFile(string path)
    {
        var options = new HeapFileOptions { Size = 8L << 20, MaxSize = 8L << 20, MappedFileWriteBack = MappedFileWriteBack.PrivateMapping, Domain = PersistenceDomainKind.MappedFile };
        const int N = 800; // 800 values of 3000 bytes (4 KiB blocks, 3.2 MB), and as much again for their copies: past the lowered limit, within the heap

        // No background advancer (nor stocker): after the Sync nothing writes back until the next Sync, so no write-back is
        // under way while the limit is lowered.
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, options, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan }))
        {
            var map = new PersistentByteMap<long>(heap, typeId: 1);
            byte[] value = new byte[3000];
            for (int n = 0; n < N; n++)
            {
                value.AsSpan().Fill((byte)n);
                map.Set(n, value);
            }

            heap.Sync();
            SetSoftLimit(1, 2L << 20);

            // The heap reads the limit again at most once per tick of Environment.TickCount64 (a limit lowered while a
            // write-back is under way, or within the tick, can still meet it: a documented residual). The writes below
            // begin two ticks later, once any reading is fresh.
            long lowered = Environment.TickCount64;
            while (Environment.TickCount64 < lowered + 2)
            {
                Thread.SpinWait(100);
            }

            // Each value again (copies, the old versions are durable): some land past 2 MiB.
            bool failed = false;
            try
            {
                for (int n = 0; n < N; n++)
                {
                    value.AsSpan().Fill((byte)n);
                    map.Set(n, value);
                }

                heap.Sync();
            }
            catch (Exception e) when (e is IOException or InvalidOperationException)
            {
                Console.WriteLine($"failed as it should: {e.GetType().Name}: {e.Message}");
                failed = true;
            }

            try
            {
                heap.Dispose();
            }
            catch (Exception e) when (e is IOException or InvalidOperationException)
            {
                Console.WriteLine($"dispose reported: {e.GetType().Name}");
            }

            if (!failed)
            {
                Console.Error.WriteLine("the heap wrote past the lowered limit and said nothing");
                return WrongOutcome;
            }
        }

        SetSoftLimit(1, -1);
        return ReopenHolds(path, options, N, rewrite: false) ? Survived : WrongOutcome;
    }

    /// <summary>
    /// A heap of 64 MiB created with the default maximum size (16 × its size, a 1 GiB reservation) opened in a process
    /// whose address space (RLIMIT_AS) leaves room for a few hundred MiB more: the open's IOException advises lowering
    /// HeapFileOptions.MaxSize, which Open ignores ("size fields are ignored"), and SharedMapping fails the same way, so
    /// nothing the caller could pass opened it. An open asking for a smaller MaxSize now reserves that much (its growth
    /// bounded by it).
    /// </summary>
    private static int OpenUnderAddressSpaceLimit(string path)
    {
        using (BufferedDurableHeap created = BufferedDurableHeap.Create(path, new HeapFileOptions { Size = 64L << 20, Domain = PersistenceDomainKind.MappedFile }))
        {
            new PersistentHashMap<long, long>(created, typeId: 1).Set(1, 1);
        }

        long virtualSize = 0;
        foreach (string line in File.ReadLines("/proc/self/status"))
        {
            if (line.StartsWith("VmSize:", StringComparison.Ordinal))
            {
                virtualSize = long.Parse(line["VmSize:".Length..].Trim().Split(' ')[0], System.Globalization.CultureInfo.InvariantCulture) * 1024;
            }
        }

        SetSoftLimit(9, virtualSize + (384L << 20));

        // The recorded maximum (1 GiB) cannot be reserved under the limit: the error names the limit, for either mapping
        // (it advised SharedMapping, which fails the same way under an address-space limit).
        foreach (MappedFileWriteBack writeBack in new[] { MappedFileWriteBack.PrivateMapping, MappedFileWriteBack.SharedMapping })
        {
            try
            {
                using BufferedDurableHeap whole = BufferedDurableHeap.Open(path, new HeapFileOptions { Domain = PersistenceDomainKind.MappedFile, MappedFileWriteBack = writeBack });
                Console.WriteLine($"{writeBack}: the whole reservation opened under the limit (the limit is too high for this check)");
                return WrongOutcome;
            }
            catch (IOException e) when (e.Message.Contains("RLIMIT_AS", StringComparison.Ordinal))
            {
                Console.WriteLine($"{writeBack}: refused, naming the limit");
            }
            catch (IOException e)
            {
                Console.WriteLine($"{writeBack}: refused without naming the address-space limit: {e.Message}");
                return WrongOutcome;
            }
        }

        var smaller = new HeapFileOptions { Size = 64L << 20, MaxSize = 128L << 20, Domain = PersistenceDomainKind.MappedFile, MappedFileWriteBack = MappedFileWriteBack.SharedMapping };
        try
        {
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(path, smaller);
            bool holds = new PersistentHashMap<long, long>(heap, typeId: 1).TryGetValue(1, out long v) && v == 1;
            Console.WriteLine($"opened under the limit: {holds}");
            return holds ? Survived : WrongOutcome;
        }
        catch (IOException e)
        {
            Console.WriteLine($"open under the limit failed: {e.Message}");
            return WrongOutcome;
        }
    }

    /// <summary>
    /// A parallel <see cref="PersistentHeap.ForEachAllocated"/> whose visitor interrupts its own thread once, on the scan's
    /// loop thread (which runs bodies too), then the heap is disposed. The interrupt broke the loop's wait for its other
    /// workers there: the scan threw while they went on calling the visitor over the mapping, and the Dispose unmapped
    /// under them (an access violation: the process died). Now the scan returns or throws only once no visitor runs: a
    /// visitor call after it ended is a wrong outcome, a crash is a crash. The control lets the scan end without waiting
    /// for its bodies (<see cref="LoopBodies.CloseWithoutWaitingForTesting"/>).
    /// </summary>
    private static int VisitorInterruptsItsLoop(string path, bool control)
    {
        LoopBodies.CloseWithoutWaitingForTesting = control;
        var options = new HeapFileOptions { Size = 64L << 20, Domain = PersistenceDomainKind.MappedFile };
        for (int round = 0; round < 5; round++)
        {
            PersistentHeap heap = PersistentHeap.Create(path + round, options);
            // Enough payloads that the bodies (tens of microseconds each) still run for a few hundred milliseconds after
            // the interrupt, when the control's scan has ended: 100,000 took 4 s a round here, the control caught at 20,000.
            for (int i = 0; i < 20_000; i++)
            {
                heap.Allocate(200, typeId: 1);
            }

            int interrupted = 0, ended = 0;
            long callsAfterTheEnd = 0;
            string outcome;
            try
            {
                heap.ForEachAllocated(
                    (_, _) =>
                    {
                        // Volatile.Read: pairs with the Volatile.Write after the scan.
                        if (Volatile.Read(ref ended) != 0)
                        {
                            Interlocked.Increment(ref callsAfterTheEnd);
                        }

                        if (Thread.CurrentThread.Name == "epvs-parallel-loop" && Interlocked.Exchange(ref interrupted, 1) == 0)
                        {
                            Thread.CurrentThread.Interrupt();
                        }

                        Thread.SpinWait(2000);
                    },
                    degreeOfParallelism: 8);
                outcome = "returned";
            }
            catch (ThreadInterruptedException)
            {
                outcome = "threw ThreadInterruptedException";
            }

            // Volatile.Write: release; the visitor's Volatile.Read.
            Volatile.Write(ref ended, 1);
            heap.Dispose();
            long after = Interlocked.Read(ref callsAfterTheEnd);
            Console.WriteLine($"round {round}: the scan {outcome} (interrupt raised: {interrupted == 1}); visitor calls after it ended: {after}");
            if (after != 0)
            {
                return WrongOutcome;
            }
        }

        return Survived;
    }

    /// <summary>
    /// A map of the widest key type it takes used on a thread with a 1 MiB stack (Windows' default): every call, SetMany
    /// included, must work (with 60 KiB keys SetMany overflowed it, and the process died).
    /// </summary>
    private static int WidestKeysOnASmallStack()
    {
        using var domain = new SimulatedPersistenceDomain(1 << 20, 64 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file);
        var map = new PersistentHashMap<HugeValueTypeTests.LargestKey, long>(heap, typeId: 1);
        bool holds = false;
        var worker = new Thread(
            () =>
            {
                var items = new KeyValuePair<HugeValueTypeTests.LargestKey, long>[3];
                for (int i = 0; i < items.Length; i++)
                {
                    var key = default(HugeValueTypeTests.LargestKey);
                    ((Span<byte>)key)[7] = (byte)(i + 1);
                    items[i] = new KeyValuePair<HugeValueTypeTests.LargestKey, long>(key, i * 10);
                }

                map.SetMany(items);
                map.Set(items[0].Key, 5);
                holds = map.TryGetValue(items[0].Key, out long first) && first == 5 && map.TryGetValue(items[2].Key, out long last) && last == 20
                    && map.Remove(items[1].Key) && map.Count == 2;
            },
            maxStackSize: 1 << 20);
        worker.Start();
        worker.Join();
        heap.Sync();
        Console.WriteLine($"the widest keys on a 1 MiB stack: {(holds ? "every call worked" : "wrong results")}");
        return holds ? Survived : WrongOutcome;
    }

    /// <summary>
    /// TryDequeue of a 600 KiB element into a local of the caller, on a thread with a 1 MiB stack: the local is the one
    /// copy the type needs (the map's TryGetValue into such a local works, the control); TryDequeue made another in its
    /// own frame (its <c>head</c>), 1.2 MiB in all. The element is enqueued from native memory, on the main thread.
    /// </summary>
    private static unsafe int WideDequeueOnASmallStack()
    {
        using var domain = new SimulatedPersistenceDomain(1 << 20, 64 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file);
        var queue = new PersistentQueue<HugeValueTypeTests.WiderValue>(heap, typeId: 1);
        var map = new PersistentHashMap<long, HugeValueTypeTests.WiderValue>(heap, typeId: 2);
        var value = (HugeValueTypeTests.WiderValue*)System.Runtime.InteropServices.NativeMemory.AllocZeroed((nuint)sizeof(HugeValueTypeTests.WiderValue));
        try
        {
            ((byte*)value)[5] = 42;
            EnqueueWider(queue, value);
            SetWider(map, value);
            string? failed = null;
            var worker = new Thread(
                () =>
                {
                    failed = ReadWiderFromMap(map) ? null : "the map's TryGetValue read a wrong value";
                    failed ??= DequeueWider(queue) ? null : "TryDequeue read a wrong value";
                },
                maxStackSize: 1 << 20);
            worker.Start();
            worker.Join();
            Console.WriteLine($"TryDequeue of {sizeof(HugeValueTypeTests.WiderValue)} bytes into a local on a 1 MiB stack: {failed ?? "worked"}");
            return failed is null ? Survived : WrongOutcome;
        }
        finally
        {
            System.Runtime.InteropServices.NativeMemory.Free(value);
        }
    }

    [System.Runtime.CompilerServices.MethodImpl(System.Runtime.CompilerServices.MethodImplOptions.NoInlining)]
    private static unsafe void EnqueueWider(PersistentQueue<HugeValueTypeTests.WiderValue> queue, HugeValueTypeTests.WiderValue* value) => queue.Enqueue(*value);

    [System.Runtime.CompilerServices.MethodImpl(System.Runtime.CompilerServices.MethodImplOptions.NoInlining)]
    private static unsafe void SetWider(PersistentHashMap<long, HugeValueTypeTests.WiderValue> map, HugeValueTypeTests.WiderValue* value) => map.Set(1, *value);

    [System.Runtime.CompilerServices.MethodImpl(System.Runtime.CompilerServices.MethodImplOptions.NoInlining)]
    private static bool ReadWiderFromMap(PersistentHashMap<long, HugeValueTypeTests.WiderValue> map) =>
        map.TryGetValue(1, out HugeValueTypeTests.WiderValue read) && ((ReadOnlySpan<byte>)read)[5] == 42;

    [System.Runtime.CompilerServices.MethodImpl(System.Runtime.CompilerServices.MethodImplOptions.NoInlining)]
    private static bool DequeueWider(PersistentQueue<HugeValueTypeTests.WiderValue> queue) =>
        queue.TryDequeue(out HugeValueTypeTests.WiderValue read) && ((ReadOnlySpan<byte>)read)[5] == 42;

    /// <summary>
    /// SetMany of the widest keys (4 KiB) on a thread with a 96 KiB stack, after a warm-up on this thread (the JIT's own
    /// stack left out): Set of them needs about 16 KiB above the thread's start (four copies of the key), SetMany needed 84
    /// (its ring of 16 keys read ahead, stackalloc'ed: 64 KiB, and five copies).
    /// </summary>
    private static int WidestKeysSetManyOnA96KStack()
    {
        using var domain = new SimulatedPersistenceDomain(1 << 20, 64 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file);
        var map = new PersistentHashMap<HugeValueTypeTests.LargestKey, long>(heap, typeId: 1);
        var items = new KeyValuePair<HugeValueTypeTests.LargestKey, long>[20];
        for (int i = 0; i < items.Length; i++)
        {
            var key = default(HugeValueTypeTests.LargestKey);
            ((Span<byte>)key)[7] = (byte)(i + 1);
            items[i] = new KeyValuePair<HugeValueTypeTests.LargestKey, long>(key, i * 10);
        }

        map.SetMany(items); // the warm-up: compiled on this thread
        int inserted = -1;
        var worker = new Thread(() => inserted = map.SetMany(items), maxStackSize: 96 << 10);
        worker.Start();
        worker.Join();
        Console.WriteLine($"SetMany of the widest keys on a 96 KiB stack: {inserted} inserted, {map.Count} keys");
        return inserted == 0 && map.Count == items.Length ? Survived : WrongOutcome;
    }

    /// <summary>
    /// ToDictionary of the largest entry a .NET dictionary holds (the widest key, 4 KiB, and a value of 61,424 bytes: 64 KiB
    /// with the entry's fields) on a thread with a 128 KiB stack: the call's result is on the heap, so its frames should
    /// hold at most about one copy of the entry.
    /// </summary>
    private static int LargestEntriesToDictionaryOnA128KStack()
    {
        using var domain = new SimulatedPersistenceDomain(1 << 20, 64 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file);
        var map = new PersistentHashMap<HugeValueTypeTests.LargestKey, HugeValueTypeTests.WidestDictionaryValue>(heap, typeId: 1);
        var key = default(HugeValueTypeTests.LargestKey);
        ((Span<byte>)key)[7] = 1;
        var value = default(HugeValueTypeTests.WidestDictionaryValue);
        ((Span<byte>)value)[3] = 4;
        map.Set(key, value);
        int count = -1;
        byte read = 0;
        var worker = new Thread(
            () =>
            {
                Dictionary<HugeValueTypeTests.LargestKey, HugeValueTypeTests.WidestDictionaryValue> all = map.ToDictionary();
                count = all.Count;
                read = ((ReadOnlySpan<byte>)System.Runtime.InteropServices.CollectionsMarshal.GetValueRefOrNullRef(all, key))[3];
            },
            maxStackSize: 128 << 10);
        worker.Start();
        worker.Join();
        Console.WriteLine($"ToDictionary of the largest entries on a 128 KiB stack: {count} entries, byte {read}");
        return count == 1 && read == 4 ? Survived : WrongOutcome;
    }

    /// <summary>
    /// A map of 256 KiB values on a thread with a 1 MiB stack: every call, and a reopen's recovery. The values live in
    /// native memory; the only copies on the stack are the ones the calls' own signatures make in the caller's frames
    /// (<c>Set</c>'s argument, the pairs built for <c>SetMany</c>, which a native buffer holds: the runtime makes no array of
    /// so large a type), in frames that return before the next call.
    /// </summary>
    private static unsafe int WideValuesOnASmallStack(string path)
    {
        var value = (HugeValueTypeTests.WideValue*)System.Runtime.InteropServices.NativeMemory.AllocZeroed((nuint)sizeof(HugeValueTypeTests.WideValue));
        try
        {
            string? failed = null;
            var worker = new Thread(() => failed = WideValueCalls(path, value), maxStackSize: 1 << 20);
            worker.Start();
            worker.Join();
            Console.WriteLine($"values of {sizeof(HugeValueTypeTests.WideValue)} bytes on a 1 MiB stack: {failed ?? "every call worked"}");
            return failed is null ? Survived : WrongOutcome;
        }
        finally
        {
            System.Runtime.InteropServices.NativeMemory.Free(value);
        }
    }

    [System.Runtime.CompilerServices.MethodImpl(System.Runtime.CompilerServices.MethodImplOptions.NoInlining)]
    private static unsafe string? WideValueCalls(string path, HugeValueTypeTests.WideValue* value)
    {
        var options = new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan };
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, new HeapFileOptions { Size = 16L << 20 }, options))
        {
            var map = new PersistentHashMap<long, HugeValueTypeTests.WideValue>(heap, typeId: 1);
            Mark(value, 1);
            SetWide(map, 1, value);
            Mark(value, 2);
            SetWide(map, 1, value);
            // In native memory: the runtime makes no array of a type this large.
            var items = (KeyValuePair<long, HugeValueTypeTests.WideValue>*)System.Runtime.InteropServices.NativeMemory.Alloc(2, (nuint)sizeof(KeyValuePair<long, HugeValueTypeTests.WideValue>));
            try
            {
                WidePairs(items, value);
                if (map.SetMany(new ReadOnlySpan<KeyValuePair<long, HugeValueTypeTests.WideValue>>(items, 2)) != 2)
                {
                    return "SetMany did not insert its two new keys";
                }
            }
            finally
            {
                System.Runtime.InteropServices.NativeMemory.Free(items);
            }

            if (!map.Remove(3) || map.Count != 2)
            {
                return "Remove or Count was wrong";
            }

            heap.Sync();
        }

        using (BufferedDurableHeap heap = BufferedDurableHeap.Open(path, null, options))
        {
            var map = new PersistentHashMap<long, HugeValueTypeTests.WideValue>(heap, typeId: 1);
            if (map.Count != 2 || !map.TryGetValue(1, out *value) || Marked(value) != 2 || !map.TryGetValue(2, out *value) || Marked(value) != 20 || map.TryGetValue(3, out *value))
            {
                return "the reopened map differs";
            }
        }

        return null;
    }

    [System.Runtime.CompilerServices.MethodImpl(System.Runtime.CompilerServices.MethodImplOptions.NoInlining)]
    private static unsafe void SetWide(PersistentHashMap<long, HugeValueTypeTests.WideValue> map, long key, HugeValueTypeTests.WideValue* value) => map.Set(key, *value);

    [System.Runtime.CompilerServices.MethodImpl(System.Runtime.CompilerServices.MethodImplOptions.NoInlining)]
    private static unsafe void WidePairs(KeyValuePair<long, HugeValueTypeTests.WideValue>* items, HugeValueTypeTests.WideValue* value)
    {
        Mark(value, 20);
        items[0] = new KeyValuePair<long, HugeValueTypeTests.WideValue>(2, *value);
        Mark(value, 30);
        items[1] = new KeyValuePair<long, HugeValueTypeTests.WideValue>(3, *value);
    }

    private static unsafe void Mark(HugeValueTypeTests.WideValue* value, byte mark)
    {
        ((Span<byte>)(*value))[0] = mark;
        ((Span<byte>)(*value))[sizeof(HugeValueTypeTests.WideValue) - 1] = mark;
    }

    private static unsafe int Marked(HugeValueTypeTests.WideValue* value) =>
        ((Span<byte>)(*value))[0] == ((Span<byte>)(*value))[sizeof(HugeValueTypeTests.WideValue) - 1] ? ((Span<byte>)(*value))[0] : -1;

    /// <summary>
    /// Run with the runtime's DisableFileLocking switch (DOTNET_SYSTEM_IO_DISABLEFILELOCKING=1), under which
    /// <see cref="FileShare.None"/> takes no lock: a heap file open in this process is opened again. The second open must
    /// be refused (AlreadyOpen); it used to succeed, both heaps wrote and synced, and the file kept one heap's writes only.
    /// Inconclusive when the switch is not in effect (two plain FileShare.None opens of one file are refused). The control
    /// takes no lock of its own (<see cref="HeapFileTestHooks.IgnoreLockConflictsForTesting"/>).
    /// </summary>
    /// <summary>
    /// Run without the runtime's file locking: an in-place create (<see cref="HeapFileTestHooks.CreateInPlace"/>) races an
    /// opener that opens and locks the new file before the create takes its own lock. The create must say AlreadyOpen
    /// (a review found the create's full-disk filter taking that error for InsufficientSpace). Inconclusive when the racer
    /// never wins in 40 rounds.
    /// </summary>
    private static int CreateInPlaceLosesTheLock(string path)
    {
        HeapFileTestHooks.CreateInPlace = true;
        var options = new HeapFileOptions { Size = 512L << 20, Domain = PersistenceDomainKind.MappedFile };
        for (int round = 0; round < 40; round++)
        {
            string file = path + round;
            int stop = 0, racerFd = -1;
            var racer = new Thread(() =>
            {
                // Volatile.Read: pairs with the Volatile.Write below.
                while (Volatile.Read(ref stop) == 0)
                {
                    int fd = Interop.Libc.Open(file, Interop.Libc.ReadWrite | Interop.Libc.CloseOnExec, 0);
                    if (fd >= 0)
                    {
                        _ = Interop.Libc.Flock(fd, Interop.Libc.LockExclusive | Interop.Libc.LockNonBlocking);
                        racerFd = fd;
                        return;
                    }
                }
            })
            { IsBackground = true };
            racer.Start();
            try
            {
                using HeapFile created = HeapFile.Create(file, options);
                Console.WriteLine($"round {round}: created (the racer lost)");
            }
            catch (HeapFileException e)
            {
                Console.WriteLine($"round {round}: {e.Error}: {e.Message}");
                return e.Error == HeapFileError.AlreadyOpen ? Survived : WrongOutcome;
            }
            finally
            {
                // Volatile.Write: release; the racer's Volatile.Read.
                Volatile.Write(ref stop, 1);
                racer.Join();
                if (racerFd >= 0)
                {
                    _ = Interop.Libc.Close(racerFd);
                }

                File.Delete(file);
            }
        }

        return Inconclusive;
    }

    private static int OpenTwiceWithoutRuntimeLocking(string path, bool control)
    {
        HeapFileTestHooks.IgnoreLockConflictsForTesting = control;
        string probe = path + ".probe";
        File.WriteAllBytes(probe, new byte[1]);
        using (new FileStream(probe, FileMode.Open, FileAccess.ReadWrite, FileShare.None))
        {
            try
            {
                using var again = new FileStream(probe, FileMode.Open, FileAccess.ReadWrite, FileShare.None);
            }
            catch (IOException)
            {
                Console.WriteLine("the runtime locks files (DisableFileLocking not in effect)");
                return Inconclusive;
            }
        }

        var options = new HeapFileOptions { Size = 4L << 20, Domain = PersistenceDomainKind.MappedFile };
        using (BufferedDurableHeap created = BufferedDurableHeap.Create(path, options))
        {
            new PersistentHashMap<long, long>(created, typeId: 1).Set(1, 1);
        }

        using BufferedDurableHeap first = BufferedDurableHeap.Open(path, options);
        try
        {
            using BufferedDurableHeap second = BufferedDurableHeap.Open(path, options);
            Console.WriteLine("the second open of a file already open succeeded: two heaps would write one file");
            return WrongOutcome;
        }
        catch (HeapFileException e) when (e.Error == HeapFileError.AlreadyOpen)
        {
            Console.WriteLine($"the second open was refused: {e.Message}");
            return Survived;
        }
    }

    /// <summary>
    /// A crash image of a heap with 200,000 map entries opened (a full scan, RecoveryParallelism 2) on a thread that
    /// another thread interrupts again and again, for 4 s. The interrupt broke the opener's wait for recovery's parallel
    /// workers: the open threw and unmapped the file while they still read it, and the process died (an access
    /// violation). Whatever an open throws now, the process lives, and the file then opens with every entry. The control
    /// runs the loops on the opener's thread again (<see cref="InterruptShield.RunLoopsInlineForTesting"/>).
    /// </summary>
    private static int OpenInterrupted(string path, bool control)
    {
        InterruptShield.RunLoopsInlineForTesting = control;
        const int Entries = 200_000;
        string image = path + ".image";
        var fileOptions = new HeapFileOptions { Size = 32L << 20, MaxSize = 1L << 30, Domain = PersistenceDomainKind.MappedFile };
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, fileOptions))
        {
            var map = new PersistentHashMap<long, long>(heap, typeId: 1);
            var batch = new KeyValuePair<long, long>[Entries];
            for (int i = 0; i < Entries; i++)
            {
                batch[i] = new(i, i);
            }

            map.SetMany(batch);
            heap.Sync();

            // The durable state without the clean-shutdown mark, as a crash leaves it (cp: File.Copy would take the lock
            // the open heap holds).
            using Process copy = Process.Start("cp", new[] { path, image })!;
            copy.WaitForExit();
        }

        var random = new Random(42);
        var clock = Stopwatch.StartNew();
        int opens = 0, interrupted = 0;
        while (clock.Elapsed < TimeSpan.FromSeconds(4))
        {
            File.Copy(image, path, overwrite: true);
            Exception? failure = null;
            BufferedDurableHeap? opened = null;
            using var done = new ManualResetEventSlim();
            var opener = new Thread(() =>
            {
                try
                {
                    opened = BufferedDurableHeap.Open(path, fileOptions, new BufferedDurableHeapOptions { RecoveryParallelism = 2 });
                }
                catch (Exception e)
                {
                    failure = e;
                }
                finally
                {
                    done.Set();
                }
            });
            opener.Start();
            long next = random.Next(0, 2_000_000);
            var since = Stopwatch.StartNew();
            while (!done.IsSet)
            {
                if (since.ElapsedTicks > next)
                {
                    opener.Interrupt();
                    next += random.Next(1_000, 200_000);
                }

                Thread.SpinWait(50);
            }

            opener.Join();
            opened?.Dispose();
            opens++;
            if (failure is ThreadInterruptedException)
            {
                interrupted++;
            }
            else if (failure is not null)
            {
                Console.WriteLine($"open threw {failure}");
                return WrongOutcome;
            }

            using BufferedDurableHeap again = BufferedDurableHeap.Open(path, fileOptions);
            long count = new PersistentHashMap<long, long>(again, typeId: 1).Count;
            if (count != Entries)
            {
                Console.WriteLine($"reopened with {count} entries, not {Entries}");
                return WrongOutcome;
            }
        }

        Console.WriteLine($"survived {opens} interrupted opens ({interrupted} threw ThreadInterruptedException)");
        return Survived;
    }

    /// <summary>The file size limit the parent runs <see cref="FileSizeLimit"/> under.</summary>
    internal const long FileSizeLimitBytes = 6000 * 1024;

    /// <summary>How many 3000-byte values the parent writes into the 8 MiB file larger than the limit.</summary>
    internal const int BigFileValues = 2000;

    /// <summary>Creates a heap at <paramref name="path"/> and sets up to <paramref name="count"/> 3000-byte values (value i filled with i) until it is full; returns how many it holds, synced.</summary>
    internal static int FillUntilFull(string path, HeapFileOptions fileOptions, int count)
    {
        int n = 0;
        using BufferedDurableHeap heap = BufferedDurableHeap.Create(path, fileOptions);
        var map = new PersistentByteMap<long>(heap, typeId: 1);
        byte[] value = new byte[3000];
        try
        {
            for (; n < count; n++)
            {
                value.AsSpan().Fill((byte)n);
                map.Set(n, value);
            }
        }
        catch (InsufficientMemoryException)
        {
        }

        heap.Sync();
        return n;
    }

    /// <summary>Reopens the heap and checks its <paramref name="n"/> values; with <paramref name="rewrite"/> sets each again (new copies, anywhere in the file) and syncs.</summary>
    private static bool ReopenHolds(string path, HeapFileOptions fileOptions, int n, bool rewrite)
    {
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(path, fileOptions);
        var map = new PersistentByteMap<long>(heap, typeId: 1);
        for (int i = 0; i < n; i++)
        {
            byte[]? v = map.Get(i);
            if (v is null || v.Length != 3000 || v[0] != (byte)i || v[^1] != (byte)i)
            {
                Console.Error.WriteLine($"value {i} wrong after reopen");
                return false;
            }

            if (rewrite)
            {
                map.Set(i, v);
            }
        }

        heap.Sync();
        Console.WriteLine($"reopened {path} ({heap.Heap.File.MappedFileWriteBack}): {map.Count} values of {n}");
        return map.Count == n;
    }

    private static HeapFileException ExpectHeapFileError(Action call, HeapFileError error)
    {
        try
        {
            call();
        }
        catch (HeapFileException e) when (e.Error == error)
        {
            return e;
        }

        throw new InvalidOperationException($"expected HeapFileException {error}");
    }

    /// <summary>
    /// A raw heap on the caller's file is disposed while a call of it (a scan, parked in its visitor) outlives the
    /// Dispose's wait (shortened here, a process-wide setting: hence a child). The file's Dispose then quarantines the
    /// mapping, which must be freed once the call has left (it was kept for the life of the process, the whole
    /// reservation's address space). Prints the quarantine before and after the call left; the control keeps it.
    /// </summary>
    private static int RawCallsOutliveDisposeWait(string path, bool control)
    {
        HeapFile.DisposeWait = TimeSpan.FromMilliseconds(200);
        HeapFile file = HeapFile.Create(path, new HeapFileOptions { Size = 4L << 20 });
        file.ReleaseAfterRawHeapLeftCallsSkippedForTesting = control;
        var heap = new PersistentHeap(file);
        heap.Persist(heap.Allocate(64, typeId: 1));
        PersistenceDomain domain = file.Domain;
        using var visiting = new ManualResetEventSlim();
        using var goOn = new ManualResetEventSlim();
        Exception? scanFailure = null;
        var scanner = new Thread(() => scanFailure = Record.Exception(() => heap.ForEachAllocated((_, _) =>
        {
            visiting.Set();
            goOn.Wait(TimeSpan.FromSeconds(30));
        })))
        { IsBackground = true };
        scanner.Start();
        if (!visiting.Wait(TimeSpan.FromSeconds(30)))
        {
            Console.Error.WriteLine("the scan never reached its visitor");
            return WrongOutcome;
        }

        Exception? heapDispose = Record.Exception(heap.Dispose);
        Exception? fileDispose = Record.Exception(file.Dispose);
        bool before = domain.HoldsQuarantinedMemory;
        goOn.Set();
        if (!scanner.Join(TimeSpan.FromSeconds(30)))
        {
            Console.Error.WriteLine("the scan never returned");
            return WrongOutcome;
        }

        Console.WriteLine($"heap dispose: {heapDispose?.GetType().Name ?? "returned"}; file dispose: {fileDispose?.GetType().Name ?? "returned"}; scan: {scanFailure?.GetType().Name ?? "completed"}; quarantined before the call left: {before}; after: {domain.HoldsQuarantinedMemory}");
        return Survived;
    }

    /// <summary>Every call after Dispose throws ObjectDisposedException (it read the unmapped table before: a crash).</summary>
    private static int RawUseAfterDispose(string path)
    {
        PersistentHeap heap = PersistentHeap.Create(path, new HeapFileOptions { Size = 4L << 20 });
        PayloadRef block = heap.Allocate(64, typeId: 1);
        HeapFile file = heap.File;
        heap.Dispose();
        var calls = new List<(string, Action)>
        {
            ("GetHeader", () => heap.GetHeader(block)),
            ("GetPayload", () => heap.GetPayload(block)),
            ("GetPayloadAddress", () => heap.GetPayloadAddress(block)),
            ("Allocate", () => heap.Allocate(64, 1)),
            ("Free", () => heap.Free(block)),
            ("Persist", () => heap.Persist(block)),
            ("WriteBack", () => heap.WriteBack(block)),
            ("WriteBackHeader", () => heap.WriteBackHeader(block)),
            ("ForEachAllocated", () => heap.ForEachAllocated((_, _) => { })),
            ("File.GetRoot", () => file.GetRoot(0)),
            ("File.SetRoot", () => file.SetRoot(0, 1)),
            ("File.EpochClock", () => _ = file.EpochClock),
            ("File.Size", () => _ = file.Size),
        };
        int wrong = 0;
        foreach ((string name, Action call) in calls)
        {
            try
            {
                call();
                Console.Error.WriteLine($"{name}: returned after Dispose");
                wrong++;
            }
            catch (ObjectDisposedException)
            {
            }
        }

        return wrong == 0 ? Survived : WrongOutcome;
    }

    /// <summary>
    /// Threads calling the raw heap while another disposes it: they get ObjectDisposedException, never a crash. One
    /// thread allocates, writes, persists and frees; the other scans the heap's blocks (<see cref="PersistentHeap.ForEachAllocated"/>),
    /// a call that reads the mapping for as long as it runs, so that Dispose mostly lands while a call is inside: the
    /// heap refuses a call that begins after its Dispose did, and only the wait for the calls already inside keeps the
    /// mapping from being unmapped under them, which the control skips.
    /// </summary>
    private static int RawDisposeDuringCalls(string path, bool control)
    {
        HeapFileTestHooks.SkipOperationWait = control;
        PersistentHeap heap = PersistentHeap.Create(path, new HeapFileOptions { Size = 16L << 20 });
        for (int i = 0; i < 20_000; i++)
        {
            heap.Allocate(256, 2);
        }

        long calls = 0;
        var workers = new Thread[2];
        for (int t = 0; t < workers.Length; t++)
        {
            bool scans = t == 1;
            workers[t] = new Thread(() =>
            {
                try
                {
                    long visited = 0;
                    while (true)
                    {
                        if (scans)
                        {
                            // A slow visitor: each scan runs for milliseconds, longer than Dispose takes to unmap.
                            heap.ForEachAllocated((_, header) =>
                            {
                                visited += header.Size;
                                Thread.SpinWait(200);
                            });
                        }
                        else
                        {
                            PayloadRef b = heap.Allocate(256, 1);
                            heap.GetPayload(b).Fill(7);
                            heap.Persist(b);
                            heap.Free(b);
                        }

                        Interlocked.Increment(ref calls);
                    }
                }
                catch (ObjectDisposedException)
                {
                }
            });
            workers[t].Start();
        }

        // Dispose while both workers are busy calling (bounded wait for them to get going).
        var clock = System.Diagnostics.Stopwatch.StartNew();
        while (Volatile.Read(ref calls) < 2_000 && clock.Elapsed < TimeSpan.FromSeconds(30))
        {
            Thread.Yield();
        }

        heap.Dispose();
        foreach (Thread w in workers)
        {
            if (!w.Join(TimeSpan.FromSeconds(30)))
            {
                return WrongOutcome;
            }
        }

        return Survived;
    }

    /// <summary>
    /// Allocation inside an operation takes no epoch of the heap file (the operation's own region is what
    /// <see cref="BufferedDurableHeap.Dispose"/> waits for): a thread that stays inside an operation while Dispose
    /// runs, and allocates new payloads (writing their headers) after Dispose returned, does not crash. The control makes Dispose
    /// skip that wait, so it unmaps under the allocations.
    /// </summary>
    private static int DurableAllocateAfterDispose(string path, bool control)
    {
        var options = new BufferedDurableHeapOptions { SyncTimeout = TimeSpan.FromMilliseconds(300) };
        if (control)
        {
            options.Faults = DurabilityFaults.SkipDisposeWait;
        }

        BufferedDurableHeap heap = BufferedDurableHeap.Create(path, new HeapFileOptions { Size = 8L << 20 }, options);
        int allocated = 0;
        (bool timedOut, string? failure) = DisposeWhileInsideAnOperation(heap, (op, waitUntilDisposed) =>
        {
            // The first allocation fills this thread's cache, so the ones after Dispose touch only the mapping.
            op.GetPayload(op.Allocate(16, typeId: 2)).Fill(1);
            waitUntilDisposed();
            for (int i = 0; i < 20; i++)
            {
                // Each allocation writes the new block's header into the mapping. (GetPayload is a checked call:
                // after Dispose it throws ObjectDisposedException, so it is not used here.)
                op.Allocate(16, typeId: 2);
                allocated++;
            }
        });
        if (failure is not null || !timedOut || allocated != 20)
        {
            Console.Error.WriteLine($"timedOut={timedOut} allocated={allocated} worker={failure}");
            return WrongOutcome;
        }

        return Survived;
    }

    /// <summary>
    /// A thread stays inside a buffered-heap operation while Dispose runs: Dispose times out (TimeoutException), the
    /// thread goes on writing its payload without crashing, and the file lock is released (the file reopens).
    /// </summary>
    private static int DurableDisposeDuringOperation(string path, bool control)
    {
        var options = new BufferedDurableHeapOptions { SyncTimeout = TimeSpan.FromMilliseconds(300) };
        if (control)
        {
            options.Faults = DurabilityFaults.SkipDisposeWait;
        }

        BufferedDurableHeap heap = BufferedDurableHeap.Create(path, new HeapFileOptions { Size = 8L << 20 }, options);
        var map = new PersistentHashMap<long, long>(heap, typeId: 1);
        for (long k = 0; k < 100; k++)
        {
            map.Set(k, k * 10);
        }

        heap.Sync();
        (bool timedOut, string? failure) = DisposeWhileInsideAnOperation(heap, (op, waitUntilDisposed) =>
        {
            Span<byte> payload = op.GetPayload(op.Allocate(4096, typeId: 2));
            waitUntilDisposed();

            // Still inside the operation after Dispose returned: write the payload it holds, many times.
            for (int i = 0; i < 100; i++)
            {
                payload.Fill((byte)i);
            }
        });
        if (failure is not null || !timedOut)
        {
            Console.Error.WriteLine($"timedOut={timedOut} worker={failure}");
            return WrongOutcome;
        }

        // The lock was released: the file opens again, and the synced data is there.
        using BufferedDurableHeap reopened = BufferedDurableHeap.Open(path);
        var again = new PersistentHashMap<long, long>(reopened, typeId: 1);
        return again.Count == 100 && again.TryGetValue(42, out long v) && v == 420 ? Survived : WrongOutcome;
    }

    private delegate void InsideOperation(DurableOperation op, Action waitUntilDisposed);

    /// <summary>
    /// A worker begins an operation and runs <paramref name="body"/> in it; when the body calls its second argument,
    /// the heap is disposed (bounded waits throughout) and the body goes on after Dispose returned. Whether Dispose
    /// timed out, and why the worker failed (null: it ended, or said ObjectDisposedException, without crashing).
    /// </summary>
    private static (bool TimedOut, string? Failure) DisposeWhileInsideAnOperation(BufferedDurableHeap heap, InsideOperation body)
    {
        using var inside = new ManualResetEventSlim();
        using var disposed = new ManualResetEventSlim();
        Exception? workerFailure = null;
        var worker = new Thread(() =>
        {
            try
            {
                using DurableOperation op = heap.BeginOperation();
                body(op, () =>
                {
                    inside.Set();
                    disposed.Wait(TimeSpan.FromSeconds(30));
                });
            }
            catch (ObjectDisposedException)
            {
                // Ending the operation on a closed heap may say so; what matters is that nothing crashed.
            }
            catch (Exception e)
            {
                workerFailure = e;
            }
        });
        worker.Start();
        inside.Wait(TimeSpan.FromSeconds(30));
        bool timedOut = false;
        try
        {
            heap.Dispose();
        }
        catch (TimeoutException)
        {
            timedOut = true;
        }

        disposed.Set();
        return worker.Join(TimeSpan.FromSeconds(30)) ? (timedOut, workerFailure?.ToString()) : (timedOut, "the worker did not end within 30 s");
    }

    /// <summary>Opens a (damaged) buffered heap: prints how, or why it was refused; a crash is the only failure.</summary>
    private static int OpenBuffered(string path)
    {
        try
        {
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(path, new HeapFileOptions { Domain = PersistenceDomainKind.MappedFile });
            Console.WriteLine($"opened: fast reopen {heap.Recovery.FastReopen}");
        }
        catch (HeapFileException e)
        {
            Console.WriteLine($"refused: {e.Error}: {e.Message}");
        }

        return Survived;
    }

    /// <summary>
    /// The process dies (SIGKILL) in the middle of <see cref="HeapFile.Create(string, HeapFileOptions?)"/>: once the file is
    /// formatted and persisted, before it is named; the control creates it in place, and dies before formatting it.
    /// Never returns.
    /// </summary>
    private static int CreateKilled(string path, bool control)
    {
        HeapFileTestHooks.CreateInPlace = control;
        HeapFileTestHooks.BeforeNamingCreatedFile = _ => Process.GetCurrentProcess().Kill();
        HeapFileTestHooks.BeforeFormattingInPlace = _ => Process.GetCurrentProcess().Kill();
        using HeapFile file = HeapFile.Create(path, new HeapFileOptions { Size = 4L << 20, Domain = PersistenceDomainKind.MappedFile });
        Console.WriteLine("created: the hook never ran");
        return WrongOutcome;
    }

    /// <summary>A sparse heap file on a full file system: Open reports InsufficientSpace instead of a SIGBUS later.</summary>
    /// <summary>
    /// Opening and creating a buffered heap when the process is out of file descriptors (RLIMIT_NOFILE): each failure
    /// must report its own cause — not AlreadyOpen, which sends an operator looking for another process, nor
    /// InsufficientSpace — and leave the file closed and unlocked: once descriptors are free again the same process
    /// opens it with every entry.
    /// </summary>
    private static int OpenOutOfDescriptors(string path)
    {
        const int Entries = 100;
        var fileOptions = new HeapFileOptions { Size = 1L << 20, Domain = PersistenceDomainKind.MappedFile };
        using (BufferedDurableHeap created = BufferedDurableHeap.Create(path, fileOptions))
        {
            var map = new PersistentHashMap<long, long>(created, typeId: 1);
            for (long k = 0; k < Entries; k++)
            {
                map.Set(k, k * 5);
            }
        }

        // Everything the open and the reports below load (assemblies need descriptors too) is loaded now.
        BufferedDurableHeap.Open(path, fileOptions).Dispose();
        Console.WriteLine("created and reopened once");
        Console.Error.WriteLine("(stderr ready)");
        int wrong = 0;
        // With one descriptor left the open also gets through (and recovery runs) until the advancer's thread cannot
        // start; but the runtime itself may then fail to start a thread it needs and abort ("Out of memory."), so that
        // case is tested in process with a hook (BufferedHeap_OpenWhoseAdvancerCannotStart_...), not here.
        foreach (int spare in new[] { 0 })
        {
            var held = new List<FileStream>();
            string outcome;
            try
            {
                try
                {
                    while (held.Count < 1_000_000)
                    {
                        held.Add(new FileStream("/dev/null", FileMode.Open, FileAccess.Read, FileShare.ReadWrite));
                    }
                }
                catch (IOException)
                {
                }

                for (int i = 0; i < spare; i++)
                {
                    held[^1].Dispose();
                    held.RemoveAt(held.Count - 1);
                }

                string created = path + $".new{spare}";
                foreach ((string what, Action open) in new (string, Action)[] { ("open", () => BufferedDurableHeap.Open(path, fileOptions).Dispose()), ("create", () => BufferedDurableHeap.Create(created, fileOptions).Dispose()) })
                {
                    try
                    {
                        open();
                        outcome = $"{what}: succeeded";
                    }
                    catch (Exception e)
                    {
                        outcome = $"{what}: " + (e is HeapFileException h ? $"HeapFileException {h.Error}: {h.Message}" : $"{e.GetType().Name}: {e.Message}");
                        if (e is InvalidOperationException || (e is HeapFileException { Error: HeapFileError.AlreadyOpen or HeapFileError.InsufficientSpace }))
                        {
                            wrong++;
                            outcome = "WRONG: " + outcome;
                        }
                    }

                    Console.WriteLine($"{spare} descriptor(s) left: {outcome}");
                }
            }
            finally
            {
                foreach (FileStream f in held)
                {
                    f.Dispose();
                }
            }

            try
            {
                using BufferedDurableHeap again = BufferedDurableHeap.Open(path, fileOptions);
                long count = new PersistentHashMap<long, long>(again, typeId: 1).Count;
                if (count != Entries)
                {
                    Console.Error.WriteLine($"WRONG: reopened with {count} of {Entries} entries");
                    wrong++;
                }
            }
            catch (Exception e)
            {
                Console.Error.WriteLine($"WRONG: with descriptors free again the file does not open: {e.GetType().Name}: {e.Message}");
                wrong++;
            }
        }

        return wrong == 0 ? Survived : WrongOutcome;
    }

    /// <summary>
    /// The mapping of a heap file fails (simulated errno): EROFS, as on an ext4 that turned read-only after an I/O error
    /// (open for writing still succeeds there), is <see cref="HeapFileError.ReadOnly"/>; ENOMEM of a private mapping
    /// gives the advice about the commit limit; any other errno (EIO) is an <see cref="IOException"/> without that advice.
    /// </summary>
    private static int OpenMmapFails(string path)
    {
        var options = new HeapFileOptions { Size = 4L << 20, Domain = PersistenceDomainKind.MappedFile, MappedFileWriteBack = MappedFileWriteBack.PrivateMapping };
        PersistentHeap.Create(path, options).Dispose();
        int wrong = 0;
        foreach ((int errno, string expected) in new[] { (30, "ReadOnly"), (12, "commits"), (5, "IOException") })
        {
            HeapFileTestHooks.SimulatedMmapError = errno;
            try
            {
                PersistentHeap.Open(path, options).Dispose();
                Console.Error.WriteLine($"errno {errno}: opened");
                wrong++;
            }
            catch (HeapFileException e) when (expected == "ReadOnly" && e.Error == HeapFileError.ReadOnly)
            {
                Console.WriteLine($"errno {errno}: {e.Error}: {e.Message}");
            }
            catch (IOException e) when (e is not HeapFileException && expected != "ReadOnly")
            {
                bool advice = e.Message.Contains("commits", StringComparison.Ordinal);
                Console.WriteLine($"errno {errno}: {e.Message}");
                if (advice != (expected == "commits"))
                {
                    Console.Error.WriteLine($"errno {errno}: the commit-limit advice is {(advice ? "given" : "missing")}");
                    wrong++;
                }
            }
            catch (Exception e)
            {
                Console.Error.WriteLine($"errno {errno}: {e.GetType().Name}: {e.Message}");
                wrong++;
            }
            finally
            {
                HeapFileTestHooks.SimulatedMmapError = null;
            }
        }

        // Nothing was changed by the failed opens: the file opens afterwards.
        PersistentHeap.Open(path, options).Dispose();
        return wrong == 0 ? Survived : WrongOutcome;
    }

    /// <summary>
    /// The fsync of a new heap file's directory fails (simulated EIO), whether the file was made unnamed and linked or
    /// created in place: Create throws (the file's name might not survive a crash) and leaves no file behind, so a retry
    /// creates it; EINVAL (a file system that cannot sync a directory) is no failure.
    /// </summary>
    private static int CreateDirectorySyncFails(string path)
    {
        int wrong = 0;
        foreach (bool inPlace in new[] { false, true })
        {
            string file = $"{path}.{(inPlace ? "in-place" : "unnamed")}";
            HeapFileTestHooks.CreateInPlace = inPlace;
            try
            {
                HeapFileTestHooks.SimulatedDirectorySyncError = 5;
                try
                {
                    PersistentHeap.Create(file, new HeapFileOptions { Size = 1L << 20 }).Dispose();
                    Console.Error.WriteLine($"{file}: created although its directory's fsync failed");
                    wrong++;
                }
                catch (IOException e) when (e is not HeapFileException)
                {
                    Console.WriteLine($"{file}: {e.Message}");
                }

                if (File.Exists(file))
                {
                    Console.Error.WriteLine($"{file}: left behind");
                    wrong++;
                    File.Delete(file);
                }

                HeapFileTestHooks.SimulatedDirectorySyncError = 22;
                PersistentHeap.Create(file, new HeapFileOptions { Size = 1L << 20 }).Dispose();
                HeapFileTestHooks.SimulatedDirectorySyncError = null;
                PersistentHeap.Open(file).Dispose();
            }
            finally
            {
                HeapFileTestHooks.SimulatedDirectorySyncError = null;
                HeapFileTestHooks.CreateInPlace = false;
            }
        }

        return wrong == 0 ? Survived : WrongOutcome;
    }

    /// <summary>
    /// A review's finding: when the creation failed (its directory's fsync here) and removing the new file failed too,
    /// the removal's exception skipped the disposal: the mapping, the descriptor and the file's lock stayed held for the
    /// life of the process, and the creation's message said the file was removed. Both paths: Create throws an
    /// IOException that says the file is left, and the file's lock is released (an Open does not find it AlreadyOpen).
    /// </summary>
    private static int CreateRemovalFails(string path)
    {
        int wrong = 0;
        foreach (bool inPlace in new[] { false, true })
        {
            string file = $"{path}.{(inPlace ? "in-place" : "unnamed")}";
            HeapFileTestHooks.CreateInPlace = inPlace;
            HeapFileTestHooks.SimulatedDirectorySyncError = 5;
            HeapFileTestHooks.SimulatedRemovalFailure = true;
            try
            {
                PersistentHeap.Create(file, new HeapFileOptions { Size = 1L << 20 }).Dispose();
                Console.Error.WriteLine($"{file}: created although its directory's fsync failed");
                wrong++;
            }
            catch (IOException e) when (e.Message.Contains("Removing the new file failed too", StringComparison.Ordinal))
            {
                Console.WriteLine($"{file}: {e.Message}");
            }
            finally
            {
                HeapFileTestHooks.SimulatedDirectorySyncError = null;
                HeapFileTestHooks.SimulatedRemovalFailure = false;
                HeapFileTestHooks.CreateInPlace = false;
            }

            if (!File.Exists(file))
            {
                Console.Error.WriteLine($"{file}: not left behind although its removal failed");
                wrong++;
                continue;
            }

            try
            {
                PersistentHeap.Open(file).Dispose();
            }
            catch (HeapFileException e) when (e.Error == HeapFileError.AlreadyOpen)
            {
                Console.Error.WriteLine($"{file}: still locked by the failed creation: {e.Message}");
                wrong++;
            }
            catch (Exception e) when (e is IOException or InvalidDataException)
            {
                Console.WriteLine($"{file}: opened after the failure: {e.GetType().Name}: {e.Message}");
            }

            File.Delete(file);
        }

        return wrong == 0 ? Survived : WrongOutcome;
    }

    private static int OpenSparseOnFullDisk(string path, bool control)
    {
        HeapFileTestHooks.SkipPreallocation = control;
        try
        {
            using PersistentHeap heap = PersistentHeap.Open(path, new HeapFileOptions { Domain = PersistenceDomainKind.MappedFile });
            for (int i = 0; i < 100_000; i++)
            {
                heap.GetPayload(heap.Allocate(4000, 1)).Fill(1);
            }

            Console.Error.WriteLine("opened and wrote the whole heap: the file system was not full");
            return WrongOutcome;
        }
        catch (HeapFileException e) when (e.Error == HeapFileError.InsufficientSpace)
        {
            Console.WriteLine(e.Message);
            return Survived;
        }
        catch (InsufficientMemoryException)
        {
            Console.Error.WriteLine("the heap filled up without touching a hole");
            return WrongOutcome;
        }
    }

    /// <summary>
    /// A sparse copy whose heap part is allocated and whose tail (a grown heap's spare segment, beyond its recorded size)
    /// is a hole, on a full file system, opened with the libpmem domain, which maps the whole file: the open must refuse
    /// it (before the fix it reserved the heap part only, and the growth into the tail ended the process with SIGBUS).
    /// </summary>
    private static int OpenPmemSparseTailOnFullDisk(string path, bool control)
    {
        HeapFileTestHooks.ReserveHeapPartOnlyForTesting = control;
        try
        {
            using (var heap = BufferedDurableHeap.Open(path, new HeapFileOptions { Domain = PersistenceDomainKind.Pmem }, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan }))
            {
                var map = new PersistentByteMap<long>(heap, typeId: 1);
                byte[] value = new byte[3000];
                try
                {
                    for (long k = 0; k < 100_000; k++)
                    {
                        map.Set(k, value);
                    }
                }
                catch (InsufficientMemoryException)
                {
                    // Full: the heap took its tail without touching a hole (no crash).
                }
            }

            Console.Error.WriteLine("opened, filled and closed the heap: its tail was not a hole on a full file system");
            return WrongOutcome;
        }
        catch (HeapFileException e) when (e.Error == HeapFileError.InsufficientSpace)
        {
            Console.WriteLine(e.Message);
            return Survived;
        }
    }

    /// <summary>
    /// libpmem loads but refuses the mapping (simulated): Auto falls back to the mapped-file domain, and Pmem reports
    /// <see cref="HeapFileError.DomainUnavailable"/> naming the heap file (before the fix both threw libpmem's IOException,
    /// naming a /proc/self/fd path).
    /// </summary>
    private static int PmemMapRefused(string path)
    {
        PersistentHeap.Create(path, new HeapFileOptions { Size = 4L << 20, Domain = PersistenceDomainKind.MappedFile }).Dispose();
        HeapFileTestHooks.SimulatedPmemMapFailure = true;
        int wrong = 0;
        try
        {
            using (PersistentHeap heap = PersistentHeap.Open(path, new HeapFileOptions { Domain = PersistenceDomainKind.Auto }))
            {
                Console.WriteLine($"Auto: {heap.File.Domain.Kind}");
                if (heap.File.Domain.Kind != PersistenceDomainKind.MappedFile)
                {
                    wrong++;
                }
            }

            try
            {
                PersistentHeap.Open(path, new HeapFileOptions { Domain = PersistenceDomainKind.Pmem }).Dispose();
                Console.Error.WriteLine("Pmem: opened");
                wrong++;
            }
            catch (HeapFileException e) when (e.Error == HeapFileError.DomainUnavailable && e.Message.Contains(Path.GetFullPath(path), StringComparison.Ordinal)
                && e.Message.Contains("simulated", StringComparison.Ordinal))
            {
                Console.WriteLine($"Pmem: {e.Error}: {e.Message}");
            }
        }
        catch (Exception e)
        {
            Console.Error.WriteLine($"{e.GetType().Name}: {e.Message}");
            wrong++;
        }
        finally
        {
            HeapFileTestHooks.SimulatedPmemMapFailure = false;
        }

        return wrong == 0 ? Survived : WrongOutcome;
    }

    /// <summary>
    /// A buffered heap on a caller-owned file: disposing the file, the allocator or the domain under the running heap
    /// is refused (before the fix the file unmapped under the heap's allocations: SIGSEGV on the next Set), and the
    /// heap then goes on, closes and reopens with every entry.
    /// </summary>
    private static int BufferedFileDisposedFirst(string path)
    {
        HeapFile file = HeapFile.Create(path, new HeapFileOptions { Size = 4L << 20, Domain = PersistenceDomainKind.MappedFile });
        var heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromMilliseconds(5) });
        var map = new PersistentHashMap<long, long>(heap, typeId: 1);
        map.Set(-1, -1);
        int wrong = Refused(file.Dispose, "HeapFile.Dispose") + Refused(heap.Heap.File.Dispose, "Heap.File.Dispose")
            + Refused(heap.Heap.Dispose, "Heap.Dispose") + Refused(file.Domain.Dispose, "Domain.Dispose");
        for (long k = 0; k < 10_000; k++)
        {
            map.Set(k, k);
        }

        heap.Dispose();
        file.Dispose();
        using BufferedDurableHeap reopened = BufferedDurableHeap.Open(path, new HeapFileOptions { Domain = PersistenceDomainKind.MappedFile });
        long count = new PersistentHashMap<long, long>(reopened, typeId: 1).Count;
        if (count != 10_001)
        {
            Console.Error.WriteLine($"reopened with {count} entries, not 10001");
            wrong++;
        }

        return wrong == 0 ? Survived : WrongOutcome;
    }

    /// <summary>
    /// Disposing the persistence domain under a heap file: refused while a heap uses the file (before the fix it
    /// unmapped, and the next root read was a SIGSEGV); with no heap it closes the file first, whose calls then throw
    /// ObjectDisposedException.
    /// </summary>
    private static int DomainDisposedUnderFile(string path)
    {
        int wrong = 0;
        using (PersistentHeap raw = PersistentHeap.Create(path, new HeapFileOptions { Size = 4L << 20, Domain = PersistenceDomainKind.MappedFile }))
        {
            wrong += Refused(raw.File.Domain.Dispose, "raw heap's Domain.Dispose");
            raw.File.SetRoot(0, 42);
            wrong += raw.File.GetRoot(0) == 42 ? 0 : 1;
        }

        // A disposed domain is refused before the first store (Format wrote through the unmapped pointer: SIGSEGV).
        var gone = new SimulatedPersistenceDomain(4L << 20);
        gone.Dispose();
        wrong += Throws<ObjectDisposedException>(() => HeapFile.Create(gone), "HeapFile.Create on a disposed domain");
        wrong += Throws<ObjectDisposedException>(() => HeapFile.Open(gone), "HeapFile.Open on a disposed domain");

        var domain = new SimulatedPersistenceDomain(4L << 20);
        HeapFile file = HeapFile.Create(domain);
        domain.Dispose();
        try
        {
            file.GetRoot(0);
            Console.Error.WriteLine("GetRoot returned after the domain was disposed");
            wrong++;
        }
        catch (ObjectDisposedException)
        {
        }

        return wrong == 0 ? Survived : WrongOutcome;
    }

    /// <summary>0 if <paramref name="call"/> throws <typeparamref name="T"/>, else 1 (and says so).</summary>
    private static int Throws<T>(Action call, string what)
        where T : Exception
    {
        try
        {
            call();
            Console.Error.WriteLine($"{what}: returned");
            return 1;
        }
        catch (T)
        {
            return 0;
        }
    }

    /// <summary>0 if <paramref name="dispose"/> throws InvalidOperationException (refused), else 1 (and says so).</summary>
    private static int Refused(Action dispose, string what) => Throws<InvalidOperationException>(dispose, what + " under a running heap");
}
