using System;
using System.Runtime.InteropServices;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// What a store through a payload span after its operation ended does (README, "Writes outside an operation"): nothing
/// refuses it at run time; into a sealed block it breaks the seal, and where the store reaches the file the next
/// open reports the block as damaged (never silently wrong); through a private mapping it reaches the file only if a
/// later write-back covers its page, and a clean close does not. These tests pin that behaviour.
/// </summary>
public sealed class WritesOutsideOperationsTests
{
    private const int TypeId = 5;

    [Theory]
    [InlineData(MappedFileWriteBack.SharedMapping)]
    [InlineData(MappedFileWriteBack.PrivateMapping)]
    public void AStoreThroughASpanAfterItsBlockWasSealed_IsDamageWhereItReachesTheFile_NeverSilentlyKept(MappedFileWriteBack writeBack)
    {
        Assert.SkipWhen(writeBack == MappedFileWriteBack.PrivateMapping && !OperatingSystem.IsLinux(), "private mappings are Linux only");
        using var dir = new TempDirectory();
        string path = dir.File("stray.heap");
        var fileOptions = new HeapFileOptions { Size = 1L << 20, Domain = PersistenceDomainKind.MappedFile, MappedFileWriteBack = writeBack };
        var options = new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan };
        long offset;
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, fileOptions, options))
        {
            Span<byte> stale;
            using (DurableOperation op = heap.BeginOperation())
            {
                PayloadRef block = op.Allocate(64, TypeId);
                offset = block.Offset;
                stale = op.GetPayload(block);
                stale.Fill(7);
            }

            // Written back, the frontier past it, sealed.
            heap.AdvanceVersion(TimeSpan.FromSeconds(30));
            heap.AdvanceVersion(TimeSpan.FromSeconds(30));
            ulong commit = (ulong)Marshal.ReadInt64(heap.Heap.GetPayloadAddress(new PayloadRef(offset)) - HeapLayout.HeaderSize + HeapLayout.CommitOffset);
            Assert.Equal(HeapLayout.StateSealed, HeapLayout.CommitState(commit));

            // The misuse: a store through the span of an operation that has ended. Nothing refuses it.
            stale[10] = 99;
        }

        if (writeBack == MappedFileWriteBack.SharedMapping)
        {
            // The clean close persisted the whole mapping, stray store included: the seal no longer matches.
            HeapFileException e = Assert.Throws<HeapFileException>(() => BufferedDurableHeap.Open(path, fileOptions, options).Dispose());
            Assert.Equal(HeapFileError.Corrupt, e.Error);
            Assert.Contains(offset, e.DamagedBlocks);
        }
        else
        {
            // Nothing wrote the page back after the store: the file holds the sealed payload as the operation left it.
            using BufferedDurableHeap reopened = BufferedDurableHeap.Open(path, fileOptions, options);
            RecoveredPayload payload = Assert.Single(reopened.TakeRecoveredPayloads(TypeId));
            Assert.Equal(offset, payload.Block.Offset);
            Assert.Equal(7, reopened.Heap.GetPayload(payload.Block)[10]);
        }
    }
}
