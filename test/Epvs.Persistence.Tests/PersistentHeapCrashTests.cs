using System;
using System.Collections.Generic;
using System.Linq;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// Simulated power failures: at every enumerated crash point of a small workload, at random points of a large
/// concurrent one, and over 100 crash/reopen cycles. After each reopen every block is a complete allocation from the
/// history or free, every durably persisted block is there with its payload, and the accounting adds up. Each
/// property has a broken control that the same check must catch.
/// </summary>
public sealed class PersistentHeapCrashTests
{
    private const int SmallWorkloadSeed = 7001;
    private const int SmallWorkloadOperations = 45;
    private const int SeedsPerPoint = 4;
    private readonly ITestOutputHelper _output;

    public PersistentHeapCrashTests(ITestOutputHelper output) => _output = output;

    [Fact]
    public void Crash_AtEveryEnumeratedPoint_RecoversOnlyValidBlocksAndKeepsPersistedOnes()
    {
        List<string> violations = EnumerateCrashes(HeapFaults.None, HeapFaults.None, out int images);
        _output.WriteLine($"seed={SmallWorkloadSeed}: {images} crash images checked");
        Assert.True(images > 100, $"only {images} crash images");
        Assert.Empty(violations);
    }

    [Fact]
    public void Crash_AllocatorSkippingTheUidStore_IsCaughtByTheCrashCheck()
    {
        List<string> violations = EnumerateCrashes(HeapFaults.SkipUidStore, HeapFaults.None, out _);
        _output.WriteLine($"control caught {violations.Count} violations, e.g. {violations.FirstOrDefault()}");
        Assert.NotEmpty(violations);
    }

    [Fact]
    public void Crash_RecoveryTrustingTheCommitWordAlone_IsCaughtByTheCrashCheck()
    {
        List<string> violations = EnumerateCrashes(HeapFaults.None, HeapFaults.AcceptTornHeaders, out _);
        _output.WriteLine($"control caught {violations.Count} violations, e.g. {violations.FirstOrDefault()}");
        Assert.Contains(violations, v => v.Contains("phantom") || v.Contains("differs"));
    }

    [Fact]
    public void Crash_RecoveryLeakingInvalidBlocks_IsCaughtByTheAccountingCheck()
    {
        List<string> violations = EnumerateCrashes(HeapFaults.None, HeapFaults.LoseInvalidBlocksAtRecovery, out _);
        _output.WriteLine($"control caught {violations.Count} violations, e.g. {violations.FirstOrDefault()}");
        Assert.Contains(violations, v => v.Contains("accounting does not add up"));
    }

    [Fact]
    public void CrashCheck_FedACorruptedImage_ReportsTheCorruption()
    {
        using var domain = new SimulatedPersistenceDomain(1 << 20, capacity: 2 << 20);
        var history = new CrashHistory();
        using (HeapFile file = HeapFile.Create(domain))
        using (var heap = new PersistentHeap(file))
        {
            CrashWorkload.Run(heap, domain, history, SmallWorkloadSeed, SmallWorkloadOperations, new List<BlockRecord>());
        }

        long end = domain.CrashPointCount;
        byte[] image = domain.Crash(seed: 1);
        Assert.Empty(Check(image, end, history, HeapFaults.None));

        BlockRecord durable = history.Records.First(r => r.AllocEnd <= end && r.FreeStart == long.MaxValue && r.Size > 8);
        byte[] payloadFlipped = (byte[])image.Clone();
        payloadFlipped[durable.Offset + 32 + (durable.Size / 2)] ^= 0x40;
        Assert.Contains(Check(payloadFlipped, end, history, HeapFaults.None), v => v.Contains("payload differs"));

        // A zeroed commit word is damage the heap reports itself (format 4: no zero word stands for "unused").
        byte[] commitZeroed = (byte[])image.Clone();
        Array.Clear(commitZeroed, (int)durable.Offset + 24, 8);
        Assert.Contains(Check(commitZeroed, end, history, HeapFaults.None), v => v.Contains("reported damage") && v.Contains($"0x{durable.Offset:X}"));
    }

    [Fact]
    public void Crash_AtRandomPointsOfALargeConcurrentWorkload_RecoversOnlyValidBlocks()
    {
        Assert.Empty(CrashAtRandomPoints(seed: 8002, threads: 2, operations: 3000, crashes: 60, tinyPayloads: false, HeapFaults.None));
    }

    /// <summary>
    /// Format 9's 48-byte blocks (payloads of 0 to 16 bytes) through more than a segment of them, so that the last
    /// block of a segment (at 65,472, before the 16-byte tail) is used, with the control that takes torn headers for
    /// whole (found first by a review of the change, in its own clone).
    /// </summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void Crash_AtRandomPointsOfA48ByteBlockWorkload_RecoversOnlyValidBlocks(bool control)
    {
        List<string> violations = CrashAtRandomPoints(seed: 4848, threads: 1, operations: 5000, crashes: 120, tinyPayloads: true, control ? HeapFaults.AcceptTornHeaders : HeapFaults.None);
        if (control)
        {
            Assert.SkipWhen(violations.Count == 0, "INCONCLUSIVE: the broken control (torn headers taken for whole) was not caught; the check proves nothing on this run.");
        }
        else
        {
            Assert.Empty(violations);
        }
    }

    private List<string> CrashAtRandomPoints(int seed, int threads, int operations, int crashes, bool tinyPayloads, HeapFaults recoveryFaults)
    {
        _output.WriteLine($"seed={seed} threads={threads} operations/thread={operations} crashes={crashes} tiny={tinyPayloads} faults={recoveryFaults}");

        // Crash points are drawn after the heap's creation. A first run measures how many crash points the workload has (it varies a little with the interleaving).
        long estimate = RunConcurrent(seed, threads, operations, new CrashHistory(), _ => { }, out _, tinyPayloads, out _);
        var random = new Random(seed);
        var history = new CrashHistory();
        long end = RunConcurrent(seed, threads, operations, history, domain => domain.ArmBelowEstimate(random, crashes, estimate), out List<SimulatedCrash> captured, tinyPayloads, out long dataStart);

        Assert.True(captured.Count >= crashes / 2, $"{captured.Count} of {crashes} points were reached (end {end}, estimate {estimate})");
        if (tinyPayloads)
        {
            // The last block of a segment of 48-byte blocks was used.
            Assert.Contains(history.Records, r => (r.Offset - dataStart) % HeapLayout.SegmentSize == (SizeClasses.BlocksPerSegment[0] - 1) * SizeClasses.BlockSizes[0]);
        }

        var violations = new List<string>();
        foreach (SimulatedCrash crash in captured)
        {
            violations.AddRange(Check(crash.Image, crash.Point, history, recoveryFaults).Select(v => $"point {crash.Point} seed {crash.Seed}: {v}"));
        }

        _output.WriteLine($"{captured.Count} images, {violations.Count} violations, e.g. {violations.FirstOrDefault()}");
        return violations;
    }

    [Fact]
    public void Crash_HundredCrashReopenCycles_DoNotLeak()
    {
        const int seed = 9003, cycles = 100, operations = 40;
        _output.WriteLine($"seed={seed} cycles={cycles} operations/cycle={operations}");
        var random = new Random(seed);
        var domain = new SimulatedPersistenceDomain(1 << 20);
        HeapFile file = HeapFile.Create(domain);
        var heap = new PersistentHeap(file);
        var history = new CrashHistory();
        var owned = new List<BlockRecord>();
        try
        {
            for (int cycle = 0; cycle < cycles; cycle++)
            {
                long crashPoint = domain.CrashPointCount + random.Next(1, 120);
                int crashSeed = random.Next();
                domain.ArmCrash(crashPoint, crashSeed);
                CrashWorkload.Run(heap, domain, history, seed + cycle, operations, owned);
                SimulatedCrash crash = domain.CapturedCrashes.FirstOrDefault() ?? new SimulatedCrash(domain.CrashPointCount, crashSeed, domain.Crash(crashSeed));

                heap.Dispose();
                file.Dispose();
                domain.Dispose();
                domain = SimulatedPersistenceDomain.FromImage(crash.Image);
                file = HeapFile.Open(domain);
                heap = new PersistentHeap(file);

                List<string> violations = history.Check(crash.Point, heap);
                Assert.True(violations.Count == 0, $"cycle {cycle} (point {crash.Point}, seed {crash.Seed}): {string.Join("; ", violations)}");
                history = history.CarryOver(crash.Point, heap);
                owned = history.Records.ToList();
            }

            // Free everything durably; then the heap must be entirely free and hold exactly as many blocks as a new one.
            foreach (BlockRecord record in owned)
            {
                heap.Free(new PayloadRef(record.Offset));
            }

            heap.Dispose();
            file.Dispose();
            using var last = SimulatedPersistenceDomain.FromImage(domain.GetDurableImage());
            using HeapFile lastFile = HeapFile.Open(last);
            using var emptied = new PersistentHeap(lastFile);
            HeapStatistics stats = emptied.RecoveryStatistics;
            Assert.Equal(0, stats.LiveBlocks);
            Assert.Equal(stats.TotalBytes, stats.FreeBytes);
            int blocks = 0;
            while (emptied.TryAllocate(1000, 1, out _))
            {
                blocks++;
            }

            Assert.Equal(lastFile.SegmentCount * (65536 / 1280), blocks);
        }
        finally
        {
            heap.Dispose();
            file.Dispose();
            domain.Dispose();
        }
    }

    [Fact]
    public void Recovery_ATornAllocation_IsDurablyFreeBeforeTheHeapOpens()
    {
        // Independent of any workload's allocation order (the crash test of issue 10's torn-header fix rests on one
        // seed's): a torn header is made by hand and the file is read after the open.
        Assert.Null(TornAllocationAfterRecovery(HeapFaults.None));
    }

    [Fact]
    public void Recovery_LeavingATornAllocationAsItIs_IsCaught()
    {
        string? violation = TornAllocationAfterRecovery(HeapFaults.LeaveTornHeaders);
        _output.WriteLine($"control: {violation}");
        Assert.True(violation is not null, "INCONCLUSIVE: the broken control (torn headers left as they are) was not caught; the check proves nothing on this run.");
    }

    /// <summary>
    /// A block whose allocated commit word is durable but whose uid word is not (as a crash between the header's
    /// stores leaves it), then a recovery: returns what is wrong with the block on the file after the open (it must be
    /// free, written back and fenced: the durable image), or null.
    /// </summary>
    private static string? TornAllocationAfterRecovery(HeapFaults recoveryFaults)
    {
        using var domain = new SimulatedPersistenceDomain(1 << 20);
        long offset;
        byte[] image;
        using (HeapFile file = HeapFile.Create(domain))
        using (var heap = new PersistentHeap(file))
        {
            PayloadRef block = heap.Allocate(24, typeId: 5, epochTag: 3, uid: 77);
            heap.Persist(block);
            offset = block.Offset;

            // A crash now: the allocation is durable and complete.
            image = domain.GetDurableImage();
        }

        Assert.Equal(77UL, BitConverter.ToUInt64(image, (int)offset));
        ulong commit = BitConverter.ToUInt64(image, (int)offset + 24);
        Assert.Equal(HeapLayout.StateAllocated, HeapLayout.CommitState(commit));

        // The uid store did not reach the medium (the formatted segment's zero), the commit store did.
        BitConverter.TryWriteBytes(image.AsSpan((int)offset), 0UL);
        using var crashed = SimulatedPersistenceDomain.FromImage(image);
        using HeapFile reopened = HeapFile.Open(crashed);
        using var recovered = new PersistentHeap(reopened, new PersistentHeapOptions { Faults = recoveryFaults });
        if (recovered.RecoveryStatistics.LiveBlocks != 0)
        {
            return $"recovery kept {recovered.RecoveryStatistics.LiveBlocks} blocks live; the torn allocation is not one";
        }

        ulong after = BitConverter.ToUInt64(crashed.GetDurableImage(), (int)offset + 24);
        return HeapLayout.CommitState(after) == HeapLayout.StateFree
            ? null
            : $"after the open, the torn allocation's commit word on the file is 0x{after:X16} (state {HeapLayout.CommitState(after)}), not free: a later allocation of uid 77 at 0x{offset:X} could complete the old header";
    }

    private static List<string> EnumerateCrashes(HeapFaults allocatorFaults, HeapFaults recoveryFaults, out int images)
    {
        // Run 1 counts the crash points; run 2 (identical: single-threaded and seeded) captures an image at each.
        // Points before the workload belong to creating the heap, which HeapFileTests covers.
        long points, created;
        using (var counting = new SimulatedPersistenceDomain(1 << 20, capacity: 2 << 20))
        {
            created = RunSmall(counting, new CrashHistory(), allocatorFaults);
            points = counting.CrashPointCount;
        }

        using var domain = new SimulatedPersistenceDomain(1 << 20, capacity: 2 << 20);
        for (long point = created; point < points; point++)
        {
            for (int s = 0; s < SeedsPerPoint; s++)
            {
                domain.ArmCrash(point, (int)(point * 31) + s);
            }
        }

        var history = new CrashHistory();
        RunSmall(domain, history, allocatorFaults);
        var crashes = domain.CapturedCrashes.ToList();
        crashes.Add(new SimulatedCrash(points, 1, domain.Crash(1)));
        var violations = new List<string>();
        foreach (SimulatedCrash crash in crashes)
        {
            violations.AddRange(Check(crash.Image, crash.Point, history, recoveryFaults).Select(v => $"point {crash.Point} seed {crash.Seed}: {v}"));
        }

        images = crashes.Count;
        return violations;
    }

    /// <returns>The crash-point count once the heap was created, before the workload.</returns>
    private static long RunSmall(SimulatedPersistenceDomain domain, CrashHistory history, HeapFaults faults)
    {
        using HeapFile file = HeapFile.Create(domain);
        using var heap = new PersistentHeap(file, new PersistentHeapOptions { Faults = faults });
        long created = domain.CrashPointCount;
        CrashWorkload.Run(heap, domain, history, SmallWorkloadSeed, SmallWorkloadOperations, new List<BlockRecord>());
        return created;
    }

    private static long RunConcurrent(int seed, int threads, int operations, CrashHistory history, Action<SimulatedPersistenceDomain> arm, out List<SimulatedCrash> captured, bool tinyPayloads, out long dataStart)
    {
        using var domain = new SimulatedPersistenceDomain(8 << 20);
        using HeapFile file = HeapFile.Create(domain);
        dataStart = file.DataStart;
        using var heap = new PersistentHeap(file);
        arm(domain);
        Workers.Run(threads, thread => CrashWorkload.Run(heap, domain, history, seed + thread, operations, new List<BlockRecord>(), tinyPayloads));
        captured = domain.CapturedCrashes.ToList();
        return domain.CrashPointCount;
    }

    private static List<string> Check(byte[] image, long point, CrashHistory history, HeapFaults recoveryFaults)
    {
        using var domain = SimulatedPersistenceDomain.FromImage(image);
        HeapFile file;
        try
        {
            file = HeapFile.Open(domain);
        }
        catch (HeapFileException e)
        {
            return [$"the heap did not reopen: {e.Message}"];
        }

        using (file)
        {
            PersistentHeap heap;
            try
            {
                heap = new PersistentHeap(file, new PersistentHeapOptions { Faults = recoveryFaults, RecoveryParallelism = 2 });
            }
            catch (HeapFileException e) when (e.Error == HeapFileError.Corrupt)
            {
                return [$"recovery reported damage: {e.Message}"];
            }

            using (heap)
            {
                return history.Check(point, heap);
            }
        }
    }
}
