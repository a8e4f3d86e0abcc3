using System;
using System.Collections.Generic;
using System.Globalization;
using System.Linq;
using System.Threading;
using System.Threading.Tasks;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>Functional behaviour of the epoch-persistence layer and its structures (no crashes).</summary>
public sealed class BufferedDurableHeapTests
{
    private static readonly BufferedDurableHeapOptions Manual = new() { AdvancePeriod = Timeout.InfiniteTimeSpan };
    private readonly ITestOutputHelper _output;

    public BufferedDurableHeapTests(ITestOutputHelper output) => _output = output;

    [Fact]
    public void Allocate_ThroughACopyOfAnEndedOperation_ThrowsInsteadOfWritingOutsideAnOperation()
    {
        // Allocation skips the heap file's own epoch (the operation's region is what Dispose waits for), so a copy of
        // the ref struct that outlived its Dispose must not allocate: after the heap's Dispose it would write into an
        // unmapped file. (Checked before the heap is disposed, so a regression fails here instead of crashing.)
        using var dir = new TempDirectory();
        using BufferedDurableHeap heap = BufferedDurableHeap.Create(dir.File("copy.heap"), new HeapFileOptions { Size = 1L << 20, Domain = PersistenceDomainKind.MappedFile }, Manual);
        DurableOperation op = heap.BeginOperation();
        DurableOperation copy = op;
        PayloadRef first = copy.Allocate(16, typeId: 3);
        op.Dispose();
        string? refused = null;
        try
        {
            copy.Allocate(16, typeId: 3);
        }
        catch (InvalidOperationException e)
        {
            refused = e.Message;
        }

        Assert.NotNull(refused);
        Assert.Contains("ended", refused, StringComparison.Ordinal);
        Assert.NotEqual(0, first.Offset);
    }

    /// <summary>
    /// A user payload's type id must stay below 2^24: the ids above carry the library's structure kinds, whose recovery
    /// would take a payload of the right size for one of theirs. Allocate accepted any id, negative ones too (found by the
    /// API round of session 16); it now refuses them, allocating nothing, while the structures still allocate theirs.
    /// </summary>
    [Theory]
    [InlineData(-1)]
    [InlineData(1 << 24)]
    [InlineData(int.MaxValue)]
    public void Allocate_ATypeIdOutsideTheUsersRange_IsRefused(int typeId)
    {
        using var dir = new TempDirectory();
        using BufferedDurableHeap heap = BufferedDurableHeap.Create(dir.File("ids.heap"), new HeapFileOptions { Size = 1L << 20, Domain = PersistenceDomainKind.MappedFile }, Manual);
        long live = heap.Heap.GetStatistics().LiveBlocks;
        using (DurableOperation op = heap.BeginOperation())
        {
            ArgumentOutOfRangeException? refused = null;
            try
            {
                op.Allocate(16, typeId);
            }
            catch (ArgumentOutOfRangeException e)
            {
                refused = e;
            }

            Assert.Equal("typeId", refused?.ParamName);
            Assert.Equal(live, heap.Heap.GetStatistics().LiveBlocks);
            Assert.NotEqual(0, op.Allocate(16, (1 << 24) - 1).Offset);
        }

        var map = new PersistentHashMap<long, long>(heap, typeId: 1);
        Assert.True(map.Set(1, 2));
        heap.Sync();
    }

    /// <summary>A uid drawn after Dispose names the heap (it named the per-thread cache the heap had disposed).</summary>
    [Fact]
    public void NewUid_AfterDispose_NamesTheHeap()
    {
        using var dir = new TempDirectory();
        PersistentHeap heap = PersistentHeap.Create(dir.File("uid.heap"), new HeapFileOptions { Size = 1L << 20, Domain = PersistenceDomainKind.MappedFile });
        Assert.True(heap.NewUid() > 0);
        heap.Dispose();
        var e = Assert.Throws<ObjectDisposedException>(() => heap.NewUid());
        Assert.Contains(nameof(PersistentHeap), e.ObjectName, StringComparison.Ordinal);
    }

    [Fact]
    public void OpenTransient_AFileHoldingDurableData_IsRefusedAndLeavesItsBlocksUnchanged()
    {
        using var dir = new TempDirectory();
        string path = dir.File("durable.heap");
        var fileOptions = new HeapFileOptions { Size = 1L << 20, Domain = PersistenceDomainKind.MappedFile };
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, fileOptions, Manual))
        {
            new PersistentHashMap<long, long>(heap, typeId: 1).Set(1, 2);
        }

        byte[] before = System.IO.File.ReadAllBytes(path);
        var transient = new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, Mode = DurabilityMode.Transient };
        InvalidOperationException refused = Assert.Throws<InvalidOperationException>(() => BufferedDurableHeap.Open(path, fileOptions, transient).Dispose());
        Assert.Contains("Transient", refused.Message, StringComparison.Ordinal);
        byte[] after = System.IO.File.ReadAllBytes(path);
        Assert.True(before.AsSpan(HeapLayout.SuperblockSize).SequenceEqual(after.AsSpan(HeapLayout.SuperblockSize)), "the refused open changed the file past the superblock");

        // Still intact for a durable open, which is still a fast reopen (the refusal kept the clean-shutdown mark: a
        // soak probe found it lost); a file only ever used transiently reopens transiently (empty).
        using (BufferedDurableHeap heap = BufferedDurableHeap.Open(path, fileOptions, Manual))
        {
            Assert.True(heap.Recovery.FastReopen, $"not a fast reopen after the refused one: {heap.Recovery.FastReopenRejection}");
            Assert.True(new PersistentHashMap<long, long>(heap, typeId: 1).TryGetValue(1, out long v) && v == 2);
        }

        string scratch = dir.File("scratch.heap");
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(scratch, fileOptions, transient))
        {
            new PersistentHashMap<long, long>(heap, typeId: 1).Set(1, 2);
        }

        using (BufferedDurableHeap heap = BufferedDurableHeap.Open(scratch, fileOptions, transient))
        {
            Assert.Equal(0, new PersistentHashMap<long, long>(heap, typeId: 1).Count);
        }
    }

    /// <summary>
    /// Review: the refusal of <see cref="DurabilityMode.Transient"/> keeps a cleanly closed file's mark (above), and must
    /// not give one to a crashed file: its first version marked every refused file clean on the way out.
    /// </summary>
    [Fact]
    public void OpenTransient_ACrashedFileHoldingDurableData_IsRefusedAndStillReadsAsCrashed()
    {
        using var dir = new TempDirectory();
        string path = dir.File("live.heap");
        string crashed = dir.File("crashed.heap");
        var fileOptions = new HeapFileOptions { Size = 1L << 20, Domain = PersistenceDomainKind.MappedFile };
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, fileOptions, Manual))
        {
            new PersistentHashMap<long, long>(heap, typeId: 1).Set(1, 2);
            heap.Sync();

            // The image of a crash now: the open cleared the clean-shutdown word (cp: the runtime's copy honours the lock).
            Assert.True(HeapSafetyTests.Run("cp", path, crashed), "cp");
        }

        var transient = new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, Mode = DurabilityMode.Transient };
        Assert.Throws<InvalidOperationException>(() => BufferedDurableHeap.Open(crashed, fileOptions, transient).Dispose());
        using (BufferedDurableHeap heap = BufferedDurableHeap.Open(crashed, fileOptions, Manual))
        {
            Assert.False(heap.Recovery.WasCleanShutdown, "a crashed file reads as cleanly shut down after a refused transient open");
            Assert.True(new PersistentHashMap<long, long>(heap, typeId: 1).TryGetValue(1, out long v) && v == 2);
        }
    }

    [Fact]
    public void AdvanceVersion_AfterACycleFailedPastItsTransition_RefusesInsteadOfMovingTheFrontierOverIt()
    {
        using var dir = new TempDirectory();
        BufferedDurableHeap heap = HeapWithReplacedKeys(dir.File("fault.heap"), keys: 8);

        // A failure inside the cycle after its transition (the hook runs in reclamation: a stand-in for a failed
        // write-back) must stop every later cycle, whoever runs it.
        heap.AfterReclaimMarkedForTesting = () => throw new System.IO.IOException("simulated write-back failure");
        Exception? first = Record.Exception(() =>
        {
            for (int i = 0; i < 3; i++)
            {
                heap.AdvanceVersion(TimeSpan.FromSeconds(30));
            }
        });
        Assert.IsType<System.IO.IOException>(first);
        heap.AfterReclaimMarkedForTesting = null;
        long frontier = heap.DurableFrontier;
        InvalidOperationException refused = Assert.Throws<InvalidOperationException>(() => heap.AdvanceVersion(TimeSpan.FromSeconds(30)));
        Assert.Contains("simulated write-back failure", refused.Message, StringComparison.Ordinal);
        Assert.Throws<InvalidOperationException>(() => heap.Sync());
        Assert.Equal(frontier, heap.DurableFrontier);
        AssertDisposeReportsTheLoss(heap, dir.File("fault.heap"), cycleFailed: true);
        Assert.Equal(frontier, heap.DurableFrontier);
    }

    /// <summary>
    /// A fault inside the transition's critical section (the clock's persist failing, say) is the advancer's fault like
    /// any other: once it happened the heap cannot tell what of the section reached the file, so every later Sync,
    /// SyncAsync, AdvanceVersion and BeginOperation reports it and the frontier never moves again. It used to be thrown
    /// once from the Sync that ran the cycle and then forgotten: the next cycle ran as if nothing had happened (safe only
    /// because the real domains fail-stop), and a helping thread's cycle swallowed it. The control (that old behaviour)
    /// lets the second Sync return.
    /// </summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public async Task Sync_AfterAFaultInTheTransitionsCriticalSection_ReportsItFromThenOnAndNeverMovesTheFrontier(bool control)
    {
        using var dir = new TempDirectory();
        string path = dir.File("section.heap");
        var options = new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, Faults = control ? DurabilityFaults.ForgetTransitionFaults : DurabilityFaults.None };
        BufferedDurableHeap heap = BufferedDurableHeap.Create(path, new HeapFileOptions { Size = 1L << 20, Domain = PersistenceDomainKind.MappedFile }, options);
        var map = new PersistentHashMap<long, long>(heap, typeId: 1);
        map.Set(1, 10);
        heap.Sync();
        long frontier = heap.DurableFrontier;
        map.Set(2, 20);

        // A transient fault: one throw, then the section would succeed again.
        int sections = 0;
        heap.InsideCriticalSectionForTesting = () =>
        {
            if (sections++ == 0)
            {
                throw new System.IO.IOException("simulated failure in the critical section");
            }
        };
        Exception? first = Record.Exception(() => heap.Sync());
        Assert.NotNull(first);
        Assert.Contains("simulated failure in the critical section", first.ToString(), StringComparison.Ordinal);
        if (control)
        {
            Assert.Null(Record.Exception(() => heap.Sync()));
            heap.Dispose();
            return;
        }

        InvalidOperationException sync = Assert.Throws<InvalidOperationException>(() => heap.Sync());
        Assert.Contains("simulated failure in the critical section", sync.Message, StringComparison.Ordinal);
        Assert.Throws<InvalidOperationException>(() => heap.AdvanceVersion(TimeSpan.FromSeconds(30)));
        InvalidOperationException asyncSync = await Assert.ThrowsAsync<InvalidOperationException>(() => heap.SyncAsync());
        Assert.Contains("simulated failure in the critical section", asyncSync.Message, StringComparison.Ordinal);
        Assert.Equal(1, sections);
        Assert.Equal(frontier, heap.DurableFrontier);
        AssertDisposeReportsTheLoss(heap, path, cycleFailed: true);
        Assert.Equal(frontier, heap.DurableFrontier);
    }

    /// <summary>
    /// After a failed cycle, no operation begins (it could never become durable); Dispose says what was not made durable
    /// instead of returning normally, and the file carries no clean-shutdown mark; a reopen recovers the frontier.
    /// </summary>
    private static void AssertDisposeReportsTheLoss(BufferedDurableHeap heap, string path, bool cycleFailed)
    {
        if (cycleFailed)
        {
            InvalidOperationException refused = Assert.Throws<InvalidOperationException>(() => heap.BeginOperation());
            Assert.Contains("advance cycle failed", refused.Message, StringComparison.Ordinal);
        }

        InvalidOperationException disposal = Assert.Throws<InvalidOperationException>(heap.Dispose);
        Assert.Contains("not made durable", disposal.Message, StringComparison.Ordinal);
        using BufferedDurableHeap reopened = BufferedDurableHeap.Open(path, new HeapFileOptions { Domain = PersistenceDomainKind.MappedFile }, Manual);
        Assert.False(reopened.Recovery.WasCleanShutdown);
        Assert.Equal(heap.DurableFrontier, reopened.Recovery.RecoveredVersion);
    }

    [Fact]
    public void Map_SetGetRemoveThenReopen_KeepsTheSyncedState()
    {
        using var dir = new TempDirectory();
        string path = dir.File("map.heap");
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, new HeapFileOptions { Size = 4L << 20, Domain = PersistenceDomainKind.MappedFile }))
        {
            var map = new PersistentHashMap<long, Guid>(heap, typeId: 1);
            var bytes = new PersistentByteMap<int>(heap, typeId: 2);
            for (int i = 0; i < 100; i++)
            {
                Assert.True(map.Set(i, new Guid(i, 0, 0, new byte[8])));
                bytes.Set(i, new byte[i]);
            }

            Assert.False(map.Set(5, Guid.Empty));
            Assert.True(map.Remove(6));
            Assert.False(map.Remove(6));
            Assert.True(map.TryGetValue(5, out Guid five) && five == Guid.Empty);
            Assert.Equal(99, map.Count);
            heap.Sync();
            Assert.True(heap.DurableFrontier >= 1);
        }

        using (BufferedDurableHeap heap = BufferedDurableHeap.Open(path, new HeapFileOptions { Domain = PersistenceDomainKind.MappedFile }))
        {
            _output.WriteLine(heap.Recovery.ToString());
            var map = new PersistentHashMap<long, Guid>(heap, typeId: 1);
            var bytes = new PersistentByteMap<int>(heap, typeId: 2);
            Assert.True(heap.Recovery.WasCleanShutdown);
            Assert.Equal(99, map.Count);
            Assert.False(map.TryGetValue(6, out _));
            Assert.True(map.TryGetValue(5, out Guid five) && five == Guid.Empty);
            Assert.True(map.TryGetValue(7, out Guid seven) && seven == new Guid(7, 0, 0, new byte[8]));
            Assert.Equal(37, bytes.Get(37)!.Length);
            Assert.Equal(100, bytes.Count);
            Assert.Throws<InvalidOperationException>(() => new PersistentByteMap<int>(heap, typeId: 2));
        }
    }

    [Fact]
    public void Replace_PayloadOfAnOlderVersion_CopiesWithTheSameUid()
    {
        using var domain = new SimulatedPersistenceDomain(1 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, Manual);
        PayloadRef first;
        using (DurableOperation op = heap.BeginOperation())
        {
            first = op.Allocate(16, typeId: 3);
            Assert.Equal(first, op.Replace(first, 16));
        }

        heap.AdvanceVersion(TimeSpan.FromSeconds(10));
        using (DurableOperation op = heap.BeginOperation())
        {
            PayloadRef copy = op.Replace(first, 16);
            Assert.NotEqual(first, copy);
            PayloadHeader a = heap.Heap.GetHeader(first), b = heap.Heap.GetHeader(copy);
            Assert.Equal(a.Uid, b.Uid);
            Assert.Equal(PayloadKind.Update, b.Kind);
            Assert.Equal(op.Version, b.EpochTag);
            Assert.True(a.EpochTag < b.EpochTag);
        }
    }

    [Fact]
    public void DeferredFrees_ASweepThatFailsAfterTakingItsBlocks_StopsEveryLaterSweep()
    {
        // A sweep that fails after it took blocks off the pending lists (a write-back error) leaves them marked free in
        // memory with frees that may not be durable: a later anti-payload free could then bring a deleted key back
        // after a crash. Every later sweep, and so every later anti-payload free, must refuse.
        using var dir = new TempDirectory();
        BufferedDurableHeap heap = HeapWithReplacedKeys(dir.File("sweep.heap"), keys: 64);

        heap.Heap.AfterSweepMarkedForTesting = () => throw new System.IO.IOException("simulated write-back failure");
        Exception? first = Record.Exception(() =>
        {
            for (int i = 0; i < 3; i++)
            {
                heap.AdvanceVersion(TimeSpan.FromSeconds(10));
            }

            heap.Heap.FlushPendingFrees();
        });
        Assert.IsType<System.IO.IOException>(first);
        Assert.Contains("simulated write-back failure", first.Message, StringComparison.Ordinal);
        heap.Heap.AfterSweepMarkedForTesting = null;
        System.IO.IOException later = Assert.Throws<System.IO.IOException>(() => heap.Heap.FlushPendingFrees());
        Assert.Contains("earlier sweep", later.Message, StringComparison.Ordinal);
        // (The failed sweep was this thread's own call, not a cycle's: operations still begin until a cycle fails.)
        AssertDisposeReportsTheLoss(heap, dir.File("sweep.heap"), cycleFailed: false);
    }

    [Fact]
    public void DeferredFrees_UpdatingEveryKeyEachVersion_ReuseTheHeapInsteadOfGrowingIt()
    {
        // 5,000 live entries (about 230 KiB of 48-byte blocks, a quarter of a 1 MiB file that may grow to 16 MiB). Versions
        // that replace 100 entries alternate with versions that replace all of them, so the advancer's sweep (sized by
        // the last version) leaves the pools short while the replaced blocks wait for the sweep. Allocation must reuse
        // them (sweeping itself when nothing is ready and no segment is free) before it grows the file.
        using var dir = new TempDirectory();
        using BufferedDurableHeap heap = BufferedDurableHeap.Create(dir.File("grow.heap"), new HeapFileOptions { Size = 1L << 20, Domain = PersistenceDomainKind.MappedFile }, Manual);
        var map = new PersistentHashMap<long, long>(heap, typeId: 1);
        long segments = heap.Heap.File.SegmentCount;
        for (int round = 0; round < 100; round++)
        {
            for (long k = 0; k < (round % 2 == 0 ? 100 : 5_000); k++)
            {
                map.Set(k, round);
            }

            heap.AdvanceVersion(TimeSpan.FromSeconds(10));
        }

        Assert.Equal(segments, heap.Heap.File.SegmentCount);
        Assert.All(Enumerable.Range(0, 5_000), k => Assert.True(map.TryGetValue(k, out long v) && v == 99));
        HeapStatistics stats = heap.Heap.GetStatistics();
        _output.WriteLine(stats.ToString());
        Assert.True(stats.AddsUp);
    }

    [Fact]
    public void AdvancerStatistics_CountEachCycleAndTheBlocksItWroteBack()
    {
        using var domain = new SimulatedPersistenceDomain(1 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, Manual);
        var map = new PersistentHashMap<long, long>(heap, typeId: 1);
        AdvancerStatistics start = heap.GetAdvancerStatistics();
        for (long k = 0; k < 100; k++)
        {
            map.Set(k, k);
        }

        heap.AdvanceVersion(TimeSpan.FromSeconds(10));
        AdvancerStatistics first = heap.GetAdvancerStatistics().Since(start);
        Assert.Equal((1L, 100L), (first.Cycles, first.BlocksWrittenBack));

        // Ten keys updated (copies of version-1 payloads), then an empty version.
        for (long k = 0; k < 10; k++)
        {
            map.Set(k, -k);
        }

        heap.AdvanceVersion(TimeSpan.FromSeconds(10));
        heap.AdvanceVersion(TimeSpan.FromSeconds(10));
        AdvancerStatistics all = heap.GetAdvancerStatistics().Since(start);
        Assert.Equal((3L, 110L), (all.Cycles, all.BlocksWrittenBack));
        Assert.True(all.WriteBackTime > TimeSpan.Zero && all.SealTime > TimeSpan.Zero && all.ReclaimTime > TimeSpan.Zero, all.ToString());
        Assert.True(all.WriteBackTime >= first.WriteBackTime && all.SealTime >= first.SealTime, $"{first} then {all}");

        // The fences are part of the write-back (each cycle fences its version and its frontier); nothing held the
        // writer back (no age bound without a background advancer, and no backlog).
        Assert.True(all.FenceTime > TimeSpan.Zero && all.FenceTime <= all.WriteBackTime, all.ToString());
        Assert.Equal((0L, TimeSpan.Zero), (all.BackPressureWaits, all.BackPressureTime));
    }

    /// <summary>
    /// In both durable modes the fences counted are the write-back's, inside its time: in Strict the seals' fence is
    /// the seal time's (a review found it counted in both, and the fence of payloads carried into the cycle in neither).
    /// </summary>
    [Theory]
    [InlineData(DurabilityMode.Buffered)]
    [InlineData(DurabilityMode.Strict)]
    public void AdvancerStatistics_FenceTime_IsPartOfTheWriteBackTime(DurabilityMode mode)
    {
        using var domain = new SimulatedPersistenceDomain(16 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { Mode = mode, AdvancePeriod = Timeout.InfiniteTimeSpan });
        var map = new PersistentHashMap<long, long>(heap, typeId: 1);
        AdvancerStatistics start = heap.GetAdvancerStatistics();
        for (int round = 0; round < 5; round++)
        {
            for (long k = 0; k < 20_000; k++)
            {
                map.Set(k, round);
            }

            heap.AdvanceVersion(TimeSpan.FromSeconds(30));
        }

        AdvancerStatistics all = heap.GetAdvancerStatistics().Since(start);
        _output.WriteLine(all.ToString());
        Assert.True(all.FenceTime > TimeSpan.Zero && all.FenceTime <= all.WriteBackTime, all.ToString());
    }

    [Fact]
    public void Reclamation_RepeatedUpdatesAndDeletes_FreeOldPayloadsTwoVersionsLater()
    {
        using var domain = new SimulatedPersistenceDomain(4 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, Manual);
        var map = new PersistentHashMap<int, long>(heap, typeId: 1);
        for (int round = 0; round < 20; round++)
        {
            for (int k = 0; k < 50; k++)
            {
                map.Set(k, round);
            }

            map.Remove(round);
            heap.AdvanceVersion(TimeSpan.FromSeconds(10));
        }

        heap.AdvanceVersion(TimeSpan.FromSeconds(10));
        heap.AdvanceVersion(TimeSpan.FromSeconds(10));
        HeapStatistics stats = heap.Heap.GetStatistics();
        _output.WriteLine(stats.ToString());
        Assert.Equal(map.Count, stats.LiveBlocks);
        Assert.True(stats.AddsUp);
    }

    [Fact]
    public void Sync_InsideAnOperation_Throws()
    {
        using var domain = new SimulatedPersistenceDomain(1 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, Manual);
        using (DurableOperation op = heap.BeginOperation())
        {
            try
            {
                heap.Sync(TimeSpan.FromSeconds(5));
                Assert.Fail("Sync inside an operation returned");
            }
            catch (InvalidOperationException e)
            {
                Assert.Contains("inside an operation", e.Message);
            }
        }
    }

    /// <summary>
    /// SyncAsync inside an operation returned a task that could not complete before the operation ended, so a caller
    /// that waited for it there waited for ever (its version waits for the caller's operation). It is refused as Sync
    /// is, before anything is registered; once the operation ends, it works.
    /// </summary>
    [Fact]
    public async System.Threading.Tasks.Task SyncAsync_InsideAnOperation_IsRefusedAsSyncIs()
    {
        using var domain = new SimulatedPersistenceDomain(1 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, Manual);
        var map = new PersistentHashMap<int, int>(heap, typeId: 1);
        map.Set(1, 1);
        using (DurableOperation op = heap.BeginOperation())
        {
            InvalidOperationException e = Assert.Throws<InvalidOperationException>(() => { _ = heap.SyncAsync(); });
            Assert.Contains("SyncAsync was called inside an operation", e.Message, StringComparison.Ordinal);
        }

        await heap.SyncAsync().WaitAsync(TimeSpan.FromSeconds(10));
        Assert.True(heap.DurableFrontier >= 1);
    }

    /// <summary>A token canceled before the call cancels SyncAsync whatever the heap's state (with a background advancer and nothing pending it completed).</summary>
    [Theory]
    [InlineData(true)]
    [InlineData(false)]
    public async System.Threading.Tasks.Task SyncAsync_WithACanceledToken_IsCanceled(bool background)
    {
        using var domain = new SimulatedPersistenceDomain(1 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, background ? new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromMilliseconds(5) } : Manual);
        using var canceled = new CancellationTokenSource();
        canceled.Cancel();
        heap.Sync(); // nothing pending
        await Assert.ThrowsAnyAsync<OperationCanceledException>(() => heap.SyncAsync(canceled.Token));
        new PersistentHashMap<int, int>(heap, typeId: 1).Set(1, 1);
        await Assert.ThrowsAnyAsync<OperationCanceledException>(() => heap.SyncAsync(canceled.Token));
    }

    /// <summary>AdvanceVersion's timeout names no version (it said it waited for version 9223372036854775807 to become durable).</summary>
    [Fact]
    public void AdvanceVersion_TimingOut_NamesNoImpossibleVersion()
    {
        using var domain = new SimulatedPersistenceDomain(1 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, Manual);
        using var inside = new ManualResetEventSlim();
        using var release = new ManualResetEventSlim();
        var holder = new Thread(() =>
        {
            using DurableOperation op = heap.BeginOperation();
            inside.Set();
            release.Wait(TimeSpan.FromSeconds(30));
        });
        holder.Start();
        try
        {
            Assert.True(inside.Wait(TimeSpan.FromSeconds(30)));
            TimeoutException e = Assert.Throws<TimeoutException>(() => heap.AdvanceVersion(TimeSpan.Zero));
            Assert.DoesNotContain(long.MaxValue.ToString(System.Globalization.CultureInfo.InvariantCulture), e.Message, StringComparison.Ordinal);
            Assert.Contains("for an advance of the version", e.Message, StringComparison.Ordinal);
        }
        finally
        {
            release.Set();
            Assert.True(holder.Join(TimeSpan.FromSeconds(30)));
        }
    }

    /// <summary>Dispose inside an operation says so (it said "Sync was called inside an operation").</summary>
    [Fact]
    public void Dispose_InsideAnOperation_SaysDisposeWasCalledInsideIt()
    {
        using var dir = new TempDirectory();
        BufferedDurableHeap heap = BufferedDurableHeap.Create(dir.File("inside.heap"), new HeapFileOptions { Size = 1 << 20, Domain = PersistenceDomainKind.MappedFile }, Manual);
        DurableOperation op = heap.BeginOperation();
        InvalidOperationException e = Assert.Throws<InvalidOperationException>(heap.Dispose);
        Assert.Contains("Dispose was called inside an operation", e.Message, StringComparison.Ordinal);
        Assert.DoesNotContain("Sync was called", e.Message, StringComparison.Ordinal);
        try
        {
            op.Dispose(); // the heap is closed: the operation's end reports it or not, either way nothing is left open
        }
        catch (ObjectDisposedException)
        {
        }
    }

    [Fact]
    public void Sync_WhileAnotherThreadStaysInAnOperation_TimesOutNamingItThenSucceedsAfterItLeaves()
    {
        using var domain = new SimulatedPersistenceDomain(1 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromMilliseconds(10) });
        var map = new PersistentHashMap<int, int>(heap, typeId: 1);
        map.Set(1, 1);

        // Written before the other thread parks: once the advancer's transition waits for the parked operation, every
        // operation that begins waits for it too (no region enters until the transition completes), so a Set here raced
        // the advancer's 10 ms period and, under load, waited for the parked thread's 60 s instead of the Sync timing out.
        map.Set(2, 2);
        using var entered = new ManualResetEventSlim();
        using var release = new ManualResetEventSlim();
        int parkedId = 0;
        var parked = new Thread(() =>
        {
            using DurableOperation op = heap.BeginOperation();
            parkedId = Environment.CurrentManagedThreadId;
            entered.Set();
            release.Wait(Workers.JoinTimeout);
        })
        { IsBackground = true };
        parked.Start();
        Assert.True(entered.Wait(Workers.JoinTimeout));
        try
        {
            TimeoutException e = Assert.Throws<TimeoutException>(() => heap.Sync(TimeSpan.FromMilliseconds(300)));
            _output.WriteLine(e.Message);
            Assert.Contains($"thread {parkedId}", e.Message);
        }
        finally
        {
            release.Set();
            Assert.True(parked.Join(Workers.JoinTimeout));
        }

        long version = heap.CurrentVersion;
        heap.Sync(TimeSpan.FromSeconds(30));
        Assert.True(heap.DurableFrontier >= version);
    }

    [Fact]
    public async Task SyncAsync_UnderConcurrentLoad_CompletesWithTheFrontierCoveringTheCall()
    {
        using var domain = new SimulatedPersistenceDomain(8 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromMilliseconds(15) });
        var map = new PersistentHashMap<int, long>(heap, typeId: 1);
        using var stop = new CancellationTokenSource();
        Task writer = Task.Run(() =>
        {
            for (long i = 0; !stop.IsCancellationRequested && i < 2_000_000; i++)
            {
                map.Set((int)(i % 1000), i);
            }
        });
        for (int i = 0; i < 10; i++)
        {
            long version = heap.CurrentVersion;
            await heap.SyncAsync();
            Assert.True(heap.DurableFrontier >= version);
        }

        stop.Cancel();
        await writer.WaitAsync(Workers.JoinTimeout);
    }

    [Fact]
    public void TransientMode_Reopen_IsEmptyAndSyncThrows()
    {
        using var domain = new SimulatedPersistenceDomain(1 << 20);
        using (HeapFile file = HeapFile.Create(domain))
        using (BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { Mode = DurabilityMode.Transient }))
        {
            var map = new PersistentHashMap<int, int>(heap, typeId: 1);
            map.Set(1, 1);
            Assert.Throws<InvalidOperationException>(() => heap.Sync());
        }

        using var reopened = SimulatedPersistenceDomain.FromImage(domain.Crash(seed: 3));
        using HeapFile again = HeapFile.Open(reopened);
        using BufferedDurableHeap recovered = BufferedDurableHeap.Open(again, Manual);
        Assert.Equal(0, new PersistentHashMap<int, int>(recovered, typeId: 1).Count);
    }

    [Fact]
    public void StrictMode_EveryCompletedOperation_IsInTheDurableImage()
    {
        using var domain = new SimulatedPersistenceDomain(1 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { Mode = DurabilityMode.Strict, AdvancePeriod = Timeout.InfiniteTimeSpan });
        var map = new PersistentHashMap<int, int>(heap, typeId: 1);
        map.Set(1, 10);
        heap.AdvanceVersion(TimeSpan.FromSeconds(10));
        map.Set(1, 11);
        map.Set(2, 20);

        // Strictly durable payloads of the running version are in the durable image already; recovery keeps the
        // frontier prefix, so advance once (no write-back needed) and look.
        heap.AdvanceVersion(TimeSpan.FromSeconds(10));
        using var reopened = SimulatedPersistenceDomain.FromImage(domain.GetDurableImage());
        using HeapFile again = HeapFile.Open(reopened);
        using BufferedDurableHeap recovered = BufferedDurableHeap.Open(again, Manual);
        var map2 = new PersistentHashMap<int, int>(recovered, typeId: 1);
        Assert.True(map2.TryGetValue(1, out int one) && one == 11);
        Assert.True(map2.TryGetValue(2, out int two) && two == 20);
    }

    /// <summary>
    /// A thread's record of its open operations grows past four nested ones. If that allocation fails, BeginOperation
    /// throws having entered nothing: it used to grow the record inside the region it had just entered, and a failure
    /// left the thread protected for ever, holding back every version transition (Sync then timed out).
    /// </summary>
    [Fact]
    public void BeginOperation_WhoseRecordOfOpenOperationsCannotGrow_ThrowsHavingEnteredNothing()
    {
        using var domain = new SimulatedPersistenceDomain(1 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, SyncTimeout = TimeSpan.FromSeconds(5) });
        heap.BeforeOpenRecordGrowsForTesting = () => throw new OutOfMemoryException("simulated: no memory for the record of open operations");
        Assert.Throws<OutOfMemoryException>(() => Nest(heap, 5));
        heap.BeforeOpenRecordGrowsForTesting = null;
        Assert.False(heap.VersionScheme.Epoch.ThisInstanceProtected(), "the failed BeginOperation left the thread protected");
        heap.Sync();
        Nest(heap, 5);
        heap.Sync();

        static void Nest(BufferedDurableHeap heap, int depth)
        {
            using DurableOperation op = heap.BeginOperation();
            if (depth > 1)
            {
                Nest(heap, depth - 1);
            }
        }
    }

    /// <summary>
    /// Strict mode: an operation whose write-back fails throws, and its payloads stay pending. A later Sync that succeeds
    /// says every operation before it is durable, so it must write them back first, even when the thread that failed
    /// never operates again (they used to wait for that thread's next operation, while the cycle moved the frontier over
    /// their version: the durable image held the old value, then, once the old copy was freed, none). The failure is a
    /// transient one (the real domains fail-stop, so there every later persist throws instead). The control (that old
    /// behaviour) must lose the value from the durable image — today the cycle seals the block over bytes that never
    /// reached the file, so the control's image is refused as damaged (counted as lost; key 2 is then not checked).
    /// </summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void StrictMode_SyncAfterAFailedWriteBack_WritesThePendingPayloadsBackBeforeTheFrontierCoversThem(bool control)
    {
        using var domain = new SimulatedPersistenceDomain(1 << 20);
        using HeapFile file = HeapFile.Create(domain);
        DurabilityFaults faults = control ? DurabilityFaults.KeepFailedStrictPayloadsWithThread : DurabilityFaults.None;
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { Mode = DurabilityMode.Strict, AdvancePeriod = Timeout.InfiniteTimeSpan, Faults = faults });
        // Values wider than a cache line: the seal's write-back of a block's commit word (its first line) must not be what
        // carries a value to the file.
        var map = new PersistentHashMap<int, HashMapReadTests.Wide>(heap, typeId: 1);
        map.Set(1, HashMapReadTests.Wide.Of(10));
        map.Set(2, HashMapReadTests.Wide.Of(20));
        heap.Sync();

        int failures = 0;
        heap.BeforeStrictWriteBackForTesting = () =>
        {
            if (Interlocked.Increment(ref failures) == 1)
            {
                throw new System.IO.IOException("simulated write-back failure");
            }
        };
        Exception? failed = null;
        var writer = new Thread(() => failed = Record.Exception(() =>
        {
            map.Set(1, HashMapReadTests.Wide.Of(11));
            map.Set(2, HashMapReadTests.Wide.Of(21));
        }));
        writer.Start();
        Assert.True(writer.Join(TimeSpan.FromSeconds(30)));
        Assert.IsType<System.IO.IOException>(failed);
        Assert.True(map.TryGetValue(1, out HashMapReadTests.Wide visible) && visible.IsUniform && visible[0] == 11, "the failed operation's value is visible");
        heap.BeforeStrictWriteBackForTesting = null;

        // Each Sync that returns covers the failed operation; look at the durable image after each (the old copy is freed
        // two versions after it was replaced).
        var wrong = new List<string>();
        for (int round = 0; round < 4; round++)
        {
            heap.Sync();
            using var image = SimulatedPersistenceDomain.FromImage(domain.GetDurableImage());
            using HeapFile again = HeapFile.Open(image);
            string? one = null, two = null;
            try
            {
                using BufferedDurableHeap recovered = BufferedDurableHeap.Open(again, Manual);
                var durable = new PersistentHashMap<int, HashMapReadTests.Wide>(recovered, typeId: 1);
                one = durable.TryGetValue(1, out HashMapReadTests.Wide v1) ? (v1.IsUniform ? v1[0].ToString(CultureInfo.InvariantCulture) : "torn") : "lost";
                two = durable.TryGetValue(2, out HashMapReadTests.Wide v2) ? (v2.IsUniform ? v2[0].ToString(CultureInfo.InvariantCulture) : "torn") : "lost";
            }
            catch (HeapFileException e)
            {
                one = $"refused ({e.Error})";
            }

            if (one != "11")
            {
                wrong.Add($"after Sync {round}: key 1 is {one}, not 11");
            }

            Assert.True(two is null || two == "20", $"after Sync {round}: key 2 is {two}, not the value of before the failed operation");
        }

        if (control)
        {
            Assert.True(wrong.Count != 0, "INCONCLUSIVE: the broken control (payloads kept with the failed thread) kept the value durable");
        }
        else
        {
            Assert.True(wrong.Count == 0, string.Join("; ", wrong));
        }
    }

    /// <summary>
    /// Recovery splits the payloads' resolution into partitions, each of which reads every payload: with one partition
    /// per unit of <see cref="BufferedDurableHeapOptions.RecoveryParallelism"/>, int.MaxValue failed the open with
    /// OutOfMemoryException ("Array dimensions exceeded supported range") and 100,000 read every payload 100,000 times
    /// (half a second for 2,000 payloads, minutes for a large heap). The option bounds the threads; the partitions are
    /// at most one per processor.
    /// </summary>
    [Theory]
    [InlineData(100_000)]
    [InlineData(int.MaxValue)]
    public void Open_AfterACrashWithAHugeRecoveryParallelism_RecoversInsteadOfFailingOrCrawling(int parallelism)
    {
        using var domain = new SimulatedPersistenceDomain(2 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, Manual);
        var map = new PersistentHashMap<int, int>(heap, typeId: 1);
        for (int i = 0; i < 2000; i++)
        {
            map.Set(i, i);
        }

        for (int i = 0; i < 2000; i += 2)
        {
            map.Remove(i);
        }

        heap.Sync();
        using var image = SimulatedPersistenceDomain.FromImage(domain.GetDurableImage());
        using HeapFile again = HeapFile.Open(image);
        using BufferedDurableHeap recovered = BufferedDurableHeap.Open(again, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, RecoveryParallelism = parallelism });
        Assert.False(recovered.Recovery.FastReopen);
        var map2 = new PersistentHashMap<int, int>(recovered, typeId: 1);
        Assert.Equal(1000, map2.Count);
        Assert.True(map2.TryGetValue(1999, out int last) && last == 1999);
    }

    [Fact]
    public void Queue_EnqueueDequeueReopen_KeepsFifoOrder()
    {
        using var dir = new TempDirectory();
        string path = dir.File("queue.heap");
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, new HeapFileOptions { Size = 2L << 20, Domain = PersistenceDomainKind.MappedFile }))
        {
            var queue = new PersistentQueue<long>(heap, typeId: 4);
            for (long i = 0; i < 50; i++)
            {
                queue.Enqueue(i);
            }

            for (long i = 0; i < 20; i++)
            {
                Assert.True(queue.TryDequeue(out long v) && v == i);
            }
        }

        using (BufferedDurableHeap heap = BufferedDurableHeap.Open(path, new HeapFileOptions { Domain = PersistenceDomainKind.MappedFile }))
        {
            var queue = new PersistentQueue<long>(heap, typeId: 4);
            Assert.Equal(Enumerable.Range(20, 30).Select(i => (long)i), queue.ToArray());
            queue.Enqueue(99);
            Assert.True(queue.TryDequeue(out long v) && v == 20);
        }
    }

    /// <summary>A 1 MiB manual heap whose map (type id 1) wrote <paramref name="keys"/> keys in one version and replaced them all in the next (still open).</summary>
    private static BufferedDurableHeap HeapWithReplacedKeys(string path, int keys)
    {
        BufferedDurableHeap heap = BufferedDurableHeap.Create(path, new HeapFileOptions { Size = 1L << 20, Domain = PersistenceDomainKind.MappedFile }, Manual);
        var map = new PersistentHashMap<long, long>(heap, typeId: 1);
        for (long k = 0; k < keys; k++)
        {
            map.Set(k, k);
        }

        heap.AdvanceVersion(TimeSpan.FromSeconds(30));
        for (long k = 0; k < keys; k++)
        {
            map.Set(k, k + 1);
        }

        return heap;
    }
}
