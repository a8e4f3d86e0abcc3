using System;
using System.Diagnostics;
using System.Runtime.CompilerServices;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// A probe: a <see cref="BufferedDurableHeap"/> never disposed and unreachable was never collected — its advancer and
/// stocker threads held it — so its threads, mapping, descriptor and file lock lived until the process exited, and a
/// reopen of its file in the same process said AlreadyOpen however long one waited. The threads now hold the heap only
/// while they run a cycle or a stocking; the heap is collected, its finalizer stops them, the file's handles release the
/// lock and the mapping, and the file reopens (recovering, as after a crash, what a Sync made durable).
/// </summary>
public sealed class AbandonedHeapTests
{
    [Fact]
    public void AHeapNeverDisposed_IsCollected_ItsThreadsEnd_AndItsFileReopensWithWhatWasSynced()
    {
        using var dir = new TempDirectory();
        string path = dir.File("abandoned.heap");
        var options = new HeapFileOptions { Size = 4L << 20, Domain = PersistenceDomainKind.MappedFile };
        (WeakReference heap, Thread advancer, Thread stocker) = Abandon(path, options);

        var watch = Stopwatch.StartNew();
        while (heap.IsAlive && watch.Elapsed < TimeSpan.FromSeconds(30))
        {
            GC.Collect();
            GC.WaitForPendingFinalizers();
        }

        Assert.False(heap.IsAlive, "an unreachable heap was never collected (its background threads hold it)");
        Assert.True(advancer.Join(TimeSpan.FromSeconds(30)), "the advancer of a collected heap kept running");
        Assert.True(stocker.Join(TimeSpan.FromSeconds(30)), "the stocker of a collected heap kept running");

        // The file's handles are finalized after the heap (critical finalizers): its lock is released then. A child
        // process that another test spawns at that instant may hold a copy of the descriptor until it execs: retried.
        BufferedDurableHeap? reopened = null;
        while (reopened is null)
        {
            GC.Collect();
            GC.WaitForPendingFinalizers();
            try
            {
                reopened = BufferedDurableHeap.Open(path, options);
            }
            catch (HeapFileException e) when (e.Error == HeapFileError.AlreadyOpen && watch.Elapsed < TimeSpan.FromSeconds(60))
            {
                Thread.Yield();
            }
        }

        using (reopened)
        {
            Assert.False(reopened.Heap.File.WasCleanShutdown);
            Assert.Equal(1, new PersistentHashMap<long, long>(reopened, typeId: 1).Count);
        }
    }

    [MethodImpl(MethodImplOptions.NoInlining)]
    private static (WeakReference Heap, Thread Advancer, Thread Stocker) Abandon(string path, HeapFileOptions options)
    {
        var heap = BufferedDurableHeap.Create(path, options, new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromMilliseconds(5) });
        var map = new PersistentHashMap<long, long>(heap, typeId: 1);
        map.Set(1, 1);
        heap.Sync();
        heap.WakeStockerForTesting();
        return (new WeakReference(heap), heap.AdvancerForTesting!, heap.StockerForTesting!);
    }
}
