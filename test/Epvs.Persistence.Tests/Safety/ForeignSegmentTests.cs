using System;
using System.IO;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// A probe's finding: a segment (descriptor and data) copied from another heap file of the same geometry passes every
/// check (descriptors are bound to their slot, blocks to their offset and segment generation, not to the file), and both
/// heaps number their uids from 1, so the foreign blocks share uids with the host's payloads elsewhere. Recovery took a
/// shared uid for copies of one payload and freed the loser durably: a healthy payload of the host, without a word. One
/// uid under two type ids is no crash's (a copy or an anti-payload keeps its payload's type id), so that case is now
/// refused before anything is freed. Foreign blocks of the host's own structure and type id are not told apart (see the
/// README's "What the checks cannot see").
/// </summary>
public sealed class ForeignSegmentTests
{
    private const int Keys = 1000;
    private static readonly HeapFileOptions FileOptions = new() { Size = 4L << 20, Domain = PersistenceDomainKind.MappedFile };
    private static readonly BufferedDurableHeapOptions Manual = new() { AdvancePeriod = Timeout.InfiniteTimeSpan };

    [Fact]
    public void ASegmentOfAnotherHeapsStructure_SharingUidsWithTheHost_IsRefused_NotResolvedByFreeingTheHostsPayloads()
    {
        using var dir = new TempDirectory();
        string host = dir.File("host.heap"), other = dir.File("other.heap");
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(host, FileOptions, Manual))
        {
            // Uids 1 to 1000 in the first segments; the first 100 keys then copied (same uids) into later blocks.
            var map = new PersistentHashMap<long, long>(heap, typeId: 1);
            for (long k = 0; k < Keys; k++)
            {
                map.Set(k, k * 7);
            }

            heap.Sync();
            for (long k = 0; k < 100; k++)
            {
                map.Set(k, k * 7);
            }

            heap.Sync();
        }

        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(other, FileOptions, Manual))
        {
            // Another structure, with payloads of the same block size: its uids 1 to 1000 too.
            var bytes = new PersistentByteMap<long>(heap, typeId: 2);
            for (long k = 0; k < Keys; k++)
            {
                bytes.Set(k, BitConverter.GetBytes(k));
            }

            heap.Sync();
        }

        byte[] image = File.ReadAllBytes(host), foreign = File.ReadAllBytes(other);
        long dataStart = BitConverter.ToInt64(image, HeapLayout.DataStartOffset);
        Array.Copy(foreign, HeapLayout.SuperblockSize, image, HeapLayout.SuperblockSize, sizeof(ulong));
        Array.Copy(foreign, dataStart, image, dataStart, HeapLayout.SegmentSize);
        File.WriteAllBytes(host, image);

        foreach (bool salvage in new[] { false, true })
        {
            HeapFileException refused = Assert.Throws<HeapFileException>(() => BufferedDurableHeap.Open(host, FileOptions, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, SalvageDamagedBlocks = salvage }).Dispose());
            Assert.Equal(HeapFileError.Corrupt, refused.Error);
            Assert.Contains("carry one uid", refused.Message, StringComparison.Ordinal);

            // Nothing freed past the superblock (whose saved state an open invalidates first).
            Assert.True(image.AsSpan(HeapLayout.SuperblockSize).SequenceEqual(File.ReadAllBytes(host).AsSpan(HeapLayout.SuperblockSize)), "a refused open changed the file past the superblock");
        }
    }
}
