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
        var heap = BufferedDurableHeap.Create(path, Small, new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromMilliseconds(2) });
        var map = new PersistentHashMap<long, long>(heap, typeId: 1);
        map.Set(1, 1);
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
        while (refused is null && DateTime.UtcNow < deadline)
        {
            try
            {
                map.Set(2, 2);
                Thread.Yield();
            }
            catch (InvalidOperationException e)
            {
                refused = e;
            }
        }

        Assert.NotNull(refused);
        Assert.Contains("advance cycle failed", refused.Message, StringComparison.Ordinal);
        Assert.Throws<InvalidOperationException>(() => heap.Sync());
        InvalidOperationException disposal = Assert.Throws<InvalidOperationException>(heap.Dispose);
        Assert.Contains("not made durable", disposal.Message, StringComparison.Ordinal);

        // The lock is released, and the next open is told the shutdown was not clean; the synced entry is there.
        using BufferedDurableHeap reopened = BufferedDurableHeap.Open(path, Small, Manual);
        Assert.False(reopened.Recovery.WasCleanShutdown);
        Assert.True(reopened.Recovery.RecoveredVersion >= synced);
        Assert.True(new PersistentHashMap<long, long>(reopened, typeId: 1).TryGetValue(1, out long one) && one == 1);
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
            string path = dir.File($"race{round}.heap");
            var heap = BufferedDurableHeap.Create(path, Small, new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromMilliseconds(1) });
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

            Assert.Null(disposal);
            using BufferedDurableHeap reopened = BufferedDurableHeap.Open(path, Small, Manual);
            Assert.Equal(new byte[] { 1 }, new PersistentByteMap<long>(reopened, typeId: 1).Get(1));
        }
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
