using System;
using System.Collections.Generic;
using System.Threading;
using System.Threading.Tasks;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// A probe's finding: the public calls of a <see cref="PersistenceDomain"/> (WriteBack, Fence, Persist, TryGrow) checked
/// for Dispose once, before they touched the memory, and nothing made a Dispose wait for them: a call racing Dispose
/// worked on memory that was freed (simulated domain: "malloc(): unsorted double linked list corrupted", SIGSEGV) or
/// unmapped (libpmem: a cache flush of an unmapped address, SIGSEGV; through msync an IOException instead of
/// ObjectDisposedException). The heap file's own calls were drained before the unmap; the domain's were not. A Dispose
/// (or quarantine) now waits for the public calls in flight, and later ones throw ObjectDisposedException.
/// </summary>
public sealed class DomainCallsRacingDisposeTests
{
    private static readonly TimeSpan Bound = TimeSpan.FromSeconds(30);
    private readonly ITestOutputHelper _output;

    public DomainCallsRacingDisposeTests(ITestOutputHelper output) => _output = output;

    [Fact]
    public void ACallInFlight_WhenDisposeBegins_CompletesOnLiveMemory_AndDisposeWaitsForIt()
    {
        (Exception? callFailure, bool disposeWaited) = CallParkedWhileDisposeRuns(skipDrain: false);
        Assert.Null(callFailure);
        Assert.True(disposeWaited, "the Dispose did not find the call in flight");
    }

    [Fact]
    public void ADisposeThatDoesNotWaitForCalls_IsCaught_Control()
    {
        // The control: without the drain, the Dispose frees the images while the call is inside; the simulated domain's
        // check under its gate turns what would be a use after free into ObjectDisposedException.
        (Exception? callFailure, bool disposeWaited) = CallParkedWhileDisposeRuns(skipDrain: true);
        _output.WriteLine($"control: {callFailure?.GetType().Name}: {callFailure?.Message}");
        Assert.False(disposeWaited);
        Assert.IsType<ObjectDisposedException>(callFailure);
    }

    [Fact]
    public void CallsAfterDispose_ThrowObjectDisposed()
    {
        var domain = new SimulatedPersistenceDomain(64L << 10);
        domain.Dispose();
        Assert.Throws<ObjectDisposedException>(() => domain.WriteBack(0, 64));
        Assert.Throws<ObjectDisposedException>(domain.Fence);
        Assert.Throws<ObjectDisposedException>(() => domain.Persist(0, 64));
        Assert.Throws<ObjectDisposedException>(() => domain.TryGrow(128L << 10));
    }

    /// <summary>
    /// A Persist parks inside the domain (counted in, the disposed flag checked) until the Dispose on another thread has
    /// either found it and begun to wait for it, or returned; then it goes on. Returns the call's exception, if any, and
    /// whether the Dispose waited.
    /// </summary>
    private static (Exception? CallFailure, bool DisposeWaited) CallParkedWhileDisposeRuns(bool skipDrain)
    {
        var domain = new SimulatedPersistenceDomain(64L << 10);
        using var parked = new ManualResetEventSlim();
        using var disposeWaitingOrDone = new ManualResetEventSlim();
        bool disposeWaited = false;
        int first = 0;
        domain.InsideCallForTesting = () =>
        {
            if (Interlocked.Exchange(ref first, 1) == 0)
            {
                parked.Set();
                Assert.True(disposeWaitingOrDone.Wait(Bound), "the Dispose neither waited for the call nor returned");
            }
        };
        domain.WaitingForCallsForTesting = () =>
        {
            disposeWaited = true;
            disposeWaitingOrDone.Set();
        };

        PersistenceDomain.SkipCallDrainForTesting = skipDrain;
        try
        {
            Task<Exception?> call = Task.Run(() => Record.Exception(() => domain.Persist(0, 4096)));
            Assert.True(parked.Wait(Bound), "the call never entered");
            Task dispose = Task.Run(() =>
            {
                domain.Dispose();
                disposeWaitingOrDone.Set();
            });
            Assert.True(call.Wait(Bound), "the call never returned");
            Assert.True(dispose.Wait(Bound), "the Dispose never returned");
            return (call.Result, disposeWaited);
        }
        finally
        {
            PersistenceDomain.SkipCallDrainForTesting = false;
        }
    }

    [Fact]
    public void SimulatedDomain_WriteBackFencePersist_RacingDispose_NeverCrash()
    {
        (int code, string output) = TestProgram.RunChild(new Dictionary<string, string>(), ArgumentsChild.Role, "sim-calls-racing-dispose", "-");
        _output.WriteLine(output);
        Assert.True(code == 0, $"exit {code}: {output}");
    }

    [Fact]
    public void PmemDomain_PersistRacingTheHeapsDispose_NeverCrashes_AndThrowsObjectDisposed()
    {
        using var dir = new TempDirectory();
        (int code, string output) = TestProgram.RunChild(new Dictionary<string, string> { ["PMEM_IS_PMEM_FORCE"] = "1" }, ArgumentsChild.Role, "domain-persist-racing-heap-dispose", dir.File("d.heap"));
        _output.WriteLine(output);
        Assert.SkipWhen(output.Contains("persistent memory: False", StringComparison.Ordinal) || output.Contains("DomainUnavailable", StringComparison.Ordinal), "libpmem is not available here");
        Assert.True(code == 0, $"exit {code}: {output}");
    }

    /// <summary>The README: calls after Dispose throw ObjectDisposedException. TakeRecoveredPayloads returned the list (and claimed the type id).</summary>
    [Fact]
    public void TakeRecoveredPayloads_AfterDispose_ThrowsObjectDisposed()
    {
        using var dir = new TempDirectory();
        string path = dir.File("t.heap");
        var options = new HeapFileOptions { Size = 4L << 20, Domain = PersistenceDomainKind.MappedFile };
        using (BufferedDurableHeap created = BufferedDurableHeap.Create(path, options))
        {
            using DurableOperation op = created.BeginOperation();
            op.Allocate(16, typeId: 7);
        }

        BufferedDurableHeap heap = BufferedDurableHeap.Open(path, options);
        heap.Dispose();
        Assert.Throws<ObjectDisposedException>(() => heap.TakeRecoveredPayloads(7));
    }
}
