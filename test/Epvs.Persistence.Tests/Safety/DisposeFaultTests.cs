using System;
using System.Collections.Generic;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// A failure inside a BufferedDurableHeap's Dispose after its last advance (an allocation there: failing the SyncAsync
/// waiters, the timeout's exception; a hook that throws stands for it) skipped the closing of the heap and the file: the
/// file stayed mapped and locked for the life of the process, every later open failed as AlreadyOpen, and a later Dispose
/// did nothing. Now the file is closed whatever fails there.
/// </summary>
public sealed class DisposeFaultTests
{
    private static readonly HeapFileOptions Small = new() { Size = 4L << 20, Domain = PersistenceDomainKind.MappedFile };

    [Fact]
    public void BufferedDurableHeap_AFailureAfterTheLastAdvance_StillClosesTheFile()
    {
        using var dir = new TempDirectory();
        string path = dir.File("dispose-fault.heap");
        var options = new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan };
        BufferedDurableHeap heap = BufferedDurableHeap.Create(path, Small, options);
        new PersistentHashMap<int, int>(heap, typeId: 1).Set(1, 10);
        heap.AfterDisposeClosedCyclesForTesting = () => throw new OutOfMemoryException("simulated: an allocation after the last advance");

        Assert.Throws<OutOfMemoryException>(heap.Dispose);
        heap.Dispose(); // done: does nothing

        // The last advance made the write durable; the file was closed (quarantined: the wait for operations never ran, so
        // it is not known to have drained), without a clean-shutdown mark.
        using BufferedDurableHeap reopened = BufferedDurableHeap.Open(path, Small, options);
        Assert.False(reopened.Heap.File.WasCleanShutdown);
        Assert.Equal(new Dictionary<int, int> { [1] = 10 }, new PersistentHashMap<int, int>(reopened, typeId: 1).ToDictionary());
    }
    /// <summary>The same for a HeapFile: its wait for the calls in flight allocates (a task) before the unmapping, and a
    /// failure there skipped it and the release of the lock.</summary>
    [Fact]
    public void HeapFile_AFailureInTheWaitForCalls_StillReleasesTheFile()
    {
        using var dir = new TempDirectory();
        string path = dir.File("wait-fault.heap");
        HeapFile file = HeapFile.Create(path, Small);
        file.SetRoot(0, 42);
        file.BeforeOperationWaitForTesting = () => throw new OutOfMemoryException("simulated: the wait's task");

        Assert.Throws<OutOfMemoryException>(file.Dispose);
        file.Dispose(); // done: does nothing

        // Quarantined (the calls were not known to have drained): no clean-shutdown mark, the root persisted before.
        using HeapFile reopened = HeapFile.Open(path, Small);
        Assert.False(reopened.WasCleanShutdown);
        Assert.Equal(42, reopened.GetRoot(0));
    }
    /// <summary>A failure while Dispose stops the advancer (before its last advance) escaped with the file mapped and
    /// locked; now it is the Dispose's failure, reported like a failed last advance, and the file is closed.</summary>
    [Fact]
    public void BufferedDurableHeap_AFailureStoppingTheAdvancer_StillClosesTheFile()
    {
        using var dir = new TempDirectory();
        string path = dir.File("stop-fault.heap");
        var options = new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan };
        BufferedDurableHeap heap = BufferedDurableHeap.Create(path, Small, options);
        var map = new PersistentHashMap<int, int>(heap, typeId: 1);
        map.Set(1, 10);
        heap.Sync();
        map.Set(2, 20);
        heap.StoppingAdvancerForTesting = () => throw new OutOfMemoryException("simulated: stopping the advancer");

        InvalidOperationException failed = Assert.Throws<InvalidOperationException>(heap.Dispose);
        Assert.Contains("not made durable", failed.Message, StringComparison.Ordinal);
        Assert.IsType<OutOfMemoryException>(failed.InnerException);

        using BufferedDurableHeap reopened = BufferedDurableHeap.Open(path, Small, options);
        Assert.False(reopened.Heap.File.WasCleanShutdown);
        Assert.Equal(new Dictionary<int, int> { [1] = 10 }, new PersistentHashMap<int, int>(reopened, typeId: 1).ToDictionary());
    }

    /// <summary>
    /// A Dispose that stops the advancer between SyncAsync's disposed check and its wake of the advancer: the wake threw
    /// the advancer's event's ObjectDisposedException (naming a wait handle) although Dispose's last advance had made
    /// the operations durable. Now the call returns a completed task (or reports the heap as disposed).
    /// </summary>
    [Fact]
    public void SyncAsync_RacingADispose_ReportsTheHeap_NotItsWakeEvent()
    {
        using var dir = new TempDirectory();
        BufferedDurableHeap heap = BufferedDurableHeap.Create(dir.File("sync-dispose.heap"), Small, new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromHours(1) });
        new PersistentHashMap<int, int>(heap, typeId: 1).Set(1, 10);
        heap.SyncAsyncWakingForTesting = () =>
        {
            heap.SyncAsyncWakingForTesting = null;
            heap.Dispose();
        };

        System.Threading.Tasks.Task? sync = null;
        Exception? failure = Record.Exception(() => { sync = heap.SyncAsync(); });

        Assert.Null(failure);
        Assert.True(sync!.IsCompletedSuccessfully, $"SyncAsync's task is {sync.Status}");
    }

    [Fact]
    public void ASyncAsyncWhoseTargetTheLastAdvanceMovedPast_Completes()
    {
        Assert.Null(SyncAsyncReadingItsTargetAfterDisposesLastAdvance(control: false));
    }

    [Fact]
    public void FailingEveryWaiterTheLastAdvanceLeft_IsCaught()
    {
        Assert.IsType<ObjectDisposedException>(SyncAsyncReadingItsTargetAfterDisposesLastAdvance(control: true));
    }

    /// <summary>
    /// A probe's note (1 in 660,000 tasks racing Dispose): a SyncAsync that began before a Dispose and read its target
    /// after Dispose's last advance had moved the version waited for the version above the one that advance made durable,
    /// and Dispose failed its task with ObjectDisposedException, as if its operations were lost; they were durable (every
    /// operation it covers completed before it, so before the Dispose, in a version that advance wrote back). Now
    /// Dispose completes the waiters its last advance left. Returns what the task ended with (null: completed), after
    /// checking that the operation is durable either way. The control fails them as before.
    /// </summary>
    private static Exception? SyncAsyncReadingItsTargetAfterDisposesLastAdvance(bool control)
    {
        TimeSpan wait = TimeSpan.FromSeconds(30);
        using var dir = new TempDirectory();
        string path = dir.File($"sync-target-{control}.heap");
        BufferedDurableHeap heap = BufferedDurableHeap.Create(path, Small, new BufferedDurableHeapOptions
        {
            AdvancePeriod = TimeSpan.FromHours(1),
            Faults = control ? DurabilityFaults.DisposeFailsCoveredWaiters : DurabilityFaults.None,
        });
        new PersistentHashMap<int, int>(heap, typeId: 1).Set(1, 10);
        using var passedItsCheck = new ManualResetEventSlim();
        using var lastAdvanceDone = new ManualResetEventSlim();
        using var registered = new ManualResetEventSlim();
        heap.SyncAsyncCheckedForTesting = () =>
        {
            passedItsCheck.Set();
            Assert.True(lastAdvanceDone.Wait(wait));
        };
        heap.AfterDisposeClosedCyclesForTesting = () =>
        {
            lastAdvanceDone.Set();
            Assert.True(registered.Wait(wait));
        };
        heap.SyncAsyncWakingForTesting = registered.Set;
        System.Threading.Tasks.Task? sync = null;
        Exception? failure = null;
        var caller = new Thread(() => failure = Record.Exception(() => { sync = heap.SyncAsync(); })) { IsBackground = true };
        caller.Start();
        Assert.True(passedItsCheck.Wait(wait));

        heap.Dispose();

        Assert.True(caller.Join(wait));
        Assert.Null(failure);
        Exception? outcome = Record.Exception(() => sync!.Wait(wait));
        using BufferedDurableHeap reopened = BufferedDurableHeap.Open(path, Small, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
        Assert.Equal(new Dictionary<int, int> { [1] = 10 }, new PersistentHashMap<int, int>(reopened, typeId: 1).ToDictionary());
        return outcome is AggregateException { InnerException: { } inner } ? inner : outcome;
    }
}
