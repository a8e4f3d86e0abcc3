using System;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// A thread that exits inside an operation (a <see cref="DurableOperation"/> never disposed) stays inside the version
/// scheme's region for good, so the transition out of its version never completes and every operation that begins waits
/// for it. Such a writer used to wait for ever, also after the heap's Dispose (which cannot dispose a scheme with a thread
/// inside), and Sync's and Dispose's timeouts advised to "end its operation, or wait longer". Now the heap finds the
/// exited thread (a stalled transition's report, a Sync's timeout, Dispose), fails naming it, and ends the waits of
/// operations blocked in the scheme; Dispose ends them too. The file reopens to the durable prefix without the
/// unfinished operation. Found by an adversarial round (the heap's helper, session 15).
/// </summary>
public sealed class ExitedInsideOperationTests
{
    private const int TypeId = 1;
    private static readonly HeapFileOptions Small = new() { Size = 4L << 20, Domain = PersistenceDomainKind.MappedFile };

    /// <summary>Begins an operation on a thread that then exits without ending it (a missing <c>using</c>); writes a value in it.</summary>
    private static int LeaveAnOperationOpen(BufferedDurableHeap heap, PersistentHashMap<int, int> map)
    {
        int id = 0;
        var leaver = new Thread(() =>
        {
            id = Environment.CurrentManagedThreadId;
            DurableOperation operation = heap.BeginOperation();
            _ = operation.Version;
        });
        leaver.Start();
        leaver.Join();
        return id;
    }

    /// <summary>Once a transition is pending (it waits for the exited thread), starts <c>map.Set(2, 2)</c> on a thread,
    /// which waits for the transition; returns the thread and where its outcome goes.</summary>
    private static (Thread Writer, Func<Exception?> Failure) StartWriter(BufferedDurableHeap heap, PersistentHashMap<int, int> map)
    {
        Assert.True(SpinWait.SpinUntil(() => heap.VersionScheme.CurrentState.IsIntermediate, Workers.JoinTimeout), "no transition began");
        Exception? failure = null;
        var writer = new Thread(() => failure = Record.Exception(() => map.Set(2, 2))) { IsBackground = true };
        writer.Start();
        return (writer, () => failure);
    }

    [Fact]
    public void AWriterWaitingBehindIt_FailsNamingTheThread_WhenTheTransitionStalls()
    {
        using var dir = new TempDirectory();
        var heap = BufferedDurableHeap.Create(dir.File("stall.heap"), Small, new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromMilliseconds(5) });
        heap.VersionScheme.StallThreshold = TimeSpan.FromMilliseconds(50);
        var map = new PersistentHashMap<int, int>(heap, TypeId);
        map.Set(1, 1);
        heap.Sync();
        int leaver = LeaveAnOperationOpen(heap, map);

        // The advancer's next transition waits for the exited thread; the writer waits for the transition, and its wait
        // reports the stall (no Sync, no Dispose).
        (Thread writer, Func<Exception?> failure) = StartWriter(heap, map);
        Assert.True(writer.Join(Workers.JoinTimeout), "the writer still waits behind the exited thread's operation");
        InvalidOperationException e = Assert.IsType<InvalidOperationException>(failure());
        Assert.Contains($"Thread {leaver} exited inside an operation", e.Message);
        Assert.Throws<InvalidOperationException>(() => heap.Sync()); // failed: nothing more becomes durable

        // Closed at once (no wait for an operation that cannot end), the mapping quarantined under it.
        Assert.Contains("exited inside an operation", Assert.Throws<InvalidOperationException>(heap.Dispose).Message);

        using BufferedDurableHeap reopened = BufferedDurableHeap.Open(dir.File("stall.heap"), Small);
        var recovered = new PersistentHashMap<int, int>(reopened, TypeId);
        Assert.True(recovered.TryGetValue(1, out int one) && one == 1);
        Assert.False(recovered.TryGetValue(2, out _));
    }

    [Fact]
    public void Control_AHeapThatDoesNotLookForExitedThreads_LeavesTheWriterWaiting()
    {
        using var dir = new TempDirectory();
        var heap = BufferedDurableHeap.Create(dir.File("stall-control.heap"), Small, new BufferedDurableHeapOptions
        {
            AdvancePeriod = TimeSpan.FromMilliseconds(5),
            SyncTimeout = TimeSpan.FromMilliseconds(300), // Dispose's waits for the operation that never ends
            Faults = DurabilityFaults.IgnoreThreadsExitedInsideOperations,
        });
        heap.VersionScheme.StallThreshold = TimeSpan.FromMilliseconds(50);
        var map = new PersistentHashMap<int, int>(heap, TypeId);
        LeaveAnOperationOpen(heap, map);
        (Thread writer, Func<Exception?> failure) = StartWriter(heap, map);
        Assert.False(writer.Join(TimeSpan.FromSeconds(1)), "the control's writer did not wait (the check would not catch it)");
        Record.Exception(heap.Dispose); // ends the wait (the other fix): the writer finds the heap disposed
        Assert.True(writer.Join(Workers.JoinTimeout));
        Assert.IsType<ObjectDisposedException>(failure());
    }

    [Fact]
    public void ASyncThatTimesOut_SaysTheThreadExited_AndLaterOperationsFailAtOnce()
    {
        using var dir = new TempDirectory();
        var heap = BufferedDurableHeap.Create(dir.File("sync.heap"), Small, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, SyncTimeout = TimeSpan.FromMilliseconds(300) });
        var map = new PersistentHashMap<int, int>(heap, TypeId);
        map.Set(1, 1);
        int leaver = LeaveAnOperationOpen(heap, map);

        TimeoutException sync = Assert.Throws<TimeoutException>(() => heap.Sync());
        Assert.Contains($"Thread {leaver} exited inside an operation", sync.Message);
        Assert.DoesNotContain("wait longer", sync.Message);

        // The transition the Sync began is still pending behind the exited thread: a write fails instead of waiting for
        // it; reads (of the index in memory, outside the scheme) go on.
        Assert.Contains("exited inside an operation", Assert.Throws<InvalidOperationException>(() => map.Set(2, 2)).Message);
        Assert.True(map.TryGetValue(1, out int one) && one == 1);
        Assert.Contains("exited inside an operation", Assert.Throws<InvalidOperationException>(heap.Dispose).Message);
    }

    [Fact]
    public void Dispose_EndsTheWaitOfAWriterBlockedBehindIt()
    {
        using var dir = new TempDirectory();
        Exception? failure = DisposeWithAWriterBlocked(dir.File("dispose.heap"), DurabilityFaults.IgnoreThreadsExitedInsideOperations, out bool endedByDispose);
        Assert.True(endedByDispose, "the writer blocked behind the exited thread's operation still waited after Dispose returned");
        Assert.IsType<ObjectDisposedException>(failure);
    }

    [Fact]
    public void Control_ADisposeThatLeavesTheWaitsAlone_LeavesTheWriterWaiting()
    {
        using var dir = new TempDirectory();
        DisposeWithAWriterBlocked(dir.File("dispose-control.heap"), DurabilityFaults.IgnoreThreadsExitedInsideOperations | DurabilityFaults.OperationsWaitThroughRefusedEntry, out bool endedByDispose);
        Assert.False(endedByDispose, "the control's writer ended at Dispose (the check would not catch it)");
    }

    /// <summary>An exited thread's open operation, a transition begun behind it (a Sync that timed out), a writer
    /// waiting for the transition, then Dispose. Whether the writer ended within a bound after Dispose returned (the
    /// control's is then let go through a test hook, so that it does not spin until the test process ends).</summary>
    private static Exception? DisposeWithAWriterBlocked(string path, DurabilityFaults faults, out bool endedByDispose)
    {
        var heap = BufferedDurableHeap.Create(path, Small, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, SyncTimeout = TimeSpan.FromMilliseconds(300), Faults = faults });
        var map = new PersistentHashMap<int, int>(heap, TypeId);
        LeaveAnOperationOpen(heap, map);
        Assert.Throws<TimeoutException>(() => heap.Sync()); // begins the transition, which stays pending
        (Thread writer, Func<Exception?> failure) = StartWriter(heap, map);
        Assert.False(writer.Join(TimeSpan.FromMilliseconds(200)), "the writer did not wait for the transition");
        Assert.Throws<TimeoutException>(heap.Dispose);
        endedByDispose = writer.Join(faults.HasFlag(DurabilityFaults.OperationsWaitThroughRefusedEntry) ? TimeSpan.FromSeconds(1) : Workers.JoinTimeout);
        if (!endedByDispose)
        {
            heap.RefuseEntryForTesting();
            Assert.True(writer.Join(Workers.JoinTimeout));
        }

        return failure();
    }
}
