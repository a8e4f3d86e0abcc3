using System;
using System.IO;
using System.Linq;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// A probe's finding: a large block's start descriptor names a span of segments, and recovery trusted that span. It
/// skipped every segment inside it and, when the block was torn or damaged, rewrote every descriptor of the span as
/// free. A stale start descriptor (the old value of its own slot, which passes its check: a lost write of one table
/// sector, a rolled-back copy) whose span now covers small segments in use made recovery drop those segments' healthy
/// blocks: under salvage while listing one damaged block, and durably. Such a span is now refused; the shape a crash
/// does leave (a start whose allocation was interrupted over a small segment whose blocks are all free) still opens.
/// </summary>
public sealed class StaleLargeDescriptorTests
{
    private const int Entries = 5500;
    private static readonly HeapFileOptions FileOptions = new() { Size = 4L << 20, Domain = PersistenceDomainKind.MappedFile };

    private static BufferedDurableHeapOptions Options(bool salvage) => new() { AdvancePeriod = Timeout.InfiniteTimeSpan, SalvageDamagedBlocks = salvage };

    /// <summary>
    /// Builds the file: a large value (span ≥ 2) at segment 0, synced and closed (the old image); then the value
    /// replaced by a small one, its large block freed, and <see cref="Entries"/> map entries that reuse segments 0.. as
    /// small segments. Returns the old image and the final one.
    /// </summary>
    private static (byte[] Old, byte[] Final) Build(string path, int largeSize)
    {
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, FileOptions, Options(false)))
        {
            _ = new PersistentHashMap<long, long>(heap, typeId: 1);
            var bytes = new PersistentByteMap<long>(heap, typeId: 2);
            bytes.Set(1, Enumerable.Repeat((byte)0xAB, largeSize).ToArray());
            heap.Sync();
        }

        byte[] old = File.ReadAllBytes(path);
        Assert.Equal(HeapLayout.RoleLargeStart, HeapLayout.DescriptorRole(BitConverter.ToUInt64(old, HeapLayout.SuperblockSize)));
        using (BufferedDurableHeap heap = BufferedDurableHeap.Open(path, FileOptions, Options(false)))
        {
            var map = new PersistentHashMap<long, long>(heap, typeId: 1);
            var bytes = new PersistentByteMap<long>(heap, typeId: 2);
            bytes.Set(1, new byte[] { 9, 9 });
            for (int i = 0; i < 4; i++)
            {
                heap.Sync();
            }

            for (long k = 0; k < Entries; k++)
            {
                map.Set(k, k * 7);
            }

            heap.Sync();
        }

        byte[] final = File.ReadAllBytes(path);
        // The precondition: segments 0 and 1 are small segments in use now.
        Assert.Equal(HeapLayout.RoleSmall, HeapLayout.DescriptorRole(BitConverter.ToUInt64(final, HeapLayout.SuperblockSize)));
        Assert.Equal(HeapLayout.RoleSmall, HeapLayout.DescriptorRole(BitConverter.ToUInt64(final, HeapLayout.SuperblockSize + 8)));
        return (old, final);
    }

    private static int Missing(PersistentHashMap<long, long> map)
    {
        int missing = 0;
        for (long k = 0; k < Entries; k++)
        {
            if (!map.TryGetValue(k, out long v))
            {
                missing++;
            }
            else
            {
                Assert.Equal(k * 7, v);
            }
        }

        return missing;
    }

    /// <summary>
    /// Only segment 0's descriptor is stale (one word, the old value of its own slot). Salvage used to drop the whole span
    /// while listing one damaged block: every live block of segments 0 to 2 (over 3,000 map entries, healthy, not listed),
    /// and it rewrote the descriptors of segments 1 and 2 as free durably after handing their blocks to the map as live,
    /// so entries the salvaging session read (and a Sync acknowledged) were gone at the next open. A large start over
    /// small segments is no crash's: the open is refused, with or without salvage, naming both descriptors, and the
    /// file is left as it was.
    /// </summary>
    [Fact]
    public void StaleLargeStartDescriptor_OverSmallSegmentsInUse_IsRefusedEvenUnderSalvage()
    {
        using var dir = new TempDirectory();
        string path = dir.File("stale-large.heap");
        (byte[] old, byte[] image) = Build(path, 150_000);
        byte[] current = image[HeapLayout.SuperblockSize..(HeapLayout.SuperblockSize + sizeof(ulong))];
        Array.Copy(old, HeapLayout.SuperblockSize, image, HeapLayout.SuperblockSize, sizeof(ulong));
        File.WriteAllBytes(path, image);

        foreach (bool salvage in new[] { false, true })
        {
            HeapFileException refused = Assert.Throws<HeapFileException>(() => BufferedDurableHeap.Open(path, FileOptions, Options(salvage)).Dispose());
            Assert.Equal(HeapFileError.Corrupt, refused.Error);
            Assert.Contains("descriptor of segment 0", refused.Message, StringComparison.Ordinal);
            Assert.Contains("segment 1 inside it", refused.Message, StringComparison.Ordinal);
            // Nothing written past the superblock (whose saved state an open invalidates first, as every open does).
            Assert.True(image.AsSpan(HeapLayout.SuperblockSize).SequenceEqual(File.ReadAllBytes(path).AsSpan(HeapLayout.SuperblockSize)), "a refused open changed the file past the superblock");
        }

        // The descriptor restored: the file opens whole (the refusal was the descriptor's, nothing else's).
        Array.Copy(current, 0, image, HeapLayout.SuperblockSize, sizeof(ulong));
        File.WriteAllBytes(path, image);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(path, FileOptions, Options(false));
        Assert.Equal(0, Missing(new PersistentHashMap<long, long>(heap, typeId: 1)));
    }

    /// <summary>
    /// The old image of segment 0's descriptor and of the bytes of the old large block (segment 0 and the first blocks
    /// of segment 1) — a rollback of those ranges. The large block is whole again (a lost write, accepted),
    /// but its span covers segment 1, a small segment whose other live blocks were never rolled back. Recovery
    /// skipped them without a word (no damage, a clean open), then freed the resurrected block as superseded, which
    /// rewrote segment 1's descriptor as free durably. No crash leaves a complete large start over a descriptor that is
    /// not its continuation (the table is persisted, one fence, before the header is written): the open is refused.
    /// </summary>
    [Fact]
    public void StaleLargeStartOverASmallSegment_WithItsBlockWhole_IsRefused()
    {
        using var dir = new TempDirectory();
        string path = dir.File("stale-large-2.heap");
        (byte[] old, byte[] image) = Build(path, 65_600);
        Assert.Equal(2L, HeapLayout.DescriptorPayload(BitConverter.ToUInt64(old, HeapLayout.SuperblockSize)));
        long dataStart = BitConverter.ToInt64(image, HeapLayout.DataStartOffset);
        Array.Copy(old, HeapLayout.SuperblockSize, image, HeapLayout.SuperblockSize, sizeof(ulong));
        const int RolledBack = HeapLayout.SegmentSize + 128;
        Array.Copy(old, dataStart, image, dataStart, RolledBack);
        File.WriteAllBytes(path, image);

        HeapFileException refused = Assert.Throws<HeapFileException>(() => BufferedDurableHeap.Open(path, FileOptions, Options(false)).Dispose());
        Assert.Equal(HeapFileError.Corrupt, refused.Error);
        Assert.Contains("segment 1 inside it", refused.Message, StringComparison.Ordinal);
        // Nothing written past the superblock (whose saved state an open invalidates first, as every open does).
        Assert.True(image.AsSpan(HeapLayout.SuperblockSize).SequenceEqual(File.ReadAllBytes(path).AsSpan(HeapLayout.SuperblockSize)), "a refused open changed the file past the superblock");
    }

    /// <summary>
    /// What a crash does leave: an allocation of a large block interrupted while its span's descriptors were being
    /// persisted (in any order on persistent memory), so the start is durable, its header still the unused one of its
    /// generation, and a segment inside the span keeps its old descriptor: a small segment whose blocks are all free.
    /// Opens, with no damage, and the heap works on (a refusal here would make a crashed heap unopenable).
    /// </summary>
    [Fact]
    public void InterruptedLargeAllocation_OverAnEmptySmallSegment_Opens()
    {
        using var dir = new TempDirectory();
        string path = dir.File("interrupted-large.heap");
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, FileOptions, Options(false)))
        {
            var map = new PersistentHashMap<long, long>(heap, typeId: 1);
            for (long k = 0; k < Entries; k++)
            {
                map.Set(k, k);
            }

            heap.Sync();
            for (long k = 0; k < Entries; k++)
            {
                Assert.True(map.Remove(k));
            }

            for (int i = 0; i < 4; i++)
            {
                heap.Sync();
            }
        }

        byte[] image = File.ReadAllBytes(path);
        ulong Word(long segment) => BitConverter.ToUInt64(image, HeapLayout.SuperblockSize + (int)(segment * sizeof(ulong)));
        Assert.Equal(HeapLayout.RoleSmall, HeapLayout.DescriptorRole(Word(0)));
        Assert.Equal(HeapLayout.RoleSmall, HeapLayout.DescriptorRole(Word(1)));

        // Segment 0 taken for a block of two segments: its descriptor freed, then the start (the generation after that),
        // the header the unused one of that generation; segment 1's continuation never became durable.
        uint generation = HeapLayout.NextGeneration(HeapLayout.FreedDescriptor(Word(0), 0));
        BitConverter.TryWriteBytes(image.AsSpan(HeapLayout.SuperblockSize), HeapLayout.Descriptor(generation, HeapLayout.RoleLargeStart, 2, 0));
        long header = BitConverter.ToInt64(image, HeapLayout.DataStartOffset);
        BitConverter.TryWriteBytes(image.AsSpan((int)header), 0UL);
        BitConverter.TryWriteBytes(image.AsSpan((int)header + HeapLayout.EpochOffset), HeapLayout.EmptyEpoch(header));
        BitConverter.TryWriteBytes(image.AsSpan((int)header + 16), 0UL);
        BitConverter.TryWriteBytes(image.AsSpan((int)header + HeapLayout.CommitOffset), HeapLayout.UnusedWord(header, generation));
        File.WriteAllBytes(path, image);

        using (BufferedDurableHeap heap = BufferedDurableHeap.Open(path, FileOptions, Options(false)))
        {
            Assert.Empty(heap.Recovery.DamagedBlocks);
            var map = new PersistentHashMap<long, long>(heap, typeId: 1);
            var bytes = new PersistentByteMap<long>(heap, typeId: 2);
            Assert.Equal(0, map.Count);
            for (long k = 0; k < Entries; k++)
            {
                map.Set(k, k * 7);
            }

            bytes.Set(1, new byte[150_000]);
            heap.Sync();
        }

        using (BufferedDurableHeap heap = BufferedDurableHeap.Open(path, FileOptions, Options(false)))
        {
            Assert.Equal(0, Missing(new PersistentHashMap<long, long>(heap, typeId: 1)));
            Assert.Equal(150_000, new PersistentByteMap<long>(heap, typeId: 2).Get(1)!.Length);
        }
    }
}
