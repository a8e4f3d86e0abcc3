using System;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// A probe: a Dispose that could not wait for a thread inside an operation (SyncTimeout) quarantines the mapping —
/// replaces it with anonymous memory, so the straggler neither crashes nor writes to the file — and never unmapped it:
/// every such Dispose kept the whole reservation's address space (16 times the heap's size by default) for the life of
/// the process. The quarantined memory is now freed once the threads that were inside have left.
/// </summary>
public sealed class QuarantineReleaseTests
{
    [Theory]
    [InlineData(PersistenceDomainKind.MappedFile)]
    [InlineData(PersistenceDomainKind.Pmem)]
    public void ATimedOutDispose_FreesTheQuarantinedMapping_OnceTheStragglerLeaves(PersistenceDomainKind kind)
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "the quarantine replaces the mapping on Linux only");
        using var dir = new TempDirectory();
        var heap = BufferedDurableHeap.Create(dir.File("q.heap"), new HeapFileOptions { Size = 8L << 20, Domain = kind }, new BufferedDurableHeapOptions { SyncTimeout = TimeSpan.FromMilliseconds(50) });
        PersistenceDomain domain = heap.Heap.File.Domain;
        using var inside = new ManualResetEventSlim();
        using var leave = new ManualResetEventSlim();
        Exception? stragglerFailure = null;
        var straggler = new Thread(() =>
        {
            stragglerFailure = Record.Exception(() =>
            {
                DurableOperation op = heap.BeginOperation();
                inside.Set();
                leave.Wait(TimeSpan.FromSeconds(30));
                op.Dispose();
            });
        });
        straggler.Start();
        Assert.True(inside.Wait(TimeSpan.FromSeconds(30)));
        Assert.Throws<TimeoutException>(heap.Dispose);
        Assert.True(domain.HoldsQuarantinedMemory, "the straggler is still inside: the mapping must stay (quarantined)");

        leave.Set();
        Assert.True(straggler.Join(TimeSpan.FromSeconds(30)));
        Assert.Null(stragglerFailure);
        Assert.False(domain.HoldsQuarantinedMemory, "the straggler left, and the quarantined mapping (the reservation's address space) was kept");
    }
}
