using System;
using System.IO;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// A probe's finding: a superblock older than a growth of the heap (its page lost a write, or an old copy was put back).
/// The stale-superblock check (<see cref="StaleSuperblockTests"/>) looks for blocks tagged above the old clock only in the
/// segments the old heap size covers; a heap full before the growth put every later payload into the added segments,
/// which the old size hides. The open reported nothing and kept 51 of 552 acknowledged values, and the session's next
/// growth formatted the hidden segments for good. A growth writes only free descriptors beyond the heap size before the
/// size covers them, so any other checked descriptor there proves the size word stale: the open is refused, before it
/// writes anything. The control skips that look.
/// </summary>
public sealed class GrownStaleSuperblockTests : IDisposable
{
    private const int TypeId = 7;
    private static readonly BufferedDurableHeapOptions NoAdvancer = new() { AdvancePeriod = Timeout.InfiniteTimeSpan };
    private static readonly HeapFileOptions MappedFile = new() { Domain = PersistenceDomainKind.MappedFile };
    private readonly TempDirectory _directory = new();

    public void Dispose() => _directory.Dispose();

    [Fact]
    public void AnOldSuperblockFromBeforeAGrowth_IsReportedBeforeAnythingIsWritten()
    {
        (string stale, _, byte[] damaged) = Build();

        HeapFileException e = Assert.Throws<HeapFileException>(() => BufferedDurableHeap.Open(stale, MappedFile, NoAdvancer).Dispose());

        Assert.Equal(HeapFileError.Corrupt, e.Error);
        Assert.Contains("older than the segment table", e.Message, StringComparison.Ordinal);
        Assert.Equal(damaged, File.ReadAllBytes(stale));
    }

    [Fact]
    public void NotLookingBeyondTheHeapSize_IsCaughtLosingAcknowledgedValues()
    {
        (string stale, long acknowledged, _) = Build();
        PersistentHeap.SkipTableBeyondTheHeapSizeForTesting = true;
        try
        {
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(stale, MappedFile, NoAdvancer);
            long kept = new PersistentByteMap<long>(heap, TypeId + 1).Count;
            Assert.Empty(heap.Recovery.DamagedBlocks);
            Assert.True(kept < acknowledged, $"the control kept all {acknowledged} acknowledged values: the scenario hides nothing");
        }
        finally
        {
            PersistentHeap.SkipTableBeyondTheHeapSizeForTesting = false;
        }
    }

    [Fact]
    public void AHeapThatGrew_ReopensWithEveryValue()
    {
        string path = _directory.File("grown.heap");
        long acknowledged = Grow(path, out _);

        using BufferedDurableHeap heap = BufferedDurableHeap.Open(path, MappedFile, NoAdvancer);
        var bytes = new PersistentByteMap<long>(heap, TypeId + 1);
        Assert.Equal(acknowledged, bytes.Count);
        Assert.Equal(new byte[1000], bytes.Get(acknowledged - 1));
    }

    /// <summary>
    /// A 1 MiB heap filled in a capped open, then grown by an uncapped one (a Sync per value until the growth, 500 values
    /// after); returns how many byte-map values were acknowledged, and the file as it was just before the growth.
    /// </summary>
    private static long Grow(string path, out byte[] beforeGrowth)
    {
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, new HeapFileOptions { Size = 1L << 20, MaxSize = 16L << 20, Domain = PersistenceDomainKind.MappedFile }, NoAdvancer))
        {
            heap.Sync();
        }

        long segmentsBefore;
        using (BufferedDurableHeap heap = BufferedDurableHeap.Open(path, new HeapFileOptions { MaxSize = 1L << 20, Domain = PersistenceDomainKind.MappedFile }, NoAdvancer))
        {
            var map = new PersistentHashMap<long, long>(heap, TypeId);
            Action fill = () =>
            {
                for (long k = 0; ; k++)
                {
                    map.Set(k, k * 3);
                }
            };
            Assert.Throws<InsufficientMemoryException>(fill);
            heap.Sync();
            segmentsBefore = heap.Heap.File.SegmentCount;
        }

        beforeGrowth = File.ReadAllBytes(path);
        long written = 0;
        using (BufferedDurableHeap heap = BufferedDurableHeap.Open(path, MappedFile, NoAdvancer))
        {
            // Another size class than the full segments' (their kept free segment, the delete reserve, fills first).
            var bytes = new PersistentByteMap<long>(heap, TypeId + 1);
            for (; heap.Heap.File.SegmentCount == segmentsBefore; written++)
            {
                beforeGrowth = CorruptionFuzz.ReadPastTheLock(path);
                bytes.Set(written, new byte[1000]);
                heap.Sync();
            }

            for (int n = 0; n < 500; n++, written++)
            {
                bytes.Set(written, new byte[1000]);
            }

            heap.Sync();
        }

        return written;
    }

    /// <summary>The grown heap with its superblock page from just before the growth, as a file of its own.</summary>
    private (string Stale, long Acknowledged, byte[] Damaged) Build()
    {
        string path = _directory.File("grown.heap");
        long acknowledged = Grow(path, out byte[] beforeGrowth);
        byte[] damaged = File.ReadAllBytes(path);
        Array.Copy(beforeGrowth, 0, damaged, 0, 4096);
        string stale = _directory.File("stale.heap");
        File.WriteAllBytes(stale, damaged);
        return (stale, acknowledged, damaged);
    }
}
