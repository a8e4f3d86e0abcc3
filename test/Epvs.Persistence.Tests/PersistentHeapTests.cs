using System;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>Layer 3, single-threaded: allocation, headers, free, reuse, large blocks, growth, recovery on a clean reopen.</summary>
public sealed class PersistentHeapTests : IDisposable
{
    private readonly TempDirectory _directory = new();

    public void Dispose() => _directory.Dispose();

    [Fact]
    public void Allocate_WriteAndReopen_BlocksSurviveWithHeadersAndPayloads()
    {
        string path = _directory.File("heap");
        var expected = new List<(long Offset, PayloadHeader Header)>();
        using (PersistentHeap heap = PersistentHeap.Create(path, MappedFile(4L << 20)))
        {
            int[] sizes = [0, 1, 31, 32, 100, 1000, 1024, 5000, 16_352, 16_353, 200_000];
            foreach (int size in sizes)
            {
                PayloadRef block = heap.Allocate(size, typeId: size % 7, epochTag: 5, kind: PayloadKind.Update);
                PayloadHeader header = heap.GetHeader(block);
                Assert.Equal(size, header.Size);
                Assert.Equal(size, heap.GetPayload(block).Length);
                Stamp.Write(heap.GetPayload(block), header.Uid);
                heap.Persist(block);
                expected.Add((block.Offset, header));
            }

            heap.File.SetRoot(0, expected[3].Offset);
        }

        using PersistentHeap reopened = PersistentHeap.Open(path, MappedFile(0));
        var found = new Dictionary<long, PayloadHeader>();
        reopened.ForEachAllocated((block, header) => found.Add(block.Offset, header));
        Assert.Equal(expected.Count, found.Count);
        foreach ((long offset, PayloadHeader header) in expected)
        {
            PayloadHeader actual = found[offset];
            Assert.Equal((header.Uid, header.EpochTag, header.Kind, header.Size, header.TypeId), (actual.Uid, actual.EpochTag, actual.Kind, actual.Size, actual.TypeId));
            Assert.True(Stamp.Matches(reopened.GetPayload(new PayloadRef(offset)), header.Uid));
        }

        Assert.Equal(expected[3].Offset, reopened.File.GetRoot(0));
        Assert.True(reopened.RecoveryStatistics.AddsUp, reopened.RecoveryStatistics.ToString());
        long newUid = reopened.NewUid();
        Assert.True(newUid > expected.Max(e => e.Header.Uid), "uids resume above the largest recovered uid");
    }

    /// <summary>
    /// A probe's findings: a negative uid was accepted and persisted, and a caller's uid near long.MaxValue made NewUid,
    /// after a reopen resumed above it, return negative uids. A negative uid is refused; NewUid reports exhaustion instead
    /// of wrapping.
    /// </summary>
    [Fact]
    public void Uids_AreNeverNegative()
    {
        string path = _directory.File("uids.heap");
        using (PersistentHeap heap = PersistentHeap.Create(path, MappedFile(1 << 20)))
        {
            Assert.Throws<ArgumentOutOfRangeException>(() => heap.Allocate(16, 1, uid: -7));
            heap.Persist(heap.Allocate(16, 1, uid: long.MaxValue - 3));
        }

        using PersistentHeap reopened = PersistentHeap.Open(path, MappedFile(0));
        Assert.Throws<InvalidOperationException>(() => reopened.NewUid());
        Assert.Throws<InvalidOperationException>(() => reopened.Allocate(16, 1));
    }

    [Fact]
    public void Free_ThenAllocateSameClass_ReusesTheBlock()
    {
        using var domain = new SimulatedPersistenceDomain(1 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using var heap = new PersistentHeap(file);
        PayloadRef first = heap.Allocate(500, 1);
        heap.Free(first);

        // Once the free is durable (before, the block is held: see RawFreeReuseTests).
        heap.WriteBackHeader(first);
        heap.Fence();
        PayloadRef second = heap.Allocate(590, 2); // 532 and 622 bytes with the header: both in the 640-byte class
        Assert.Equal(first, second);
        Assert.Equal(590, heap.GetHeader(second).Size);
    }

    [Fact]
    public void Free_Twice_ThrowsInvalidOperation()
    {
        using var domain = new SimulatedPersistenceDomain(1 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using var heap = new PersistentHeap(file);
        PayloadRef block = heap.Allocate(64, 1);
        heap.Free(block);
        InvalidOperationException error = Assert.Throws<InvalidOperationException>(() => heap.Free(block));
        Assert.Contains("double free", error.Message);
    }

    [Fact]
    public void Free_OffsetInsideABlock_ThrowsInvalidOperation()
    {
        using var domain = new SimulatedPersistenceDomain(1 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using var heap = new PersistentHeap(file);
        PayloadRef block = heap.Allocate(64, 1);
        Assert.Throws<InvalidOperationException>(() => heap.Free(new PayloadRef(block.Offset + 8)));
        Assert.Throws<InvalidOperationException>(() => heap.Free(new PayloadRef(16)));
    }

    [Fact]
    public void Allocate_LargeBlocks_SpanSegmentsAndReturnThemWhenFreed()
    {
        using var domain = new SimulatedPersistenceDomain(2 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using var heap = new PersistentHeap(file);
        long freeSegments = heap.GetStatistics().FreeSegments;
        PayloadRef large = heap.Allocate(300_000, 3);
        Assert.Equal(freeSegments - 5, heap.GetStatistics().FreeSegments); // 300,032 bytes → 5 segments
        heap.Free(large);
        Assert.Equal(freeSegments, heap.GetStatistics().FreeSegments);
        Assert.Equal(large, heap.Allocate(250_000, 3));
        Assert.True(heap.GetStatistics().AddsUp);
    }

    [Fact]
    public void TryAllocate_HeapFullAndCannotGrow_ReturnsFalseAndAllocateThrows()
    {
        using var domain = new SimulatedPersistenceDomain(1 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using var heap = new PersistentHeap(file);
        int count = 0;
        while (heap.TryAllocate(4000, 1, out _))
        {
            count++;
        }

        Assert.Equal(14 * (65536 / 4096), count); // 14 segments (after the table and the 64 KiB sweep log) of 16 blocks of 4 KiB
        InsufficientMemoryException error = Assert.Throws<InsufficientMemoryException>(() => heap.Allocate(4000, 1));
        Assert.Contains("cannot grow", error.Message);
    }

    [Fact]
    public void Allocate_BeyondInitialSize_GrowsTheMappedFileAndReopens()
    {
        string path = _directory.File("growing");
        var uids = new List<(PayloadRef Block, long Uid)>();
        using (PersistentHeap heap = PersistentHeap.Create(path, new HeapFileOptions { Size = 1L << 20, MaxSize = 8L << 20, Domain = PersistenceDomainKind.MappedFile }))
        {
            long before = new FileInfo(path).Length;
            for (int i = 0; i < 100; i++)
            {
                PayloadRef block = heap.Allocate(30_000, 1);
                long uid = heap.GetHeader(block).Uid;
                Stamp.Write(heap.GetPayload(block), uid);
                heap.Persist(block);
                uids.Add((block, uid));
            }

            Assert.True(heap.File.Size > before);
            Assert.True(new FileInfo(path).Length >= heap.File.Size);
        }

        using PersistentHeap reopened = PersistentHeap.Open(path, MappedFile(0));
        foreach ((PayloadRef block, long uid) in uids)
        {
            Assert.True(Stamp.Matches(reopened.GetPayload(block), uid));
        }
    }

    [Fact]
    public void RecoveryFilter_RejectingBlocks_FreesThemDurably()
    {
        using var domain = new SimulatedPersistenceDomain(2 << 20);
        var blocks = new List<PayloadRef>();
        using (HeapFile file = HeapFile.Create(domain))
        using (var heap = new PersistentHeap(file))
        {
            for (int i = 0; i < 40; i++)
            {
                PayloadRef block = heap.Allocate(i % 2 == 0 ? 100 : 30_000, 1, epochTag: i);
                heap.Persist(block);
                blocks.Add(block);
            }
        }

        var options = new PersistentHeapOptions { RecoveryFilter = (_, header) => header.EpochTag < 20 };
        using (var reopenedDomain = SimulatedPersistenceDomain.FromImage(domain.Crash(seed: 3)))
        {
            using (HeapFile file = HeapFile.Open(reopenedDomain))
            using (var filtered = new PersistentHeap(file, options))
            {
                Assert.Equal(20, filtered.RecoveryStatistics.LiveBlocks);
                Assert.True(filtered.RecoveryStatistics.AddsUp, filtered.RecoveryStatistics.ToString());
            }

            // The filter's frees were persisted: a crash right after the open that applied them keeps them.
            using var again = SimulatedPersistenceDomain.FromImage(reopenedDomain.GetDurableImage());
            using HeapFile againFile = HeapFile.Open(again);
            using var unfiltered = new PersistentHeap(againFile);
            Assert.Equal(20, unfiltered.RecoveryStatistics.LiveBlocks);
        }
    }

    /// <summary>The block index by multiplication agrees with the division for every offset within a segment, in every class.</summary>
    [Fact]
    public void SizeClasses_BlockIndex_IsTheQuotientForEveryOffsetOfASegment()
    {
        for (int cls = 0; cls < SizeClasses.Count; cls++)
        {
            for (uint within = 0; within < HeapLayout.SegmentSize; within++)
            {
                uint expected = within / (uint)SizeClasses.BlockSizes[cls];
                if (SizeClasses.BlockIndex(within, cls) != expected)
                {
                    Assert.Fail($"class {cls} (blocks of {SizeClasses.BlockSizes[cls]}): offset {within} gives {SizeClasses.BlockIndex(within, cls)}, not {expected}");
                }
            }
        }
    }

    /// <summary>
    /// Each payload size gets the smallest block that holds it and its header (format 9): a long key and value (16 bytes)
    /// a 48-byte block, three quarters of the 64-byte one they took before; one byte more the 64-byte block.
    /// </summary>
    [Fact]
    public void SizeClasses_ForPayload_IsTheSmallestBlockThatHoldsIt()
    {
        Assert.Equal((48, 64), (SizeClasses.BlockSizes[SizeClasses.ForPayload(16)], SizeClasses.BlockSizes[SizeClasses.ForPayload(17)]));
        Assert.Equal(65536 / 48, SizeClasses.BlocksPerSegment[SizeClasses.ForPayload(16)]);
        Assert.All(SizeClasses.BlockSizes, size => Assert.Equal(0, size % SizeClasses.Alignment));
        for (int size = 0; size <= SizeClasses.MaxSmallPayload; size++)
        {
            int cls = SizeClasses.ForPayload(size);
            int need = size + HeapLayout.HeaderSize;
            if (SizeClasses.BlockSizes[cls] < need || (cls > 0 && SizeClasses.BlockSizes[cls - 1] >= need))
            {
                Assert.Fail($"a payload of {size} bytes gets the class of {SizeClasses.BlockSizes[cls]}-byte blocks");
            }
        }
    }

    /// <summary>
    /// The 16-byte tail of a segment of 48-byte blocks holds no block: <see cref="PersistentHeap.WriteBackHeader"/> of it
    /// is refused like any offset that is not a block position (in the heap's last segment it used to throw the domain's
    /// ArgumentOutOfRangeException, its header's write-back ending past the mapping; found by a review of format 9).
    /// </summary>
    [Fact]
    public void WriteBackHeader_OfTheTailOfASegmentOf48ByteBlocks_IsRefusedAsNotABlock()
    {
        using var domain = new SimulatedPersistenceDomain(1 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using var heap = new PersistentHeap(file);
        var blocks = new List<PayloadRef>();
        while (heap.TryAllocate(16, typeId: 1, out PayloadRef block))
        {
            blocks.Add(block);
        }

        long last = file.DataStart + ((file.SegmentCount - 1) * (long)HeapLayout.SegmentSize);
        Assert.Contains(blocks, b => b.Offset == last + HeapLayout.SegmentSize - 64);
        foreach (long offset in new[] { last + HeapLayout.SegmentSize - 16, file.DataStart + HeapLayout.SegmentSize - 16 })
        {
            InvalidOperationException e = Assert.Throws<InvalidOperationException>(() => heap.WriteBackHeader(new PayloadRef(offset)));
            Assert.Contains("not a block position", e.Message);
        }

        heap.WriteBackHeader(blocks[^1]);
    }

    /// <summary>Offsets inside a block, past the last whole block of a segment, and at every block start, as the heap's checks see them.</summary>
    [Fact]
    public void Free_OfAnOffsetThatIsNotABlockStart_IsRefusedAndBlockStartsAreNot()
    {
        using var domain = new SimulatedPersistenceDomain(1 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using var heap = new PersistentHeap(file);
        PayloadRef first = heap.Allocate(100, typeId: 1);
        int blockSize = SizeClasses.BlockSizes[SizeClasses.ForPayload(100)];
        foreach (long wrong in new long[] { first.Offset + 8, first.Offset + blockSize - 8, first.Offset + blockSize + 32 })
        {
            InvalidOperationException e = Assert.ThrowsAny<InvalidOperationException>(() => heap.Free(new PayloadRef(wrong)));
            Assert.Contains("not the start of a block", e.Message, StringComparison.Ordinal);
        }

        // A class whose blocks leave a tail: the offset just past the last whole block is a multiple of the block size
        // but not a block. (The first block of a fresh segment is its start.)
        int cls96 = SizeClasses.ForPayload(60);
        Assert.Equal(96, SizeClasses.BlockSizes[cls96]);
        PayloadRef segmentStart = heap.Allocate(60, typeId: 1);
        Assert.Equal(0, segmentStart.Offset % 4096);
        long pastLast = segmentStart.Offset + ((long)SizeClasses.BlocksPerSegment[cls96] * 96);
        InvalidOperationException tail = Assert.ThrowsAny<InvalidOperationException>(() => heap.Free(new PayloadRef(pastLast)));
        Assert.Contains("not the start of a block", tail.Message, StringComparison.Ordinal);

        heap.Free(first);
        heap.Free(segmentStart);
    }

    /// <summary>
    /// A segment whose parked frees were swept, released and formatted again for a class with more blocks parks those
    /// blocks too: its bitmap of the old class (one word for 16 blocks of 4 KiB) must grow to the new class's (1365
    /// blocks of 48 bytes), or a free of a block past the old class's count would fall outside it.
    /// </summary>
    [Fact]
    public void DeferredFrees_OfASegmentFormattedAgainForAClassWithMoreBlocks_AreAllParkedAndSwept()
    {
        using var domain = new SimulatedPersistenceDomain(1 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using var heap = new PersistentHeap(file);
        var large = new List<long>();
        long[] big = AllocateUntilFull(heap, 4000);
        heap.DeferFrees(big, big.Length, large);
        Assert.Empty(large);
        Assert.Equal(big.Length, heap.SweepPendingFrees(long.MaxValue));

        // The heap is full of free 4 KiB blocks: 16-byte payloads take segments released from that class.
        long[] small = AllocateUntilFull(heap, 16);
        Assert.True(heap.ReleasedSegments > 0, "no segment was released and formatted again");
        heap.DeferFrees(small, small.Length, large);
        Assert.Equal(small.Length, heap.PendingFreeBlocks);
        Assert.Equal(small.Length, heap.SweepPendingFrees(long.MaxValue));
        Assert.Equal(0, heap.GetStatistics().LiveBlocks);
        Assert.True(heap.GetStatistics().AddsUp, heap.GetStatistics().ToString());

        static long[] AllocateUntilFull(PersistentHeap heap, int size)
        {
            var blocks = new List<long>();
            while (true)
            {
                try
                {
                    blocks.Add(heap.Allocate(size, typeId: 1).Offset);
                }
                catch (InsufficientMemoryException)
                {
                    return blocks.ToArray();
                }
            }
        }
    }

    [Fact]
    public void DeferredFrees_ParkedInAnyOrder_AreHandedOutInAddressOrder()
    {
        // One whole segment of 16-byte payloads allocated, half of its blocks parked in a shuffled order; after the
        // sweep, a fresh thread allocates exactly those blocks, lowest address first.
        using var domain = new SimulatedPersistenceDomain(1 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using var heap = new PersistentHeap(file);
        int perSegment = SizeClasses.BlocksPerSegment[SizeClasses.ForPayload(16)];
        long[] blocks = Enumerable.Range(0, perSegment).Select(_ => heap.Allocate(16, typeId: 1).Offset).ToArray();
        long[] parked = blocks.Where((_, i) => i % 2 == 1).OrderBy(o => (o * 0x9E37_79B9L) & 0xFFFF).ToArray();
        heap.DeferFrees(parked, parked.Length, new List<long>());
        heap.FlushPendingFrees();

        var reused = new List<long>();
        var thread = new Thread(() =>
        {
            for (int i = 0; i < parked.Length; i++)
            {
                reused.Add(heap.Allocate(16, typeId: 1).Offset);
            }
        });
        thread.Start();
        Assert.True(thread.Join(Workers.JoinTimeout));
        Assert.Equal(parked.Order(), reused);
    }

    /// <summary>
    /// A block parked twice (in one call, or again while the first is still parked) is a double free: the call reports
    /// it and parks every other block once, so the sweep frees each exactly once and nothing is lost or handed out
    /// twice. (Before parked frees were bitmaps, the sweep found the duplicate and stopped every later sweep.)
    /// </summary>
    [Fact]
    public void DeferredFrees_ABlockParkedTwice_IsReportedAndEveryBlockIsFreedOnce()
    {
        using var domain = new SimulatedPersistenceDomain(1 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using var heap = new PersistentHeap(file);
        // One whole segment allocated, so that a fresh thread's allocations can only get blocks the sweep hands out.
        int perSegment = SizeClasses.BlocksPerSegment[SizeClasses.ForPayload(16)];
        long[] blocks = Enumerable.Range(0, perSegment).Select(_ => heap.Allocate(16, typeId: 1).Offset).ToArray();
        InvalidOperationException e = Assert.Throws<InvalidOperationException>(() => heap.DeferFrees([blocks[3], blocks[5], blocks[3], blocks[6]], 4, new List<long>()));
        Assert.Contains("double free", e.Message, StringComparison.Ordinal);
        Assert.Contains($"offset {blocks[3]}", e.Message, StringComparison.Ordinal);
        Assert.Equal(3, heap.PendingFreeBlocks);
        Assert.Throws<InvalidOperationException>(() => heap.DeferFrees([blocks[5]], 1, new List<long>()));
        Assert.Equal(3, heap.PendingFreeBlocks);
        heap.DeferFrees([blocks[7]], 1, new List<long>());
        Assert.Equal(4, heap.SweepPendingFrees(long.MaxValue));
        Assert.Equal(0, heap.PendingFreeBlocks);
        Assert.Equal(perSegment - 4, heap.GetStatistics().LiveBlocks);

        // Each freed block is handed out once: a fresh thread's four allocations get exactly the four freed blocks, in
        // address order, and its fifth a block of a new segment.
        var reused = new List<long>();
        var thread = new Thread(() =>
        {
            for (int i = 0; i < 5; i++)
            {
                reused.Add(heap.Allocate(16, typeId: 1).Offset);
            }
        });
        thread.Start();
        Assert.True(thread.Join(Workers.JoinTimeout));
        Assert.Equal(new[] { blocks[3], blocks[5], blocks[6], blocks[7] }, reused.Take(4));
        Assert.DoesNotContain(reused[4], blocks);
    }

    /// <summary>
    /// A DeferFrees whose bitmap for a later segment cannot be allocated fails part way: the blocks it parked before that
    /// are counted all the same, so the sweep finds and frees them. The counters used to be updated after the loop only:
    /// the parked blocks were invisible to the sweep (which stops when it counts none) and leaked.
    /// </summary>
    [Fact]
    public void DeferredFrees_FailingPartWay_CountsTheBlocksParkedSoFar()
    {
        using var domain = new SimulatedPersistenceDomain(1 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using var heap = new PersistentHeap(file);
        int perSegment = SizeClasses.BlocksPerSegment[SizeClasses.ForPayload(16)];
        long[] blocks = Enumerable.Range(0, perSegment + 1).Select(_ => heap.Allocate(16, typeId: 1).Offset).ToArray();
        long lastSegment = heap.SegmentOf(blocks[perSegment]);
        Assert.NotEqual(heap.SegmentOf(blocks[0]), lastSegment);
        heap.BeforePendingBitsGrowForTesting = segment =>
        {
            if (segment == lastSegment)
            {
                throw new OutOfMemoryException("simulated: no memory for a pending-free bitmap");
            }
        };
        Assert.Throws<OutOfMemoryException>(() => heap.DeferFrees([blocks[1], blocks[2], blocks[perSegment]], 3, new List<long>()));
        heap.BeforePendingBitsGrowForTesting = null;
        Assert.Equal(2, heap.PendingFreeBlocks);
        Assert.Equal(2, heap.SweepPendingFrees(long.MaxValue));
        Assert.Equal(perSegment - 1, heap.GetStatistics().LiveBlocks);
    }

    [Fact]
    public unsafe void Seal_ManyBlocksInBatches_SealsExactlyTheAllocatedBlocksOfTheVersion()
    {
        // More than two of Seal's batches (64 blocks each), so every batch boundary and the prefetch past the end are
        // crossed; among them blocks of another version and a freed block, which must be left as they are.
        using var domain = new SimulatedPersistenceDomain(4 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using var heap = new PersistentHeap(file);
        var blocks = new List<(PayloadRef Block, long Version)>();
        for (int i = 0; i < 200; i++)
        {
            long version = i % 10 == 3 ? 8 : 7;
            PayloadRef block = heap.Allocate(i % 3 == 0 ? 16 : 200, typeId: 1, epochTag: version);
            heap.GetPayload(block).Fill((byte)i);
            blocks.Add((block, version));
        }

        PayloadRef freed = blocks[130].Block;
        heap.Free(freed);
        heap.Seal(blocks.Select(b => b.Block.Offset).ToArray(), version: 7);

        foreach ((PayloadRef block, long version) in blocks)
        {
            ulong commit = *(ulong*)(file.Pointer + block.Offset + HeapLayout.CommitOffset);
            ulong expected = block == freed ? HeapLayout.StateFree : version == 7 ? HeapLayout.StateSealed : HeapLayout.StateAllocated;
            Assert.True(HeapLayout.CommitState(commit) == expected, $"block 0x{block.Offset:X} of version {version}: state {HeapLayout.CommitState(commit)}, expected {expected}");
        }
    }

    private static HeapFileOptions MappedFile(long size) => new() { Size = size, Domain = PersistenceDomainKind.MappedFile };
}
