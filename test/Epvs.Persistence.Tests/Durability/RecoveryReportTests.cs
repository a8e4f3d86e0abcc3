using System;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// What <see cref="DurableRecoveryReport"/>, <see cref="BufferedDurableHeap.DurableFrontier"/> and
/// <see cref="BufferedDurableHeap.SyncAsync"/> promise in their docs (found by an audit of every public promise): the
/// scanned count includes the blocks dropped beyond the frontier, a deletion counts as documented, a transient heap
/// claims no durability, a new file reports no rejected saved state, and a transient heap refuses SyncAsync whatever
/// its token.
/// </summary>
public sealed class RecoveryReportTests
{
    private static readonly BufferedDurableHeapOptions ManualStrict = new() { AdvancePeriod = Timeout.InfiniteTimeSpan, Mode = DurabilityMode.Strict };
    private static readonly BufferedDurableHeapOptions Manual = new() { AdvancePeriod = Timeout.InfiniteTimeSpan };
    private static readonly BufferedDurableHeapOptions ManualTransient = new() { AdvancePeriod = Timeout.InfiniteTimeSpan, Mode = DurabilityMode.Transient };

    [Fact]
    public void ScannedPayloads_CountsTheBlocksDroppedBeyondTheFrontier()
    {
        // It used to leave them out: DroppedBeyondFrontier was set only after the resolve that adds it in (the Tour printed
        // "2,409 found, ...; freed 6,386 newer than the cut").
        DurableRecoveryReport report = ReportAfterACrash(ManualStrict, heap =>
        {
            // Strict: each operation writes back and fences its payload, so the blocks are on the durable image while no
            // cycle has covered their version: a crash now drops them as beyond the frontier.
            for (int i = 0; i < 10; i++)
            {
                using DurableOperation op = heap.BeginOperation();
                op.GetPayload(op.Allocate(16, typeId: 7)).Fill((byte)i);
            }
        });
        Assert.Equal(10, report.DroppedBeyondFrontier);
        Assert.Equal(report.DroppedBeyondFrontier + report.Live + report.Superseded + report.Cancelled, report.ScannedPayloads);
    }

    [Fact]
    public void Deletion_CountsItsPayloadAsSuperseded_AndItsAntiPayloadAsCancelled()
    {
        DurableRecoveryReport report = ReportAfterACrash(Manual, heap =>
        {
            PayloadRef block;
            using (DurableOperation op = heap.BeginOperation())
            {
                block = op.Allocate(16, typeId: 7);
            }

            heap.Sync();
            using (DurableOperation op = heap.BeginOperation())
            {
                op.Delete(block);
            }

            heap.Sync();
        });
        Assert.True(report.ScannedPayloads == 2, "precondition: the payload and its anti-payload were both still in the file: " + report);
        Assert.Equal(0, report.Live);
        Assert.Equal(1, report.Superseded);
        Assert.Equal(1, report.Cancelled);
    }

    /// <summary>Runs <paramref name="work"/> on a simulated heap, crashes it (its durable image) and returns what the
    /// recovery of that image reports.</summary>
    private static DurableRecoveryReport ReportAfterACrash(BufferedDurableHeapOptions options, Action<BufferedDurableHeap> work)
    {
        byte[] image;
        using (var domain = new SimulatedPersistenceDomain(1 << 20, 8 << 20))
        {
            using HeapFile file = HeapFile.Create(domain);
            using (BufferedDurableHeap heap = BufferedDurableHeap.Open(file, options))
            {
                work(heap);
                image = domain.GetDurableImage();
            }
        }

        using var crashed = SimulatedPersistenceDomain.FromImage(image, 8 << 20);
        using HeapFile reopenedFile = HeapFile.Open(crashed);
        using BufferedDurableHeap reopened = BufferedDurableHeap.Open(reopenedFile, Manual);
        return reopened.Recovery;
    }

    [Fact]
    public void DurableFrontier_OfATransientHeap_ClaimsNothing()
    {
        using var dir = new TempDirectory();
        string path = dir.File("transient.heap");
        var files = new HeapFileOptions { Size = 1L << 20, Domain = PersistenceDomainKind.MappedFile };
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, files, ManualTransient))
        {
            var map = new PersistentHashMap<long, long>(heap, typeId: 1);
            map.Set(1, 1);
            Assert.Equal(0, heap.AdvanceVersion(TimeSpan.FromSeconds(30)));
            Assert.Equal(0, heap.AdvanceVersion(TimeSpan.FromSeconds(30)));
            Assert.Equal(0, heap.DurableFrontier); // it moved with every advance, while a reopen keeps nothing
            Assert.True(heap.CurrentVersion > 2);
        }

        using BufferedDurableHeap again = BufferedDurableHeap.Open(path, files, ManualTransient);
        Assert.Equal(0, new PersistentHashMap<long, long>(again, typeId: 1).Count);
    }

    [Fact]
    public void FastReopenRejection_IsNull_AtTheFirstOpenOfANewFile_AndSaysWhy_AfterACleanShutdownThatSavedNothing()
    {
        using var dir = new TempDirectory();
        string path = dir.File("new.heap");
        var files = new HeapFileOptions { Size = 1L << 20, Domain = PersistenceDomainKind.MappedFile };
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, files, Manual))
        {
            // It said "the last shutdown saved no state" for a file no heap had ever shut down.
            Assert.Null(heap.Recovery.FastReopenRejection);
            Assert.False(heap.Recovery.FastReopen);
        }

        using (BufferedDurableHeap heap = BufferedDurableHeap.Open(path, files, Manual))
        {
            Assert.True(heap.Recovery.FastReopen, heap.Recovery.FastReopenRejection);
            Assert.Null(heap.Recovery.FastReopenRejection);
        }
    }

    [Fact]
    public void SyncAsync_OnATransientHeap_IsRefused_EvenWithACanceledToken()
    {
        using var dir = new TempDirectory();
        using BufferedDurableHeap heap = BufferedDurableHeap.Create(dir.File("t.heap"), new HeapFileOptions { Size = 1L << 20 }, ManualTransient);
        using var canceled = new CancellationTokenSource();
        canceled.Cancel();
        Assert.Throws<InvalidOperationException>(() => { _ = heap.SyncAsync(); }); // thrown by the call, not the task
        Assert.Throws<InvalidOperationException>(() => { _ = heap.SyncAsync(canceled.Token); }); // it gave a canceled task
    }
}
