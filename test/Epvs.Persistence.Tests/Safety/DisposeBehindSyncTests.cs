using System;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// Dispose while another thread's <c>Sync(Timeout.InfiniteTimeSpan)</c> holds the cycle gate, waiting for an operation
/// that does not end: Dispose used to wait behind that Sync for as long as the operation lasted (for ever, if it never
/// ends), although it promises to close the heap within its <see cref="BufferedDurableHeapOptions.SyncTimeout"/>. Now
/// the Sync gives up its wait when Dispose begins (<see cref="ObjectDisposedException"/>), Dispose takes the version
/// over, times out on the operation and closes the heap (the mapping quarantined, <see cref="TimeoutException"/>) while
/// the operation is still open; the Sync's outcome is Dispose's: it returns normally when Dispose's last advance made its
/// version durable, and throws <see cref="ObjectDisposedException"/> when it could not. The order is fixed by hooks, not
/// timing: the operation stays open until the test ends it.
/// </summary>
public sealed class DisposeBehindSyncTests
{
    private static readonly HeapFileOptions Small = new() { Size = 4L << 20, Domain = PersistenceDomainKind.MappedFile };

    [Fact]
    public void Dispose_WhileASyncWithAnInfiniteTimeoutWaitsForAnOperationThatDoesNotEnd_ClosesTheHeapWithinItsOwnTimeout()
    {
        using var dir = new TempDirectory();
        Outcome real = DisposeBehindAnInfiniteSync(dir.File("real.heap"), DurabilityFaults.None, TimeSpan.FromSeconds(10));
        Assert.True(real.DisposeReturnedWhileTheOperationWasOpen, "Dispose waited behind the Sync for the operation to end");
        Assert.IsType<TimeoutException>(real.DisposeFailure);
        Assert.IsType<ObjectDisposedException>(real.SyncFailure);

        // Reopened: the frontier prefix (the value set before the operation began was made durable by the first Sync).
        using BufferedDurableHeap reopened = BufferedDurableHeap.Open(dir.File("real.heap"), Small);
        Assert.Equal(10, new PersistentHashMap<int, int>(reopened, TypeId).TryGetValue(1, out int value) ? value : -1);
    }

    /// <summary>
    /// The operation ends while Dispose's last advance waits for it: Dispose makes the version durable, and the Sync that
    /// gave its wait up to Dispose returns normally (it used to fail at once, although its operations became durable).
    /// </summary>
    [Fact]
    public void ASyncOvertakenByDispose_WhoseVersionDisposeMakesDurable_ReturnsNormally()
    {
        using var dir = new TempDirectory();
        Outcome outcome = DisposeBehindAnInfiniteSync(dir.File("ends.heap"), DurabilityFaults.None, Workers.JoinTimeout, endTheOperationInDisposesWait: true);
        Assert.True(outcome.DisposeReturnedWhileTheOperationWasOpen); // the operation ended inside Dispose's wait, before it returned
        Assert.Null(outcome.DisposeFailure);
        Assert.Null(outcome.SyncFailure);
        using (BufferedDurableHeap reopened = BufferedDurableHeap.Open(dir.File("ends.heap"), Small))
        {
            Assert.Equal(20, new PersistentHashMap<int, int>(reopened, TypeId).TryGetValue(2, out int value) ? value : -1);
        }

        // The control fails the Sync at once, although its operations became durable.
        Outcome control = DisposeBehindAnInfiniteSync(dir.File("ends-control.heap"), DurabilityFaults.SyncFailsWhenDisposeOvertakesIt, Workers.JoinTimeout, endTheOperationInDisposesWait: true);
        Assert.Null(control.DisposeFailure);
        Assert.IsType<ObjectDisposedException>(control.SyncFailure);
    }

    /// <summary>The control keeps the Sync waiting through Dispose: Dispose does not return while the operation is open (checked for a few seconds; it cannot return before the test ends the operation).</summary>
    [Fact]
    public void Control_ASyncThatKeepsWaitingThroughDispose_HoldsDisposeUntilTheOperationEnds()
    {
        using var dir = new TempDirectory();
        Outcome control = DisposeBehindAnInfiniteSync(dir.File("control.heap"), DurabilityFaults.SyncWaitsThroughDispose, TimeSpan.FromSeconds(3));
        Assert.False(control.DisposeReturnedWhileTheOperationWasOpen, "INCONCLUSIVE: the control's Dispose returned while the operation was open");
        Assert.Null(control.SyncFailure);
    }

    private const int TypeId = 1;

    private sealed record Outcome(bool DisposeReturnedWhileTheOperationWasOpen, Exception? DisposeFailure, Exception? SyncFailure);

    /// <summary>
    /// Opens an operation (which sets key 2) and keeps it open; a Sync with an infinite timeout waits for it; then
    /// Dispose runs. Returns whether Dispose returned within <paramref name="watch"/> (before the test ended the operation,
    /// unless <paramref name="endTheOperationInDisposesWait"/>: then the operation ends as Dispose's own last advance
    /// begins to wait for it), and what Dispose and the Sync threw.
    /// </summary>
    private static Outcome DisposeBehindAnInfiniteSync(string path, DurabilityFaults faults, TimeSpan watch, bool endTheOperationInDisposesWait = false)
    {
        TimeSpan syncTimeout = endTheOperationInDisposesWait ? Workers.JoinTimeout : TimeSpan.FromMilliseconds(500);
        var options = new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, SyncTimeout = syncTimeout, Faults = faults };
        BufferedDurableHeap heap = BufferedDurableHeap.Create(path, Small, options);
        var map = new PersistentHashMap<int, int>(heap, TypeId);
        map.Set(1, 10);
        heap.Sync();

        using var opened = new ManualResetEventSlim();
        using var release = new ManualResetEventSlim();
        using var syncWaits = new ManualResetEventSlim();
        using var disposed = new ManualResetEventSlim();
        var operation = new Thread(() =>
        {
            using (heap.BeginOperation())
            {
                map.Set(2, 20); // nested: in the open operation's version
                opened.Set();
                release.Wait(Workers.JoinTimeout);
            }
        })
        { IsBackground = true };
        operation.Start();
        Assert.True(opened.Wait(Workers.JoinTimeout));

        heap.WaitingForTheCutForTesting = syncWaits.Set;
        Exception? syncFailure = null;
        var sync = new Thread(() => syncFailure = Record.Exception(() => heap.Sync(Timeout.InfiniteTimeSpan))) { IsBackground = true };
        sync.Start();
        Assert.True(syncWaits.Wait(Workers.JoinTimeout));

        Exception? disposeFailure = null;
        Thread? disposer = null;
        heap.WaitingForTheCutForTesting = () =>
        {
            syncWaits.Set();
            if (endTheOperationInDisposesWait && Thread.CurrentThread == disposer)
            {
                release.Set();
            }
        };
        disposer = new Thread(() =>
        {
            disposeFailure = Record.Exception(heap.Dispose);
            disposed.Set();
        })
        { IsBackground = true };
        disposer.Start();
        bool returnedWhileOpen = disposed.Wait(watch);

        release.Set();
        Assert.True(operation.Join(Workers.JoinTimeout));
        Assert.True(sync.Join(Workers.JoinTimeout));
        Assert.True(disposer.Join(Workers.JoinTimeout));
        return new Outcome(returnedWhileOpen, disposeFailure, syncFailure);
    }
}
