using System;
using System.Collections.Generic;
using System.Linq;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// A heap that cannot grow (the libpmem domain, or a maximum size equal to the size), once full of payloads, refused
/// every delete — <see cref="DurableOperation.Delete(PayloadRef)"/>, a map's Remove, a queue's TryDequeue — with
/// <see cref="InsufficientMemoryException"/>, after Syncs and reopens too: a delete's anti-payload needs a block, and
/// deleting is the only way to make room (found by the pmem probe round). Ordinary allocations now leave a reserve that
/// only anti-payloads take. Also: a maximum size beyond the segment table was clamped silently, and the heap-full error
/// of a domain that cannot grow advised a larger maximum size, which cannot help there.
/// </summary>
public sealed class FullHeapTests
{
    private const int RawTypeId = 7;
    private const int MapTypeId = 8;
    private const int QueueTypeId = 9;

    private static readonly BufferedDurableHeapOptions NoAdvancer = new() { AdvancePeriod = Timeout.InfiniteTimeSpan };

    private static HeapFileOptions CannotGrow(string domain) => domain == "pmem"
        ? new HeapFileOptions { Size = 1L << 20, Domain = PersistenceDomainKind.Pmem }
        : new HeapFileOptions { Size = 1L << 20, MaxSize = 1L << 20, Domain = PersistenceDomainKind.MappedFile };

    /// <summary>
    /// A heap that cannot grow, filled with raw payloads, queue elements and map entries of the anti-payloads' own size
    /// class (16-byte entries: they compete with anti-payloads for blocks) until an insert throws. Used to throw on
    /// every Delete, Remove and TryDequeue; now they succeed without a Sync, a new insert still finds the heap full (the
    /// reserve is not given to it), and after a Sync and a reopen the deleted entries are gone and new inserts fit.
    /// The heap fills again and deletes still succeed (the reserve is rebuilt by recovery).
    /// </summary>
    [Theory]
    [InlineData("mapped")]
    [InlineData("pmem")]
    public void Deletes_OnAFullHeapThatCannotGrow_SucceedAndMakeRoom(string domain)
    {
        using var dir = new TempDirectory();
        string path = dir.File("full.heap");
        var raw = new List<PayloadRef>();
        var expected = new Dictionary<long, long>();
        long nextKey = 0;
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, CannotGrow(domain), NoAdvancer))
        {
            var map = new PersistentHashMap<long, long>(heap, MapTypeId);
            var queue = new PersistentQueue<long>(heap, QueueTypeId);
            for (int i = 0; i < 100; i++)
            {
                queue.Enqueue(i);
                using DurableOperation op = heap.BeginOperation();
                raw.Add(op.Allocate(200, RawTypeId));
            }

            nextKey = Fill(map, expected, nextKey);
            heap.Sync();

            // Without a Sync since the fill: 300 removes, 50 dequeues, 50 raw deletes (400 anti-payloads, within the reserve).
            foreach (long key in expected.Keys.Take(300).ToList())
            {
                Assert.True(map.Remove(key));
                expected.Remove(key);
            }

            for (int i = 0; i < 50; i++)
            {
                Assert.True(queue.TryDequeue(out long value));
                Assert.Equal(i, value);
            }

            for (int i = 0; i < 50; i++)
            {
                using DurableOperation op = heap.BeginOperation();
                op.Delete(raw[i]);
            }

            // The removed entries are not reclaimed yet, and the reserve is not for ordinary inserts.
            Assert.Throws<InsufficientMemoryException>(() => map.Set(-1, -1));
            heap.Sync();
        }

        using (BufferedDurableHeap heap = BufferedDurableHeap.Open(path, new HeapFileOptions { Domain = CannotGrow(domain).Domain }, NoAdvancer))
        {
            var map = new PersistentHashMap<long, long>(heap, MapTypeId);
            var queue = new PersistentQueue<long>(heap, QueueTypeId);
            Assert.Equal(expected, map.ToDictionary());
            Assert.Equal(Enumerable.Range(50, 50).Select(i => (long)i), queue.ToArray());
            Assert.Equal(50, heap.TakeRecoveredPayloads(RawTypeId).Count);

            // The room the deletes made: at least the 300 removed entries fit again.
            long before = expected.Count;
            nextKey = Fill(map, expected, nextKey);
            Assert.True(expected.Count >= before + 300, $"only {expected.Count - before} new entries fit after 300 removes");

            // Full again after the reopen: deletes still succeed.
            foreach (long key in expected.Keys.Take(100).ToList())
            {
                Assert.True(map.Remove(key));
                expected.Remove(key);
            }

            Assert.True(queue.TryDequeue(out long first));
            Assert.Equal(50, first);
            heap.Sync();
        }

        using (BufferedDurableHeap heap = BufferedDurableHeap.Open(path, new HeapFileOptions { Domain = CannotGrow(domain).Domain }, NoAdvancer))
        {
            Assert.Equal(expected, new PersistentHashMap<long, long>(heap, MapTypeId).ToDictionary());
            Assert.Equal(49, new PersistentQueue<long>(heap, QueueTypeId).Count);
        }
    }

    /// <summary>
    /// A burst of deletes on a full heap larger than the reserve (with a backlog limit too high for the deleting thread
    /// to advance by itself, which would reclaim the burst as it goes): the delete that finds the reserve taken throws,
    /// naming the reclamation that refills it; after Syncs, which reclaim the burst's deletes, deletes succeed again and
    /// new payloads fit.
    /// </summary>
    [Fact]
    public void ABurstOfDeletesBeyondTheReserve_ThrowsUntilASyncReclaims()
    {
        using var dir = new TempDirectory();
        var options = new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, ReclaimBacklogLimit = 1L << 30 };
        using BufferedDurableHeap heap = BufferedDurableHeap.Create(dir.File("burst.heap"), CannotGrow("mapped"), options);
        var live = new List<PayloadRef>();
        while (true)
        {
            using DurableOperation op = heap.BeginOperation();
            try
            {
                live.Add(op.Allocate(100, RawTypeId));
            }
            catch (InsufficientMemoryException)
            {
                break;
            }
        }

        // Durable first: a payload deleted in the version that allocated it needs no anti-payload.
        heap.Sync();
        int deleted = 0;
        InsufficientMemoryException? refused = null;
        while (refused is null && deleted < live.Count)
        {
            try
            {
                using DurableOperation op = heap.BeginOperation();
                op.Delete(live[deleted]);
                deleted++;
            }
            catch (InsufficientMemoryException e)
            {
                refused = e;
            }
        }

        Assert.NotNull(refused);
        Assert.True(deleted >= 1000, $"only {deleted} deletes before the reserve was taken");
        Assert.Contains("reclaimed", refused.Message, StringComparison.Ordinal);

        for (int i = 0; i < 3; i++)
        {
            heap.Sync();
        }

        using (DurableOperation op = heap.BeginOperation())
        {
            op.Delete(live[deleted]);
        }

        using (DurableOperation op = heap.BeginOperation())
        {
            op.Allocate(100, RawTypeId);
        }
    }

    /// <summary>
    /// A heap grows up to its maximum size and no further, its segment table included (a probe: the table was left out
    /// of the count, so a file created with a 4 MiB maximum grew 4 KiB past it, one with a 1 GiB maximum 128 KiB past,
    /// and at the table's limit about 128 MiB past); and it takes the whole room: a maximum that is exactly a table and
    /// 64 segments gets all 64.
    /// </summary>
    [Theory]
    [InlineData(0)]
    [InlineData(1)]
    [InlineData(-1)]
    [InlineData(HeapLayout.SegmentSize - 1)]
    public void Grow_StopsAtTheMaximumSizeWithTheTableCounted(int beyondAnExactFit)
    {
        long exactFit = HeapLayout.DataStart(64, 1 << 20) + (64L * HeapLayout.SegmentSize);
        long maxSize = exactFit + beyondAnExactFit;
        using var dir = new TempDirectory();
        string path = dir.File("capped.heap");
        long grown;
        using (var heap = PersistentHeap.Create(path, new HeapFileOptions { Size = 1 << 20, MaxSize = maxSize, Domain = PersistenceDomainKind.MappedFile }))
        {
            while (heap.TryAllocate(60_000, 1, out _))
            {
            }

            grown = heap.File.Size;
        }

        long length = new System.IO.FileInfo(path).Length;
        Assert.True(grown <= maxSize, $"The heap grew to {grown} bytes, past its maximum size of {maxSize}.");
        Assert.True(length <= maxSize, $"The file is {length} bytes long, past the maximum size of {maxSize}.");
        Assert.Equal(beyondAnExactFit < 0 ? exactFit - HeapLayout.SegmentSize : exactFit, grown);
    }

    /// <summary>
    /// A maximum size beyond what the segment table addresses (2^24 segments) used to be clamped silently (a heap of
    /// 130 MiB, room enough for the full table, was created with a 1 TiB maximum); now refused, leaving no file.
    /// </summary>
    [Fact]
    public void Create_MaxSizeBeyondTheSegmentTable_IsRefused()
    {
        using var dir = new TempDirectory();
        string path = dir.File("huge.heap");
        long tooLarge = HeapFile.MaxAddressableSize + 1;
        var e = Assert.Throws<ArgumentOutOfRangeException>(() => HeapFile.Create(path, new HeapFileOptions { Size = 130L << 20, MaxSize = tooLarge, Domain = PersistenceDomainKind.MappedFile }));
        Assert.Equal(nameof(HeapFileOptions.MaxSize), e.ParamName);
        Assert.Contains("segment table", e.Message, StringComparison.Ordinal);
        Assert.False(System.IO.File.Exists(path));

        using var domain = new SimulatedPersistenceDomain(1 << 20);
        Assert.Throws<ArgumentOutOfRangeException>(() => HeapFile.Create(domain, tooLarge));
        Assert.Throws<ArgumentOutOfRangeException>(() => HeapFile.Create(path, new HeapFileOptions { Size = 1L << 20, MaxSize = 4L << 40 }));
    }

    /// <summary>
    /// The libpmem domain never grows the file, yet a full heap's error advised a larger MaxSize (which it accepts,
    /// and ignores): it now names the domain and a larger Size, and the way to use the maximum size (the mapped-file domain).
    /// </summary>
    [Fact]
    public void HeapFull_InADomainThatCannotGrow_AdvisesALargerSize()
    {
        using var dir = new TempDirectory();
        using BufferedDurableHeap heap = BufferedDurableHeap.Create(dir.File("pm.heap"), new HeapFileOptions { Size = 1L << 20, MaxSize = 64L << 20, Domain = PersistenceDomainKind.Pmem }, NoAdvancer);
        InsufficientMemoryException? full = null;
        for (int i = 0; i < 10_000 && full is null; i++)
        {
            full = Record.Exception(() =>
            {
                using DurableOperation op = heap.BeginOperation();
                op.Allocate(4000, RawTypeId);
            }) as InsufficientMemoryException;
        }

        Assert.NotNull(full);
        Assert.DoesNotContain("larger HeapFileOptions.MaxSize", full.Message, StringComparison.Ordinal);
        Assert.Contains("larger HeapFileOptions.Size", full.Message, StringComparison.Ordinal);
        Assert.Contains("Pmem", full.Message, StringComparison.Ordinal);
        Assert.Contains("MappedFile", full.Message, StringComparison.Ordinal);
    }

    /// <summary>Sets new keys until the heap is full; returns the next key.</summary>
    internal static long Fill(PersistentHashMap<long, long> map, Dictionary<long, long> expected, long key)
    {
        for (; key < 1_000_000; key++)
        {
            try
            {
                map.Set(key, key * 3);
            }
            catch (InsufficientMemoryException)
            {
                return key;
            }

            expected[key] = key * 3;
        }

        throw new InvalidOperationException("the heap did not fill up");
    }

    /// <summary>
    /// A byte map value too large for the heap is refused naming the caller's argument, with nothing written: it was
    /// reported as a payload "size" that counted the key, undocumented on Set (found by an adversarial round, session 17).
    /// </summary>
    [Fact]
    public void ByteMap_AValueTooLargeForTheHeap_IsRefusedNamingTheValue()
    {
        using var domain = new SimulatedPersistenceDomain(4L << 20);
        using HeapFile file = HeapFile.Create(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, NoAdvancer);
        var map = new PersistentByteMap<long>(heap, typeId: 1);
        int largest = heap.Heap.MaxPayloadSize - sizeof(long);
        ArgumentOutOfRangeException e = Assert.Throws<ArgumentOutOfRangeException>(() => map.Set(1, new byte[largest + 1]));
        Assert.Equal("value", e.ParamName);
        Assert.Equal(0, map.Count);
        Assert.True(map.Set(2, new byte[100]));
    }

    /// <summary>
    /// A large payload that finds enough free segments in total but no run of them contiguous fails saying so: the error
    /// advised "free blocks", which cannot help a fragmented heap (found by an adversarial round, session 17). Nothing is
    /// written.
    /// </summary>
    [Fact]
    public void ALargePayloadOnAFragmentedHeap_FailsSayingTheFreeSpaceIsFragmented()
    {
        const long Size = 4L << 20;
        int oneSegment = HeapLayout.SegmentSize - HeapLayout.HeaderSize - sizeof(long);
        using var domain = new SimulatedPersistenceDomain(Size, Size);
        using HeapFile file = HeapFile.Create(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, NoAdvancer);
        var map = new PersistentByteMap<long>(heap, typeId: 1);
        long count = 0;
        try
        {
            while (true)
            {
                map.Set(count, new byte[oneSegment]);
                count++;
            }
        }
        catch (InsufficientMemoryException)
        {
        }

        for (long k = 0; k < count; k += 2)
        {
            map.Remove(k);
        }

        heap.Sync();
        heap.Sync();
        Assert.True(heap.Heap.GetStatistics().FreeSegments >= 4);
        long before = map.Count;
        InsufficientMemoryException e = Assert.Throws<InsufficientMemoryException>(() => map.Set(-1, new byte[2 * HeapLayout.SegmentSize]));
        Assert.Contains("fragmented", e.Message, StringComparison.Ordinal);
        Assert.Contains("contiguous", e.Message, StringComparison.Ordinal);
        Assert.Equal(before, map.Count);
    }

    /// <summary>
    /// After a crash that left a burst of deletes durable but not reclaimed (the reserve full of anti-payloads), the heap,
    /// once full again, still takes deletes: recovery designated the reserve before the durable layer freed those
    /// anti-payloads, so it picked a segment full of live entries and the former reserve's blocks went to ordinary inserts;
    /// every delete was then refused for good (found by a review of the reserve, session 17). With two advances (the
    /// deletes reclaimed before the crash) it held already: the comparison case.
    /// </summary>
    [Theory]
    [InlineData(1)]
    [InlineData(2)]
    public void ACrashAfterADurableBurstOfDeletes_LeavesDeletesWorkingOnceFullAgain(int advances)
    {
        const long Capacity = 1L << 20;
        using var domain = new SimulatedPersistenceDomain(Capacity, Capacity);
        var expected = new Dictionary<long, long>();
        byte[] image;
        using (HeapFile file = HeapFile.Create(domain))
        {
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, ReclaimBacklogLimit = 1L << 30 });
            var map = new PersistentHashMap<long, long>(heap, MapTypeId);
            Fill(map, expected, 0);
            heap.Sync();
            heap.Sync();

            // The newest keys (the highest segments) until the reserve is taken.
            foreach (long key in expected.Keys.OrderByDescending(k => k).ToList())
            {
                try
                {
                    Assert.True(map.Remove(key));
                    expected.Remove(key);
                }
                catch (InsufficientMemoryException)
                {
                    break;
                }
            }

            for (int i = 0; i < advances; i++)
            {
                heap.AdvanceVersion(TimeSpan.FromSeconds(30));
            }

            image = domain.GetDurableImage();
        }

        using var crashed = SimulatedPersistenceDomain.FromImage(image, Capacity);
        using HeapFile reopened = HeapFile.Open(crashed);
        using BufferedDurableHeap again = BufferedDurableHeap.Open(reopened, NoAdvancer);
        var recovered = new PersistentHashMap<long, long>(again, MapTypeId);
        var now = recovered.ToDictionary();
        Assert.Equal(expected, now);
        Fill(recovered, now, 500_000);
        Assert.True(recovered.Remove(now.Keys.First()), "the first delete of the full heap");
        again.Sync();
        Assert.True(recovered.Remove(now.Keys.Skip(1).First()), "a delete after a Sync");
    }

    /// <summary>
    /// A clean shutdown after the reserve set blocks aside saves the allocator state, and the next open uses it: the saved
    /// bitmap counted the set-aside blocks as allocated, the self-check refused it, and every open rescanned (found by a
    /// review of the reserve, session 17).
    /// </summary>
    [Theory]
    [InlineData("mapped")]
    [InlineData("pmem")]
    public void ACleanShutdownAfterBlocksWereSetAsideForDeletes_SavesTheStateForAFastReopen(string domain)
    {
        using var dir = new TempDirectory();
        string path = dir.File("saved.heap");
        var expected = new Dictionary<long, long>();
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, CannotGrow(domain), NoAdvancer))
        {
            var map = new PersistentHashMap<long, long>(heap, MapTypeId);
            long next = Fill(map, expected, 0);
            foreach (long key in expected.Keys.Take(300).ToList())
            {
                Assert.True(map.Remove(key));
                expected.Remove(key);
            }

            Assert.True(heap.Heap.ReserveSegmentForTesting >= 0);
            heap.Sync();
            heap.Sync();
            heap.Sync();
            Fill(map, expected, next);
            Assert.True(heap.Heap.ReserveBlocksForTesting > 0, "nothing was set aside (the scenario did not happen)");
            foreach (long[] chunk in expected.Keys.Where(k => k >= 20).Chunk(100).ToList())
            {
                foreach (long key in chunk)
                {
                    Assert.True(map.Remove(key));
                    expected.Remove(key);
                }

                heap.Sync();
            }

            heap.Sync();
            heap.Sync();
            Assert.True(heap.Heap.ReserveBlocksForTesting > 0, "nothing set aside at the shutdown (the scenario did not happen)");
        }

        using BufferedDurableHeap reopened = BufferedDurableHeap.Open(path, new HeapFileOptions { Domain = CannotGrow(domain).Domain }, NoAdvancer);
        Assert.True(reopened.Heap.OpenedFromSavedState, $"rescanned: {reopened.Heap.SavedStateRejection}");
        Assert.Equal(expected, new PersistentHashMap<long, long>(reopened, MapTypeId).ToDictionary());
    }

    /// <summary>
    /// A full heap that cannot grow, after deletes took the delete reserve and were reclaimed, saves its state at a clean
    /// shutdown, and the next open takes the fast path, twice over: the designated reserve segment, although wholly free,
    /// was never released for the saved state, so such a heap rescanned at every open while it stayed full (found by a
    /// SIGKILL probe of full heaps, session 17).
    /// </summary>
    [Theory]
    [InlineData("mapped", 200)]
    [InlineData("pmem", 200)]
    [InlineData("mapped", 1)]
    public void AFullHeapWhoseDeletesTookTheReserve_SavesItsStateAtACleanShutdown(string domain, int deletes)
    {
        using var dir = new TempDirectory();
        string path = dir.File("full.heap");
        var expected = new Dictionary<long, long>();
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, CannotGrow(domain), NoAdvancer))
        {
            var map = new PersistentHashMap<long, long>(heap, MapTypeId);
            Fill(map, expected, 0);
            heap.Sync();
            foreach (long key in expected.Keys.Take(deletes).ToList())
            {
                Assert.True(map.Remove(key));
                expected.Remove(key);
            }

            heap.Sync();
            heap.Sync();
            heap.Sync();
            Assert.True(heap.Heap.ReserveSegmentForTesting >= 0, "the deletes did not take the reserve (the scenario did not happen)");
        }

        for (int open = 0; open < 2; open++)
        {
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(path, new HeapFileOptions { Domain = CannotGrow(domain).Domain }, NoAdvancer);
            Assert.True(heap.Heap.OpenedFromSavedState, $"open {open} rescanned: {heap.Heap.SavedStateRejection}");
            var map = new PersistentHashMap<long, long>(heap, MapTypeId);
            Assert.Equal(expected, map.ToDictionary());
            long key = expected.Keys.First();
            Assert.True(map.Remove(key), "a delete of the full heap after the fast reopen");
            expected.Remove(key);
            heap.Sync();
            heap.Sync();
        }
    }

    /// <summary>
    /// Heaps whose deletes write no anti-payload keep no delete reserve: a transient buffered heap and a raw heap that
    /// cannot grow fill every segment, and the raw heap's full error says nothing of a reserve. Both withheld their last
    /// free segment, which nothing of theirs could ever use (found by a probe of the reserve, session 17).
    /// </summary>
    [Theory]
    [InlineData(true)]
    [InlineData(false)]
    public void HeapsWhoseDeletesWriteNoAntiPayload_FillEverySegment(bool transient)
    {
        const long Size = 1L << 20;
        using var domain = new SimulatedPersistenceDomain(Size, Size);
        using HeapFile file = HeapFile.Create(domain);
        if (transient)
        {
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, Mode = DurabilityMode.Transient });
            Fill(new PersistentHashMap<long, long>(heap, MapTypeId), new Dictionary<long, long>(), 0);
            Assert.Equal(0, heap.Heap.GetStatistics().FreeSegments);
            return;
        }

        using var raw = new PersistentHeap(file);
        InsufficientMemoryException? full = null;
        while (full is null)
        {
            try
            {
                raw.Allocate(100, RawTypeId);
            }
            catch (InsufficientMemoryException e)
            {
                full = e;
            }
        }

        Assert.Equal(0, raw.GetStatistics().FreeSegments);
        Assert.DoesNotContain("anti-payloads", full.Message, StringComparison.Ordinal);
    }
}
