using System;
using System.IO;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// Issue 10, found by an adversarial pass: public call sequences that lost data without a word (two heaps on one file,
/// a failed cycle followed by a normal-looking Dispose, a stale operation copy writing into a durable version), left the
/// file locked (a Dispose racing concurrent calls), or accepted bad options. Each test failed before its fix.
/// </summary>
public sealed class OwnershipTests
{
    private static readonly HeapFileOptions Small = new() { Size = 4L << 20, Domain = PersistenceDomainKind.MappedFile };
    private static readonly BufferedDurableHeapOptions Manual = new() { AdvancePeriod = Timeout.InfiniteTimeSpan };

    [Fact]
    public void TwoHeapsOnOneFile_TheSecondIsRefused_AndTheFileTakesAnotherOnceTheFirstIsDisposed()
    {
        using var dir = new TempDirectory();
        using HeapFile file = HeapFile.Create(dir.File("shared.heap"), Small);
        using (BufferedDurableHeap first = BufferedDurableHeap.Open(file, Manual))
        {
            new PersistentHashMap<long, long>(first, typeId: 1).Set(1, 10);

            // Before the fix both were accepted and handed out the same blocks: after a reopen one map was empty.
            InvalidOperationException second = Assert.Throws<InvalidOperationException>(() => BufferedDurableHeap.Open(file, Manual));
            Assert.Contains("already used by another heap", second.Message, StringComparison.Ordinal);
            Assert.Throws<InvalidOperationException>(() => new PersistentHeap(file));
            first.Sync();
        }

        using BufferedDurableHeap next = BufferedDurableHeap.Open(file, Manual);
        Assert.True(new PersistentHashMap<long, long>(next, typeId: 1).TryGetValue(1, out long value) && value == 10);
    }

    /// <summary>
    /// A buffered heap's allocator (<see cref="BufferedDurableHeap.Heap"/>) is public for statistics. Allocating through
    /// it directly made a block with no version (tag 0), which recovery drops and frees: the data was gone after a
    /// reopen, persisted or not, without a word. Freeing through it a block a structure holds let the next operation
    /// hand it out again under another key (two keys, one payload). Both are refused now; the heap is unchanged.
    /// </summary>
    [Fact]
    public void BufferedHeapsAllocator_DirectAllocateAndFree_AreRefusedInsteadOfLosingOrSharingBlocks()
    {
        using var dir = new TempDirectory();
        string path = dir.File("direct.heap");
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, Small, Manual))
        {
            var map = new PersistentHashMap<long, long>(heap, typeId: 1);
            map.Set(1, 10);
            PayloadRef live = FindLive(heap);
            long allocated = heap.Heap.GetStatistics().LiveBlocks;

            InvalidOperationException allocate = Assert.Throws<InvalidOperationException>(() => heap.Heap.Allocate(16, typeId: 7));
            Assert.Contains("BeginOperation", allocate.Message, StringComparison.Ordinal);
            Assert.Throws<InvalidOperationException>(() => heap.Heap.TryAllocate(16, typeId: 7, out _));
            Assert.Throws<InvalidOperationException>(() => heap.Heap.Free(live));
            Assert.Equal(allocated, heap.Heap.GetStatistics().LiveBlocks);
            map.Set(2, 20);
            Assert.True(map.TryGetValue(1, out long one) && one == 10);
        }

        using BufferedDurableHeap reopened = BufferedDurableHeap.Open(path, Small, Manual);
        Assert.Equal(2, new PersistentHashMap<long, long>(reopened, typeId: 1).Count);

        static PayloadRef FindLive(BufferedDurableHeap heap)
        {
            PayloadRef found = default;
            heap.Heap.ForEachAllocated((block, _) => found = block);
            return found;
        }
    }

    [Fact]
    public void TwoHeapFilesOnOneDomain_TheSecondIsRefused()
    {
        using var domain = new SimulatedPersistenceDomain(4L << 20);
        using HeapFile file = HeapFile.Create(domain);
        Assert.Throws<InvalidOperationException>(() => HeapFile.Create(domain));
        Assert.Throws<InvalidOperationException>(() => HeapFile.Open(domain));
    }

    /// <summary>
    /// A deferred delete of a block already deleted in the same operation (a double free) fails the advance cycle that
    /// reclaims it. Before the fix operations went on succeeding, and Dispose returned normally and marked the file
    /// clean: a reopen found none of the 1000 entries written after the failure, and nothing had said so.
    /// </summary>
    [Fact]
    public void AfterACycleFails_OperationsAreRefused_AndDisposeReportsWhatWasNotMadeDurable()
    {
        using var dir = new TempDirectory();
        string path = dir.File("double-delete.heap");
        // A small backlog limit: after the failure nothing is reclaimed, so the backlog stays over it, and reads (which
        // look at it every 256 operations) must not run into the failure by helping the advancer.
        // A double delete fails the cycle that reclaims it: refused as it is made since session 16 (DoubleRetirementTests),
        // so this lets it through, to stand for any failed cycle.
        var heap = BufferedDurableHeap.Create(path, Small, new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromMilliseconds(2), ReclaimBacklogLimit = 1, Faults = DurabilityFaults.AcceptDoubleRetirement });
        var map = new PersistentHashMap<long, long>(heap, typeId: 1);
        var bytes = new PersistentByteMap<long>(heap, typeId: 2);
        for (long k = 0; k < 100; k++)
        {
            map.Set(k, 1);
        }

        bytes.Set(1, new byte[] { 1, 2, 3 });
        heap.Sync();
        long synced = heap.DurableFrontier;
        PayloadRef block;
        using (DurableOperation op = heap.BeginOperation())
        {
            block = op.Allocate(8, typeId: 7);
        }

        using (DurableOperation op = heap.BeginOperation())
        {
            op.Delete(block);
            op.Delete(block);
        }

        // The background advancer reclaims the version within a few periods and fails; from then on no operation
        // begins (each would be lost). Bounded: a regression fails here instead of hanging.
        var deadline = DateTime.UtcNow + TimeSpan.FromSeconds(30);
        InvalidOperationException? refused = null;
        for (long i = 0; refused is null && DateTime.UtcNow < deadline; i++)
        {
            try
            {
                // Updates of keys written in earlier versions retire their old copies: after the failure, the backlog
                // of the versions nobody reclaims stays over the limit.
                map.Set(i % 100, i);
                Thread.Yield();
            }
            catch (InvalidOperationException e) when (e.Message.Contains("advance cycle failed", StringComparison.Ordinal))
            {
                refused = e;
            }
            catch (InvalidOperationException)
            {
                // The failing cycle itself, when this thread ran it (back-pressure on the small backlog limit): the
                // failure is reported to the writer that ran into it; the refusals follow.
            }
        }

        Assert.NotNull(refused);
        Assert.Contains("advance cycle failed", refused.Message, StringComparison.Ordinal);
        Assert.SkipWhen(heap.ReclaimBacklog <= 1, $"inconclusive: the failing cycle left no backlog ({heap.ReclaimBacklog} bytes), so the reads below would not help the advancer");

        // Writes are refused; reads still work, so the data can be read out before the heap is disposed.
        Assert.Throws<InvalidOperationException>(() => bytes.Set(2, new byte[] { 2 }));
        for (int i = 0; i < 600; i++)
        {
            Assert.Equal(new byte[] { 1, 2, 3 }, bytes.Get(1));
        }

        Assert.Single(bytes.ToList());
        Assert.Throws<InvalidOperationException>(() => heap.Sync());
        InvalidOperationException disposal = Assert.Throws<InvalidOperationException>(heap.Dispose);
        Assert.Contains("not made durable", disposal.Message, StringComparison.Ordinal);

        // The lock is released, and the next open is told the shutdown was not clean; the synced entry is there.
        using BufferedDurableHeap reopened = BufferedDurableHeap.Open(path, Small, Manual);
        Assert.False(reopened.Recovery.WasCleanShutdown);
        Assert.True(reopened.Recovery.RecoveredVersion >= synced);
        Assert.Equal(100, new PersistentHashMap<long, long>(reopened, typeId: 1).Count);
        Assert.Equal(new byte[] { 1, 2, 3 }, new PersistentByteMap<long>(reopened, typeId: 2).Get(1));
    }

    /// <summary>
    /// A copy of an operation that outlived its Dispose: before the fix Replace and Delete went through it, writing a
    /// payload tagged with a version whose frontier had already been persisted (and Delete twice made a double free).
    /// </summary>
    [Fact]
    public void AStaleOperationCopy_CannotReplaceDeleteOrReadPayloads()
    {
        using var dir = new TempDirectory();
        using BufferedDurableHeap heap = BufferedDurableHeap.Create(dir.File("stale.heap"), Small, Manual);
        PayloadRef block;
        using (DurableOperation op = heap.BeginOperation())
        {
            block = op.Allocate(8, typeId: 5);
        }

        heap.Sync();
        DurableOperation live = heap.BeginOperation();
        DurableOperation copy = live;
        live.Dispose();
        heap.Sync();
        AssertRefusesEverything(copy, block);

        // Also while another operation is open on the thread (the first fix only asked whether one was): the copy would
        // tag its payloads with its own version, already durable, and its Dispose would end the open operation.
        heap.Sync();
        using DurableOperation now = heap.BeginOperation();
        Assert.True(copy.Version < now.Version);
        AssertRefusesEverything(copy, block);
        try
        {
            copy.Dispose();
            Assert.Fail("a stale copy's Dispose was accepted");
        }
        catch (InvalidOperationException)
        {
        }

        Assert.True(now.IsActive);
        Assert.Equal(now.Version, heap.Heap.GetHeader(now.Allocate(8, typeId: 5)).EpochTag);
    }

    /// <summary>
    /// Nested operations may end in any order, as the version scheme's regions may: refusing the outer one's Dispose
    /// (while checking for stale copies) left it open for good, and every version transition waited for it.
    /// </summary>
    [Fact]
    public void NestedOperations_EndedOutOfOrder_BothEnd()
    {
        using var dir = new TempDirectory();
        using BufferedDurableHeap heap = BufferedDurableHeap.Create(dir.File("nested.heap"), Small, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, SyncTimeout = TimeSpan.FromSeconds(30) });
        DurableOperation outer = heap.BeginOperation();
        DurableOperation inner = heap.BeginOperation();
        outer.Dispose();
        Assert.False(outer.IsActive);
        PayloadRef block = inner.Allocate(8, typeId: 5);
        inner.Dispose();
        heap.Sync();
        Assert.True(heap.DurableFrontier >= heap.Heap.GetHeader(block).EpochTag);
    }

    private static void AssertRefusesEverything(DurableOperation copy, PayloadRef block)
    {

        // (A ref struct cannot be captured by Assert.Throws' lambda.)
        var accepted = new System.Collections.Generic.List<string>();
        try
        {
            copy.Replace(block, 8);
            accepted.Add("Replace");
        }
        catch (InvalidOperationException)
        {
        }

        try
        {
            copy.Delete(block);
            accepted.Add("Delete");
        }
        catch (InvalidOperationException)
        {
        }

        try
        {
            _ = copy.GetPayload(block);
            accepted.Add("GetPayload");
        }
        catch (InvalidOperationException)
        {
        }

        try
        {
            copy.Allocate(8, typeId: 5);
            accepted.Add("Allocate");
        }
        catch (InvalidOperationException)
        {
        }

        Assert.Empty(accepted);
    }

    [Fact]
    public void SecondStructureWithOneTypeId_IsRefusedWhateverItsKeySize()
    {
        using var dir = new TempDirectory();
        using BufferedDurableHeap heap = BufferedDurableHeap.Create(dir.File("ids.heap"), Small, Manual);
        new PersistentHashMap<long, long>(heap, typeId: 1).Set(1, 1);

        // Once the key size was part of the stored id, these were accepted, and at the next open each refused the other.
        Assert.Throws<InvalidOperationException>(() => new PersistentHashMap<int, long>(heap, typeId: 1));
        Assert.Throws<InvalidOperationException>(() => new PersistentByteMap<long>(heap, typeId: 1));
        Assert.Throws<InvalidOperationException>(() => new PersistentQueue<long>(heap, typeId: 1));
    }

    /// <summary>
    /// A heap on a caller's file closed with a thread still inside an operation (Dispose times out): that thread may
    /// still allocate through the old allocator, so the file takes no new heap (before, one opened and both allocators
    /// handed out the same blocks); disposing the file quarantines the mapping and releases the lock.
    /// </summary>
    [Fact]
    public void AHeapClosedWithAStraggler_LeavesTheFileToNoOtherHeap()
    {
        using var dir = new TempDirectory();
        string path = dir.File("straggler.heap");
        HeapFile file = HeapFile.Create(path, Small);
        var heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, SyncTimeout = TimeSpan.FromMilliseconds(200) });
        using var inside = new ManualResetEventSlim();
        using var release = new ManualResetEventSlim();
        var straggler = new Thread(() =>
        {
            using DurableOperation op = heap.BeginOperation();
            inside.Set();
            release.Wait();
        })
        { IsBackground = true };
        straggler.Start();
        Assert.True(inside.Wait(TimeSpan.FromSeconds(30)));
        Assert.Throws<TimeoutException>(heap.Dispose);
        InvalidOperationException refused = Assert.Throws<InvalidOperationException>(() => BufferedDurableHeap.Open(file, Manual));
        Assert.Contains("still inside its operations", refused.Message, StringComparison.Ordinal);
        release.Set();
        Assert.True(straggler.Join(TimeSpan.FromSeconds(30)));
        file.Dispose();
        using BufferedDurableHeap reopened = BufferedDurableHeap.Open(path, Small, Manual);
        Assert.False(reopened.Recovery.WasCleanShutdown);
    }

    /// <summary>
    /// Threads calling into a byte map while Dispose runs: one that begins an operation after Dispose's wait for
    /// operations is still inside the version scheme for a moment. Before the fix the scheme's Dispose then threw, and
    /// everything after it (the allocator, the file, its lock) was skipped: the file could not be reopened.
    /// </summary>
    [Fact]
    public void Dispose_RacingCallersOnOtherThreads_AlwaysClosesTheFileAndReleasesItsLock()
    {
        using var dir = new TempDirectory();
        for (int round = 0; round < 20; round++)
        {
            Exception? disposal = DisposeRacingCallers(dir.File($"race{round}.heap"), DurabilityFaults.None);
            Assert.Null(disposal);
        }

        // The control tries the scheme's Dispose once (as before): a racing caller makes Dispose fail, at least once in
        // 200 rounds if the race is hit at all. The file is closed either way now (Dispose's finally).
        Exception? caught = null;
        for (int round = 0; round < 200 && caught is null; round++)
        {
            caught = DisposeRacingCallers(dir.File($"control{round}.heap"), DurabilityFaults.DisposeSchemeOnce);
        }

        Assert.SkipWhen(caught is null, "inconclusive: no caller raced Dispose's scheme disposal in 200 control rounds");
        Assert.IsType<InvalidOperationException>(caught);
    }

    /// <summary>Disposes a heap while three threads call into a byte map; returns what Dispose threw, and checks the file reopens with its entry.</summary>
    private static Exception? DisposeRacingCallers(string path, DurabilityFaults faults)
    {
        var heap = BufferedDurableHeap.Create(path, Small, new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromMilliseconds(1), Faults = faults });
        var map = new PersistentByteMap<long>(heap, typeId: 1);
        map.Set(1, new byte[] { 1 });
        int stop = 0;
        using var started = new CountdownEvent(3);
        var callers = new Thread[3];
        for (int t = 0; t < callers.Length; t++)
        {
            callers[t] = new Thread(() =>
            {
                started.Signal();
                // Volatile.Read: the test thread's Volatile.Write ends the loop.
                while (Volatile.Read(ref stop) == 0)
                {
                    try
                    {
                        map.Set(2, new byte[] { 2 });
                        map.Get(1);
                    }
                    catch (ObjectDisposedException)
                    {
                    }
                }
            })
            { IsBackground = true };
            callers[t].Start();
        }

        Assert.True(started.Wait(TimeSpan.FromSeconds(30)));
        Exception? disposal = Record.Exception(heap.Dispose);
        Volatile.Write(ref stop, 1);
        foreach (Thread caller in callers)
        {
            Assert.True(caller.Join(TimeSpan.FromSeconds(30)));
        }

        using BufferedDurableHeap reopened = BufferedDurableHeap.Open(path, Small, Manual);
        Assert.Equal(new byte[] { 1 }, new PersistentByteMap<long>(reopened, typeId: 1).Get(1));
        return disposal;
    }

    /// <summary>A probe's finding: a symbolic link that loops, or whose target is gone, was reported as a file that does not exist.</summary>
    [Theory]
    [InlineData(true)]
    [InlineData(false)]
    public void Open_OfASymbolicLinkThatLoopsOrDangles_NamesTheLink(bool loop)
    {
        Assert.SkipWhen(OperatingSystem.IsWindows(), "symbolic links need privileges on Windows");
        using var dir = new TempDirectory();
        string link = dir.File("a.heap");
        File.CreateSymbolicLink(link, loop ? dir.File("b.heap") : dir.File("gone.heap"));
        if (loop)
        {
            File.CreateSymbolicLink(dir.File("b.heap"), link);
        }

        FileNotFoundException e = Assert.Throws<FileNotFoundException>(() => HeapFile.Open(link, Small).Dispose());
        Assert.Contains("is a symbolic link to", e.Message, StringComparison.Ordinal);
        Assert.Equal(Path.GetFullPath(link), e.FileName);
    }

    [Fact]
    public void Open_ThroughASymbolicLinkToAHeapFile_Opens()
    {
        Assert.SkipWhen(OperatingSystem.IsWindows(), "symbolic links need privileges on Windows");
        using var dir = new TempDirectory();
        HeapFile.Create(dir.File("real.heap"), Small).Dispose();
        File.CreateSymbolicLink(dir.File("link.heap"), dir.File("real.heap"));
        using HeapFile file = HeapFile.Open(dir.File("link.heap"), Small);
        Assert.True(file.Size > 0);
    }

    [Fact]
    public void Create_InADirectoryThatDoesNotExist_SaysSo()
    {
        using var dir = new TempDirectory();
        string path = Path.Combine(dir.File("no-such-directory"), "a.heap");

        // Before: DriveNotFoundException, "Could not find the drive".
        DirectoryNotFoundException e = Assert.Throws<DirectoryNotFoundException>(() => HeapFile.Create(path, Small));
        Assert.Contains("does not exist", e.Message, StringComparison.Ordinal);
    }

    [Theory]
    [InlineData(-5)]
    [InlineData(1)]
    [InlineData(1L << 20)]
    public void Create_WithAMaximumSizeBelowTheSize_IsRefusedAndLeavesNoFile(long maxSize)
    {
        using var dir = new TempDirectory();
        string path = dir.File("max.heap");

        // Before: clamped to the size without a word.
        Assert.Throws<ArgumentOutOfRangeException>(() => HeapFile.Create(path, new HeapFileOptions { Size = 4L << 20, MaxSize = maxSize }));
        Assert.False(File.Exists(path));
        using var domain = new SimulatedPersistenceDomain(4L << 20);
        Assert.Throws<ArgumentOutOfRangeException>(() => HeapFile.Create(domain, maxSize));
    }
}
