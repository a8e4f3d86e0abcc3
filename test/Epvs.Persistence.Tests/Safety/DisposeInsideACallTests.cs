using System;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// A Dispose called from inside a call of the heap on the same thread — a <see cref="PersistentHeap.ForEachAllocated"/>
/// visitor — returned normally after quarantining the mapping under the call: the scan went on over anonymous memory,
/// found no more blocks and returned as if complete (3 of 600 blocks visited), and the file lost its clean-shutdown mark.
/// With several scanning threads, a visitor's Dispose on a pool thread waited 30 s for the caller's call, which waited
/// for it. Now every public Dispose refuses there, before anything changes: the scan visits every block, and the heap is
/// disposed cleanly afterwards.
/// </summary>
public sealed class DisposeInsideACallTests
{
    private static readonly HeapFileOptions Small = new() { Size = 4L << 20, Domain = PersistenceDomainKind.MappedFile };

    [Theory]
    [InlineData(1)]
    [InlineData(4)]
    public void PersistentHeap_DisposeFromAVisitor_IsRefused_AndTheScanVisitsEveryBlock(int parallelism)
    {
        using var dir = new TempDirectory();
        string path = dir.File("raw.heap");
        const int Blocks = 600;
        PersistentHeap heap = PersistentHeap.Create(path, Small);
        for (int i = 0; i < Blocks; i++)
        {
            PayloadRef block = heap.Allocate(40 + (i % 3 * 200), typeId: 5);
            heap.Persist(block);
        }

        int visited = 0;
        int refused = 0;
        heap.ForEachAllocated(
            (_, _) =>
            {
                if (Interlocked.Increment(ref visited) % 100 == 3)
                {
                    InvalidOperationException e = Assert.Throws<InvalidOperationException>(heap.Dispose);
                    Assert.Contains("inside a call of this heap", e.Message, StringComparison.Ordinal);
                    Interlocked.Increment(ref refused);
                }
            },
            parallelism);

        Assert.Equal(Blocks, visited);
        Assert.Equal(Blocks / 100, refused);
        heap.Dispose();
        using PersistentHeap reopened = PersistentHeap.Open(path, Small);
        Assert.True(reopened.File.WasCleanShutdown);
    }

    [Fact]
    public void BufferedDurableHeap_DisposeFromAVisitorOfItsHeap_IsRefused_AndItsDataStays()
    {
        using var dir = new TempDirectory();
        string path = dir.File("buffered.heap");
        BufferedDurableHeap heap = BufferedDurableHeap.Create(path, Small, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
        var map = new PersistentHashMap<int, int>(heap, typeId: 1);
        for (int k = 0; k < 600; k++)
        {
            map.Set(k, k);
        }

        heap.Sync();
        int visited = 0;
        Exception? refusal = null;
        heap.Heap.ForEachAllocated((_, _) =>
        {
            if (++visited == 3)
            {
                refusal = Record.Exception(heap.Dispose);
            }
        });

        Assert.IsType<InvalidOperationException>(refusal);
        Assert.True(visited >= 600, $"the scan stopped after {visited} blocks");
        map.Set(1000, 1000);
        heap.Dispose();
        using BufferedDurableHeap reopened = BufferedDurableHeap.Open(path, Small);
        Assert.True(reopened.Heap.File.WasCleanShutdown);
        Assert.Equal(601, new PersistentHashMap<int, int>(reopened, typeId: 1).Count);
    }

    [Fact]
    public void HeapFile_DisposeInsideACallOnTheSameThread_IsRefused()
    {
        using var dir = new TempDirectory();
        HeapFile file = HeapFile.Create(dir.File("file.heap"), Small);
        file.EnterOperation();
        try
        {
            Assert.Throws<InvalidOperationException>(file.Dispose);
        }
        finally
        {
            file.ExitOperation();
        }

        file.Dispose();
        Assert.Throws<ObjectDisposedException>(file.EnterOperation);
    }
}
