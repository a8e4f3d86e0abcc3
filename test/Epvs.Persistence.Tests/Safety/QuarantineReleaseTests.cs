using System;
using System.Collections.Generic;
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

    /// <summary>
    /// A review: a raw heap on the caller's file whose call outlived its Dispose's wait left the file's Dispose to
    /// quarantine the mapping, which was never freed. The call is the file's own (inside its epoch): the quarantine is
    /// now freed once it has left. In a child process (the wait is shortened process-wide); the control keeps it.
    /// </summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void ARawHeapsCallThatOutlivedItsDispose_FreesTheQuarantineOnceItLeaves(bool control)
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "the quarantine replaces the mapping on Linux only");
        using var dir = new TempDirectory();
        var arguments = new List<string> { SafetyChild.Role, "raw-calls-outlive-dispose-wait", dir.File("raw.heap") };
        if (control)
        {
            arguments.Add("control");
        }

        (int code, string output) = TestProgram.RunChild(new Dictionary<string, string>(), [.. arguments]);
        Assert.True(code == SafetyChild.Survived, $"exit {code}: {output}");
        Assert.Contains("scan: completed", output);
        Assert.Contains("quarantined before the call left: True", output);
        Assert.Contains(control ? "after: True" : "after: False", output);
    }

    /// <summary>
    /// A review: the release waited for the threads inside the version scheme only, not for a thread inside a call of the
    /// heap's file (its own epoch: a scan of the raw heap), which went on reading block headers from the range it unmapped
    /// (the test host crashed). It now waits for both.
    /// </summary>
    [Fact]
    public void ATimedOutDispose_KeepsTheQuarantine_WhileAThreadIsInsideACallOfTheFile()
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "the quarantine replaces the mapping on Linux only");
        using var dir = new TempDirectory();
        var heap = BufferedDurableHeap.Create(dir.File("q.heap"), new HeapFileOptions { Size = 8L << 20, Domain = PersistenceDomainKind.MappedFile }, new BufferedDurableHeapOptions { SyncTimeout = TimeSpan.FromMilliseconds(50) });
        using (DurableOperation op = heap.BeginOperation())
        {
            op.Allocate(64, 1);
            op.Allocate(64, 1);
        }

        heap.Sync();
        PersistenceDomain domain = heap.Heap.File.Domain;
        using var inside = new ManualResetEventSlim();
        using var leave = new ManualResetEventSlim();
        using var visiting = new ManualResetEventSlim();
        // Not disposed, and waited for without a timeout: should the range be unmapped under the parked scanner (the bug),
        // the scanner must stay parked for good rather than go on and crash the host.
        var goOn = new ManualResetEventSlim();
        var straggler = new Thread(() =>
        {
            DurableOperation op = heap.BeginOperation();
            inside.Set();
            leave.Wait(TimeSpan.FromSeconds(30));
            op.Dispose();
        });
        Exception? scanFailure = null;
        var scanner = new Thread(() => scanFailure = Record.Exception(() => heap.Heap.ForEachAllocated((_, _) =>
        {
            visiting.Set();
            goOn.Wait();
        })))
        { IsBackground = true };
        straggler.Start();
        Assert.True(inside.Wait(TimeSpan.FromSeconds(30)));
        scanner.Start();
        Assert.True(visiting.Wait(TimeSpan.FromSeconds(30)));
        Assert.Throws<TimeoutException>(heap.Dispose);
        leave.Set();
        Assert.True(straggler.Join(TimeSpan.FromSeconds(30)));

        // The scanner is still inside the file's call (it reads the next header once its visitor returns): if the range
        // were unmapped now, letting it go on would crash the host, so the test stops here with the scanner parked.
        Assert.True(domain.HoldsQuarantinedMemory, "the quarantined range was unmapped while a thread was inside a call of the heap's file");
        goOn.Set();
        Assert.True(scanner.Join(TimeSpan.FromSeconds(30)));
        Assert.Null(scanFailure);
        Assert.False(domain.HoldsQuarantinedMemory, "the scanner left too, and the quarantined mapping was kept");
    }
}
