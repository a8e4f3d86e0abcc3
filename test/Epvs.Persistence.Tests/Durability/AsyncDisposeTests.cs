using System;
using System.Threading;
using System.Threading.Tasks;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// <c>DisposeAsync</c> of <see cref="BufferedDurableHeap"/>, <see cref="HeapFile"/> and <see cref="PersistentHeap"/>: the
/// caller is not blocked by Dispose's waits (for the operations and calls in flight, the last write-back and fence), the
/// refusals that depend on the calling thread are still made on it, and a call that Dispose must handle on the calling
/// thread (inside an operation of the heap) is handled there. Each guarantee has a broken control: a DisposeAsync that
/// runs all of Dispose on the caller, or that makes its refusals on the pool's thread.
/// </summary>
[Collection(nameof(AsyncDisposeTests))]
public sealed class AsyncDisposeTests
{
    private static readonly HeapFileOptions Mapped = new() { Size = 4L << 20, Domain = PersistenceDomainKind.MappedFile };

    [Fact]
    public async Task AwaitUsing_ClosesTheHeapClean_AndItReopensFromItsSavedState()
    {
        using var dir = new TempDirectory();
        string path = dir.File("clean.heap");
        await using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, Mapped, new BufferedDurableHeapOptions()))
        {
            new PersistentHashMap<long, long>(heap, typeId: 1).Set(7, 70);
        }

        await using BufferedDurableHeap reopened = BufferedDurableHeap.Open(path, new HeapFileOptions { Domain = PersistenceDomainKind.MappedFile }, new BufferedDurableHeapOptions());
        Assert.True(reopened.Heap.OpenedFromSavedState, $"the reopen rescanned (no clean shutdown): {reopened.Heap.SavedStateRejection}");
        Assert.True(new PersistentHashMap<long, long>(reopened, typeId: 1).TryGetValue(7, out long value) && value == 70, "the value written before DisposeAsync is missing");
    }

    [Fact]
    public async Task RawHeapAndFile_AwaitUsing_CloseClean()
    {
        using var dir = new TempDirectory();
        string path = dir.File("raw.heap");
        await using (PersistentHeap heap = PersistentHeap.Create(path, Mapped))
        {
            PayloadRef block = heap.Allocate(100, typeId: 1);
            heap.GetPayload(block).Fill(9);
            heap.Persist(block);
        }

        await using (HeapFile file = HeapFile.Open(path, new HeapFileOptions { Domain = PersistenceDomainKind.MappedFile }))
        {
            Assert.True(file.WasCleanShutdown, "the raw heap's DisposeAsync did not close the file clean");
        }

        await using PersistentHeap reopened = PersistentHeap.Open(path, new HeapFileOptions { Domain = PersistenceDomainKind.MappedFile });
        int blocks = 0;
        reopened.ForEachAllocated((b, _) => blocks += reopened.GetPayload(b)[0] == 9 ? 1 : 0);
        Assert.Equal(1, blocks);
    }

    [Fact]
    public async Task BufferedHeap_DisposeAsyncWhileAnotherThreadIsInsideAnOperation_ReturnsAtOnce_AndClosesOnceItEnds()
    {
        (bool returnedAtOnce, Exception? outcome, bool closed) = await DisposeWithAnOperationInFlight(control: false);
        Assert.True(returnedAtOnce, "DisposeAsync blocked its caller until the other thread's operation ended");
        Assert.Null(outcome);
        Assert.True(closed, "the heap was not closed once the operation ended");

        // The control runs Dispose on the caller, which waits for the operation (ended only after the call returns) until
        // the heap's SyncTimeout, then closes the heap without it.
        (bool controlReturnedAtOnce, Exception? controlOutcome, _) = await DisposeWithAnOperationInFlight(control: true);
        Assert.SkipWhen(controlReturnedAtOnce, $"INCONCLUSIVE: the control (Dispose on the caller) returned at once: {controlOutcome}");
    }

    [Fact]
    public async Task RawHeap_DisposeAsyncWhileAVisitorRunsOnAnotherThread_ReturnsAtOnce_AndClosesOnceItReturns()
    {
        (bool returnedAtOnce, Exception? outcome) = await DisposeWithAVisitorInFlight(control: false);
        Assert.True(returnedAtOnce, "DisposeAsync blocked its caller until the other thread's call returned");
        Assert.Null(outcome);

        (bool controlReturnedAtOnce, Exception? controlOutcome) = await DisposeWithAVisitorInFlight(control: true);
        Assert.SkipWhen(controlReturnedAtOnce, $"INCONCLUSIVE: the control (Dispose on the caller) returned at once: {controlOutcome}");
    }

    [Fact]
    public void RawHeap_DisposeAsyncInsideItsOwnVisitor_IsRefusedOnTheCallingThread_AndNothingIsDisposed()
    {
        Assert.Null(DisposeInsideOwnVisitor(control: false));

        // The control makes the refusals on the pool's thread, which is inside no call: its Dispose waits for the visitor's
        // call to return and then closes the heap the caller goes on using.
        string? control = DisposeInsideOwnVisitor(control: true);
        Assert.SkipWhen(control is null, "INCONCLUSIVE: the control (refusals on the pool's thread) was refused at once too");
    }

    [Fact]
    public void DisposeAsyncFromACallbackInsideADisposeOfTheSameHeap_FailsAtOnce_AsDisposeDoes()
    {
        // On a pool thread it would wait for the Dispose it is called from; on the disposing thread Dispose refuses.
        using var dir = new TempDirectory();
        PersistentHeap heap = PersistentHeap.Create(dir.File("callback.heap"), Mapped);
        ValueTask inner = default;
        heap.DisposalForTesting.BeganHookForTesting = () => inner = heap.DisposeAsync();
        heap.Dispose();
        Assert.True(inner.IsCompleted, "DisposeAsync from inside the Dispose did not complete at once");
        Assert.True(inner.IsFaulted && inner.AsTask().Exception!.InnerException is InvalidOperationException, $"DisposeAsync from inside the Dispose ended {inner.AsTask().Status}");
    }

    [Fact]
    public async Task BufferedHeap_DisposeAsyncInsideItsOwnOperation_RunsOnTheCallingThread_AsDisposeDoes()
    {
        using var dir = new TempDirectory();
        BufferedDurableHeap heap = BufferedDurableHeap.Create(dir.File("inside.heap"), Mapped, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
        DurableOperation op = heap.BeginOperation();
        ValueTask disposal = heap.DisposeAsync();

        // On a pool thread, Dispose would wait for this operation (which ends only below) until the SyncTimeout.
        Assert.True(disposal.IsCompleted, "DisposeAsync inside the caller's own operation did not complete on the calling thread");
        try
        {
            op.Dispose(); // the heap is closed: the operation's end reports it or not, either way nothing is left open
        }
        catch (ObjectDisposedException)
        {
        }

        InvalidOperationException e = await Assert.ThrowsAsync<InvalidOperationException>(async () => await disposal);
        Assert.Contains("Dispose was called inside an operation", e.Message, StringComparison.Ordinal);
        Assert.Throws<ObjectDisposedException>(() => heap.BeginOperation());
    }

    /// <summary>
    /// A thread parks inside an operation; DisposeAsync is called; only then is the thread released. Returns whether the call
    /// returned before the release, what the task ended with, and whether the heap was closed afterwards.
    /// </summary>
    private static async Task<(bool ReturnedAtOnce, Exception? Outcome, bool Closed)> DisposeWithAnOperationInFlight(bool control)
    {
        using var dir = new TempDirectory();
        var options = new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromMilliseconds(10), SyncTimeout = control ? TimeSpan.FromSeconds(2) : TimeSpan.FromSeconds(60) };
        BufferedDurableHeap heap = BufferedDurableHeap.Create(dir.File(control ? "control.heap" : "heap.heap"), Mapped, options);
        heap.DisposeAsyncOnTheCallerForTesting = control;
        using var inside = new ManualResetEventSlim();
        using var release = new ManualResetEventSlim();
        var parked = new Thread(() =>
        {
            try
            {
                using DurableOperation op = heap.BeginOperation();
                inside.Set();
                release.Wait();
            }
            catch (ObjectDisposedException)
            {
                // (The control closed the heap under the operation: its end may report it.)
            }
        })
        { IsBackground = true };
        parked.Start();
        inside.Wait();

        (bool returnedAtOnce, Exception? outcome) = await DisposeThenRelease(heap.DisposeAsync, release, parked);

        bool closed;
        try
        {
            heap.BeginOperation().Dispose();
            closed = false;
        }
        catch (ObjectDisposedException)
        {
            closed = true;
        }

        return (returnedAtOnce, outcome, closed);
    }

    /// <summary>As <see cref="DisposeWithAnOperationInFlight"/>, for a raw heap with a thread inside its <see cref="PersistentHeap.ForEachAllocated"/>.</summary>
    private static async Task<(bool ReturnedAtOnce, Exception? Outcome)> DisposeWithAVisitorInFlight(bool control)
    {
        using var dir = new TempDirectory();
        PersistentHeap heap = PersistentHeap.Create(dir.File(control ? "control.heap" : "heap.heap"), Mapped);
        heap.Allocate(100, typeId: 1);
        heap.DisposeAsyncOnTheCallerForTesting = control;
        if (control)
        {
            // The control's Dispose, on the caller, waits for the visitor's call (released only after it returns): a short wait.
            HeapFile.DisposeWait = TimeSpan.FromSeconds(2);
        }

        using var inside = new ManualResetEventSlim();
        using var release = new ManualResetEventSlim();
        var visiting = new Thread(() =>
        {
            try
            {
                heap.ForEachAllocated((_, _) =>
                {
                    inside.Set();
                    release.Wait();
                });
            }
            catch (ObjectDisposedException)
            {
            }
        })
        { IsBackground = true };
        try
        {
            visiting.Start();
            inside.Wait();
            (bool returnedAtOnce, Exception? outcome) = await DisposeThenRelease(heap.DisposeAsync, release, visiting);

            Assert.Throws<ObjectDisposedException>(() => heap.Allocate(100, typeId: 1));
            return (returnedAtOnce, outcome);
        }
        finally
        {
            HeapFile.DisposeWait = TimeSpan.FromSeconds(30);
        }
    }

    /// <summary>
    /// Calls <paramref name="disposeAsync"/> while <paramref name="holder"/> is parked inside the heap, and only then
    /// releases it. Returns whether the call returned before the release, and what its task ended with.
    /// </summary>
    private static async Task<(bool ReturnedAtOnce, Exception? Outcome)> DisposeThenRelease(Func<ValueTask> disposeAsync, ManualResetEventSlim release, Thread holder)
    {
        ValueTask disposal = disposeAsync();
        bool returnedAtOnce = !disposal.IsCompleted;
        release.Set();
        Assert.True(holder.Join(TimeSpan.FromSeconds(60)), "the thread inside the heap did not leave it");
        try
        {
            await disposal;
            return (returnedAtOnce, null);
        }
        catch (Exception e)
        {
            return (returnedAtOnce, e);
        }
    }

    /// <summary>
    /// DisposeAsync called from a <see cref="PersistentHeap.ForEachAllocated"/> visitor of the same heap, on the scanning
    /// thread. Returns null when it was refused at once and the heap stays usable; else what happened.
    /// </summary>
    private static string? DisposeInsideOwnVisitor(bool control)
    {
        using var dir = new TempDirectory();
        using PersistentHeap heap = PersistentHeap.Create(dir.File(control ? "control.heap" : "heap.heap"), Mapped);
        heap.Allocate(100, typeId: 1);
        heap.DisposeAsyncRefusesOnThePoolForTesting = control;
        ValueTask disposal = default;
        int threadId = Environment.CurrentManagedThreadId;
        heap.ForEachAllocated((_, _) =>
        {
            Assert.Equal(threadId, Environment.CurrentManagedThreadId);
            disposal = heap.DisposeAsync();
        });

        if (!disposal.IsCompleted)
        {
            disposal.AsTask().Wait(TimeSpan.FromSeconds(60));
            return $"DisposeAsync was not refused at once ({disposal.AsTask().Status})";
        }

        if (!disposal.IsFaulted || disposal.AsTask().Exception!.InnerException is not InvalidOperationException)
        {
            return $"DisposeAsync inside the visitor ended {disposal.AsTask().Status}";
        }

        // Nothing was disposed: the heap goes on working.
        heap.Allocate(100, typeId: 1);
        return null;
    }
}
