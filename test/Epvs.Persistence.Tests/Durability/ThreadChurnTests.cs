using System;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// Short-lived threads (a thread per request, a thread pool that retires idle threads): each thread that operates on a
/// heap gets buffers and an allocator cache, which takes a batch of free blocks. When the thread exits, the heap must
/// forget its buffers once they are drained and take its cached free blocks back; it kept both for ever, so a heap that
/// cannot grow reported itself full with a handful of live values, and memory grew with every thread.
/// </summary>
public sealed class ThreadChurnTests
{
    private const int Threads = 600;
    private const int Keys = 16;
    private readonly ITestOutputHelper _output;

    public ThreadChurnTests(ITestOutputHelper output) => _output = output;

    [Fact]
    public void ShortLivedThreads_OnAHeapThatCannotGrow_NeitherFillItNorStayRegistered()
    {
        (Exception? failure, int completed, int registered, int caches, HeapStatistics statistics) = Churn(HeapFaults.None);
        _output.WriteLine($"{completed} of {Threads} threads completed; {registered} thread buffers and {caches} allocator caches kept; {statistics}; {failure?.Message}");
        Assert.Null(failure);
        Assert.Equal(Threads, completed);

        // The test thread's own (it ran the advances) and at most one other: the exited threads are forgotten.
        Assert.True(registered <= 2, $"{registered} thread buffers kept after every thread exited");
        Assert.True(caches <= 2, $"{caches} allocator caches kept after every thread exited");
    }

    [Fact]
    public void ShortLivedThreads_Control_KeepingExitedThreadsIsCaught()
    {
        (Exception? failure, int completed, int registered, int caches, HeapStatistics statistics) = Churn(HeapFaults.KeepExitedThreadCaches);
        _output.WriteLine($"control: {completed} of {Threads} threads completed; {registered} thread buffers and {caches} allocator caches kept; {statistics}; {failure?.Message}");
        Assert.True(failure is InsufficientMemoryException && registered > 2, "INCONCLUSIVE: the broken control (exited threads kept) was not caught filling the heap");
    }

    /// <summary>
    /// A thread that writes in the version after a cut and exits before the cycle of that cut looks for exited threads
    /// leaves a write-back list the next cycle must still write: its buffers may be forgotten only once drained. The
    /// thread runs inside the cycle (from its reclamation hook), after the transition and before the look; a Sync
    /// afterwards says the write is durable, so the durable image must hold it. The control forgets undrained buffers.
    /// </summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void AThreadThatWritesAfterACutAndExitsDuringTheCycle_IsWrittenBackByTheNextSync(bool control)
    {
        using var domain = new SimulatedPersistenceDomain(1 << 20);
        using HeapFile file = HeapFile.Create(domain);
        DurabilityFaults faults = control ? DurabilityFaults.ForgetUndrainedExitedThreads : DurabilityFaults.None;
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, Faults = faults });
        var map = new PersistentHashMap<int, int>(heap, typeId: 1);
        map.Set(1, 10);
        heap.AdvanceVersion(TimeSpan.FromSeconds(30));

        // Replaced in version w: the cycle that completes w + 1 reclaims it, and its reclamation hook runs.
        map.Set(1, 11);
        heap.AdvanceVersion(TimeSpan.FromSeconds(30));
        int ran = 0;
        Exception? failure = null;
        heap.AfterReclaimMarkedForTesting = () =>
        {
            if (Interlocked.Increment(ref ran) != 1)
            {
                return;
            }

            var writer = new Thread(() => failure = Record.Exception(() => map.Set(2, 20)));
            writer.Start();
            Assert.True(writer.Join(TimeSpan.FromSeconds(30)), "the writer did not finish");
        };
        heap.AdvanceVersion(TimeSpan.FromSeconds(30));
        heap.AfterReclaimMarkedForTesting = null;
        Assert.Equal(1, ran);
        Assert.Null(failure);

        heap.Sync();
        using var image = SimulatedPersistenceDomain.FromImage(domain.GetDurableImage());
        using HeapFile again = HeapFile.Open(image);
        using BufferedDurableHeap recovered = BufferedDurableHeap.Open(again, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
        bool durable = new PersistentHashMap<int, int>(recovered, typeId: 1).TryGetValue(2, out int value) && value == 20;
        Assert.True(durable != control, control
            ? "INCONCLUSIVE: the broken control (undrained exited threads forgotten) kept the write durable"
            : "the exited thread's write, which Sync reported durable, is not in the durable image");
    }

    /// <summary>
    /// One thread at a time replaces four values of four size classes (100 to 9000 bytes) and exits (the heap never holds
    /// more than <see cref="Keys"/> times four live values: about 200 KiB of a 2 MiB heap); the test thread advances the
    /// version between them.
    /// </summary>
    private static (Exception? Failure, int Completed, int Registered, int Caches, HeapStatistics Statistics) Churn(HeapFaults faults)
    {
        using var domain = new SimulatedPersistenceDomain(2L << 20);
        using HeapFile file = HeapFile.Create(domain, maxSize: 2L << 20);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, HeapFaults = faults });
        var map = new PersistentByteMap<int>(heap, typeId: 1);
        byte[][] values = [new byte[100], new byte[600], new byte[3000], new byte[9000]];
        int completed = 0;
        Exception? failure = null;
        for (int t = 0; t < Threads && failure is null; t++)
        {
            int key = t % Keys;
            var thread = new Thread(() =>
            {
                try
                {
                    for (int v = 0; v < values.Length; v++)
                    {
                        map.Set((key * values.Length) + v, values[v]);
                    }
                }
                catch (Exception e)
                {
                    failure = e;
                }
            });
            thread.Start();
            Assert.True(thread.Join(TimeSpan.FromSeconds(30)), "a churning thread did not finish");
            if (failure is null)
            {
                completed++;
                heap.AdvanceVersion(TimeSpan.FromSeconds(30));
            }
        }

        for (int i = 0; i < ThreadBuffers.Slots; i++)
        {
            heap.AdvanceVersion(TimeSpan.FromSeconds(30));
        }

        return (failure, completed, heap.RegisteredThreadsForTesting, heap.Heap.CacheCountForTesting, heap.Heap.GetStatistics());
    }
}
