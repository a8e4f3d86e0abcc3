using System;
using System.Threading;
using System.Threading.Tasks;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// The background advancer of an idle heap: a period in which no operation is open and nothing was written, replaced,
/// deleted, swept or waited for since the last cycle writes nothing to the file (it used to write back and fence the
/// frontier every period: through the page cache, 100 <c>pwrite</c> and 100 <c>fdatasync</c> calls a second at the
/// default period, for ever). What it must not do is take a heap with work pending for idle: a write made just before
/// a period's look, a <see cref="BufferedDurableHeap.SyncAsync"/> waiting, still become durable without a Sync.
/// </summary>
public sealed class IdleAdvancerTests
{
    private static readonly TimeSpan Period = TimeSpan.FromMilliseconds(2);

    /// <summary>How long a wait for the advancer's periods may take (bounded: a broken control fails here rather than hang).</summary>
    private static readonly TimeSpan Wait = TimeSpan.FromSeconds(10);

    private readonly ITestOutputHelper _output;

    public IdleAdvancerTests(ITestOutputHelper output) => _output = output;

    [Theory]
    [InlineData(DurabilityMode.Buffered)]
    [InlineData(DurabilityMode.Strict)]
    [InlineData(DurabilityMode.Transient)]
    public void AnIdleHeap_WritesNothingToItsFile_AndKeepsItsVersion(DurabilityMode mode)
    {
        string? violation = IdleStretch(mode, DurabilityFaults.None);
        Assert.Null(violation);
    }

    [Theory]
    [InlineData(DurabilityMode.Buffered)]
    [InlineData(DurabilityMode.Transient)]
    public void Control_AnAdvancerThatEndsAVersionEveryPeriod_IsCaught(DurabilityMode mode)
    {
        string? violation = IdleStretch(mode, DurabilityFaults.AdvanceWhenIdle);
        _output.WriteLine($"control: {violation}");
        Assert.NotNull(violation);
    }

    [Fact]
    public void AWriteAfterAnIdleStretch_IsMadeDurableByTheAdvancer()
    {
        string? violation = WriteAfterIdle(DurabilityFaults.None);
        Assert.Null(violation);
    }

    [Fact]
    public void Control_AnAdvancerThatLooksOnlyForOpenOperations_IsCaughtLeavingAWriteUndurable()
    {
        // Up to three runs: a period's look that lands while the one write's operation is open ends its version anyway.
        string? violation = null;
        for (int run = 0; run < 3 && violation is null; run++)
        {
            violation = WriteAfterIdle(DurabilityFaults.IdleWithWorkPending);
        }

        _output.WriteLine($"control: {violation}");
        Assert.NotNull(violation);
    }

    /// <summary>The other work around an idle stretch: each scenario (a method below) holds, and its broken control fails it.</summary>
    [Theory]
    [InlineData(nameof(SyncAsyncWhileIdle))]
    [InlineData(nameof(ReclaimThenIdle))]
    [InlineData(nameof(SweepWhileIdle))]
    [InlineData(nameof(ThreadExitsWhileIdle))]
    [InlineData(nameof(WriteAfterALongIdleStretch))]
    public void AroundAnIdleStretch_NothingIsLeftUndone(string scenario)
    {
        string? violation = Scenario(scenario, DurabilityFaults.None);
        Assert.Null(violation);
    }

    [Theory]
    [InlineData(nameof(SyncAsyncWhileIdle), (long)DurabilityFaults.IdleWithWorkPending)]
    [InlineData(nameof(ReclaimThenIdle), (long)DurabilityFaults.IdleWithWorkPending)]
    [InlineData(nameof(SweepWhileIdle), (long)DurabilityFaults.IdleWithSweepUnmarked)]
    [InlineData(nameof(ThreadExitsWhileIdle), (long)DurabilityFaults.IdleWithExitedThreads)]
    [InlineData(nameof(WriteAfterALongIdleStretch), (long)DurabilityFaults.IdleWithoutRedating)]
    public void Control_AroundAnIdleStretch_IsCaught(string scenario, long faults)
    {
        // Up to three runs: a control's defect can be hidden by a period's look that lands in the wrong moment (after an
        // idle hour, the version the control leaves undated is ended by the advancer if it looks between the first write
        // and the first age check; a CI run once missed it so).
        string? violation = null;
        for (int run = 0; run < 3 && violation is null; run++)
        {
            violation = Scenario(scenario, (DurabilityFaults)faults);
        }

        _output.WriteLine($"control: {violation}");
        Assert.NotNull(violation);
    }

    private static string? Scenario(string name, DurabilityFaults faults) => name switch
    {
        nameof(SyncAsyncWhileIdle) => SyncAsyncWhileIdle(faults),
        nameof(ReclaimThenIdle) => ReclaimThenIdle(faults),
        nameof(SweepWhileIdle) => SweepWhileIdle(faults),
        nameof(ThreadExitsWhileIdle) => ThreadExitsWhileIdle(faults),
        nameof(WriteAfterALongIdleStretch) => WriteAfterALongIdleStretch(faults),
        _ => throw new ArgumentException($"unknown scenario {name}", nameof(name)),
    };

    /// <summary>
    /// Writes, replaces and deletes, syncs, then watches 20 of the advancer's periods: no crash point (write-back or
    /// fence) of the domain, no cycle, no new version, and 20 idle periods counted. A cycle may still run once the
    /// writes are over (reclamation two versions on, a sweep's mark), so up to five stretches are watched. Returns the
    /// last stretch's violation, or null once one stretch was idle throughout.
    /// </summary>
    private string? IdleStretch(DurabilityMode mode, DurabilityFaults faults)
    {
        using var setup = new IdleHeap(faults, mode);
        SimulatedPersistenceDomain domain = setup.Domain;
        BufferedDurableHeap heap = setup.Heap;
        PersistentHashMap<long, long> map = setup.Map;
        for (int i = 0; i < 1000; i++)
        {
            map.Set(i % 100, i);
        }

        map.Remove(7);
        if (mode != DurabilityMode.Transient)
        {
            heap.Sync();
        }

        string? violation = null;
        for (int stretch = 0; stretch < 5; stretch++)
        {
            long points = domain.CrashPointCount;
            AdvancerStatistics before = heap.GetAdvancerStatistics();
            long version = heap.CurrentVersion;
            long periods = heap.BackgroundPeriodsForTesting;
            if (!SpinWait.SpinUntil(() => heap.BackgroundPeriodsForTesting >= periods + 20, Wait))
            {
                return $"the advancer ran {heap.BackgroundPeriodsForTesting - periods} periods in {Wait.TotalSeconds} s";
            }

            AdvancerStatistics idle = heap.GetAdvancerStatistics().Since(before);
            long written = domain.CrashPointCount - points;
            _output.WriteLine($"stretch {stretch}: {written} crash points, {idle}, version {version} → {heap.CurrentVersion}");
            if (written == 0 && idle.Cycles == 0 && heap.CurrentVersion == version && idle.IdlePeriods >= 19)
            {
                return null;
            }

            violation = $"over 20 idle periods: {written} write-backs and fences, {idle.Cycles} cycles, {idle.IdlePeriods} idle periods, version {version} → {heap.CurrentVersion}";
        }

        return violation;
    }

    /// <summary>
    /// Lets the heap go idle, writes one key without a Sync, then waits (bounded) until the advancer has made its version
    /// durable and gone idle again; the durable image must hold the key. Returns the violation, or null.
    /// </summary>
    private string? WriteAfterIdle(DurabilityFaults faults)
    {
        using var setup = new IdleHeap(faults);
        SimulatedPersistenceDomain domain = setup.Domain;
        BufferedDurableHeap heap = setup.Heap;
        PersistentHashMap<long, long> map = setup.Map;
        if (!setup.WriteSyncAndGoIdle())
        {
            return "the heap never went idle";
        }

        long version = heap.CurrentVersion;
        map.Set(2, 20);

        // The write's version: the current one when it began (no transition while idle, so at least the one read before).
        if (!SpinWait.SpinUntil(() => heap.DurableFrontier >= version, Wait))
        {
            return $"the write of version {version} (or later) was not made durable within {Wait.TotalSeconds} s: the durable frontier stayed at {heap.DurableFrontier}";
        }

        // Idle again: every thread's lists drained, so the write's version has been written back, whichever it was.
        if (!WaitForIdlePeriods(heap, 2))
        {
            return "the heap did not go idle again after the write";
        }

        using var image = SimulatedPersistenceDomain.FromImage(domain.GetDurableImage());
        using HeapFile again = HeapFile.Open(image);
        using BufferedDurableHeap recovered = BufferedDurableHeap.Open(again, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
        var map2 = new PersistentHashMap<long, long>(recovered, typeId: 1);
        return map2.TryGetValue(2, out long two) && two == 20 && map2.TryGetValue(1, out long one) && one == 10
            ? null
            : "the durable image does not hold the write made after the idle stretch";
    }

    /// <summary>Lets the heap go idle, then waits (bounded) for a SyncAsync; returns the violation, or null.</summary>
    private static string? SyncAsyncWhileIdle(DurabilityFaults faults)
    {
        using var setup = new IdleHeap(faults);
        BufferedDurableHeap heap = setup.Heap;
        if (!setup.WriteSyncAndGoIdle())
        {
            return "the heap never went idle";
        }

        long version = heap.CurrentVersion;
        Task sync = heap.SyncAsync();
        if (!((IAsyncResult)sync).AsyncWaitHandle.WaitOne(Wait))
        {
            return $"SyncAsync on the idle heap did not complete within {Wait.TotalSeconds} s (durable frontier {heap.DurableFrontier}, version {version})";
        }

        return sync.IsCompletedSuccessfully && heap.DurableFrontier >= version ? null : $"SyncAsync ended {sync.Status} with the durable frontier {heap.DurableFrontier} (version {version})";
    }

    /// <summary>
    /// Replaces a durable payload, then waits (bounded) for the heap to go idle: by then the replaced payload must have
    /// been reclaimed (the retired bytes all freed), not left waiting for the next write.
    /// </summary>
    private static string? ReclaimThenIdle(DurabilityFaults faults)
    {
        using var setup = new IdleHeap(faults);
        BufferedDurableHeap heap = setup.Heap;
        PersistentHashMap<long, long> map = setup.Map;
        map.Set(1, 0);
        heap.Sync();

        // One replace of a payload of an earlier version (retired, not freed at once), in one short operation, which a
        // period's look can hardly land in (the broken control's cycle would then reclaim it after all).
        map.Set(1, 1);
        if (!WaitForIdlePeriods(heap, 3))
        {
            return "the heap never went idle";
        }

        long backlog = heap.ReclaimBacklog;
        return backlog == 0 ? null : $"the heap went idle with {backlog} retired bytes not reclaimed";
    }

    /// <summary>
    /// Replaces 200 keys' payloads (the old ones parked for the sweep), lets the heap go idle, then sweeps the parked
    /// frees from this thread (as the stocker does): the next period must write the sweep log's mark, so the heap is
    /// not idle until it has. Returns the violation, or null.
    /// </summary>
    private static string? SweepWhileIdle(DurabilityFaults faults)
    {
        using var setup = new IdleHeap(faults);
        BufferedDurableHeap heap = setup.Heap;
        PersistentHashMap<long, long> map = setup.Map;
        for (int i = 0; i < 200; i++)
        {
            map.Set(i, i);
        }

        heap.Sync();
        for (int i = 0; i < 200; i++)
        {
            map.Set(i, -i);
        }

        heap.Sync();
        if (!WaitForIdlePeriods(heap, 3))
        {
            return "the heap never went idle";
        }

        long parked = heap.Heap.PendingFreeBytes;
        long swept = heap.Heap.SweepPendingFrees(long.MaxValue);
        Assert.SkipWhen(swept == 0, $"INCONCLUSIVE: nothing was parked for the sweep when the heap went idle (the stocker swept it first); parked {parked} bytes, stock-swept {heap.Heap.StockSweptBlocks}");
        return SpinWait.SpinUntil(() => heap.Heap.SweepLogMarkIsCurrent, Wait)
            ? null
            : $"a sweep of {swept} blocks made while the heap was idle was still not marked after {Wait.TotalSeconds} s";
    }

    /// <summary>
    /// A thread writes, then waits while the heap makes its writes durable, reclaims and goes idle; then it exits. The
    /// heap must forget it (its buffers and allocation cache) without another write. Returns the violation, or null.
    /// </summary>
    private static string? ThreadExitsWhileIdle(DurabilityFaults faults)
    {
        using var setup = new IdleHeap(faults);
        BufferedDurableHeap heap = setup.Heap;
        PersistentHashMap<long, long> map = setup.Map;
        map.Set(0, 0);
        int before = heap.RegisteredThreadsForTesting;
        using var wrote = new ManualResetEventSlim();
        using var exit = new ManualResetEventSlim();
        var thread = new Thread(() =>
        {
            for (int i = 1; i <= 100; i++)
            {
                map.Set(i, i);
            }

            wrote.Set();
            exit.Wait(Wait);
        })
        { IsBackground = true };
        thread.Start();
        Assert.True(wrote.Wait(Wait));
        heap.Sync();
        if (!WaitForIdlePeriods(heap, 3))
        {
            exit.Set();
            return "the heap never went idle";
        }

        int registered = heap.RegisteredThreadsForTesting;
        exit.Set();
        Assert.True(thread.Join(Wait));
        return SpinWait.SpinUntil(() => heap.RegisteredThreadsForTesting < registered, Wait)
            ? null
            : $"a thread that exited while the heap was idle was still registered after {Wait.TotalSeconds} s ({heap.RegisteredThreadsForTesting} threads, {before} before it)";
    }

    /// <summary>
    /// A version age bound of 10 minutes and a test clock: the heap goes idle, the clock jumps an hour, a few idle
    /// periods pass, then a writer runs enough operations for the age check: it must not be held back, since no
    /// operation began in the version before the idle stretch ended. Returns the violation, or null.
    /// </summary>
    private static string? WriteAfterALongIdleStretch(DurabilityFaults faults)
    {
        using var setup = new IdleHeap(faults, maxVersionAge: TimeSpan.FromMinutes(10));
        BufferedDurableHeap heap = setup.Heap;
        PersistentHashMap<long, long> map = setup.Map;
        long jump = 0;
        // Volatile.Read: the jump is made on this thread, the advancer reads the clock too.
        heap.ClockForTesting = () => System.Diagnostics.Stopwatch.GetTimestamp() + Volatile.Read(ref jump);
        map.Set(0, 0);
        heap.Sync();
        if (!WaitForIdlePeriods(heap, 3))
        {
            return "the heap never went idle";
        }

        Volatile.Write(ref jump, 3600 * System.Diagnostics.Stopwatch.Frequency);
        if (!WaitForIdlePeriods(heap, 3))
        {
            return "the heap did not stay idle";
        }

        AdvancerStatistics before = heap.GetAdvancerStatistics();
        for (int i = 0; i < 4 * BufferedDurableHeap.LagCheckInterval; i++)
        {
            map.Set(i % 64, i);
        }

        AdvancerStatistics held = heap.GetAdvancerStatistics().Since(before);
        return held.BackPressureWaits == 0 ? null : $"the first writes after an idle hour were held back {held.BackPressureWaits} times ({held})";
    }

    /// <summary>A heap on a simulated domain with a <see cref="Period"/> advancer and a map of type 1; disposes all three.</summary>
    private sealed class IdleHeap : IDisposable
    {
        internal IdleHeap(DurabilityFaults faults, DurabilityMode mode = DurabilityMode.Buffered, TimeSpan? maxVersionAge = null)
        {
            Domain = new SimulatedPersistenceDomain(8 << 20);
            File = HeapFile.Create(Domain);
            Heap = BufferedDurableHeap.Open(File, new BufferedDurableHeapOptions { AdvancePeriod = Period, Mode = mode, MaxVersionAge = maxVersionAge, Faults = faults });
            Map = new PersistentHashMap<long, long>(Heap, typeId: 1);
        }

        internal SimulatedPersistenceDomain Domain { get; }

        internal HeapFile File { get; }

        internal BufferedDurableHeap Heap { get; }

        internal PersistentHashMap<long, long> Map { get; }

        /// <summary>Writes key 1 (10), syncs, and waits (bounded) for three idle periods; false if they did not come.</summary>
        internal bool WriteSyncAndGoIdle()
        {
            Map.Set(1, 10);
            Heap.Sync();
            return WaitForIdlePeriods(Heap, 3);
        }

        public void Dispose()
        {
            Heap.Dispose();
            File.Dispose();
            Domain.Dispose();
        }
    }

    /// <summary>Waits (bounded) until the advancer has counted <paramref name="count"/> more idle periods.</summary>
    private static bool WaitForIdlePeriods(BufferedDurableHeap heap, int count)
    {
        long idle = heap.GetAdvancerStatistics().IdlePeriods;
        return SpinWait.SpinUntil(() => heap.GetAdvancerStatistics().IdlePeriods >= idle + count, Wait);
    }
}
