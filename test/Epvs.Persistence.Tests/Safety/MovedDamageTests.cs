using System;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// Damage beyond single bit flips: words and ranges moved to where they do not belong (a descriptor copied or swapped
/// into another slot of the segment table) and a seeded corruption fuzz of a churned heap (garbage runs, zeroed and
/// swapped pages and segments, truncation, extension, random bytes, a copy taken while the heap is written) run in a
/// child process, so a crash fails the test instead of killing the runner.
/// </summary>
public sealed class MovedDamageTests
{
    private static readonly Dictionary<string, string> NoEnvironment = new();
    private static readonly HeapFileOptions FileOptions = new() { Size = 1L << 20, Domain = PersistenceDomainKind.MappedFile };
    private static readonly BufferedDurableHeapOptions Options = new() { AdvancePeriod = Timeout.InfiniteTimeSpan };
    private readonly ITestOutputHelper _output;

    public MovedDamageTests(ITestOutputHelper output) => _output = output;

    /// <summary>Every block of every class begins a multiple of <see cref="SizeClasses.Alignment"/> past its segment's
    /// start (and segments 64 KiB apart): the scans below look at each such offset for the block they want.</summary>
    private const int BlockStartStride = SizeClasses.Alignment;

    /// <summary>
    /// A descriptor is bound to its slot: a small segment's descriptor copied over another small segment's of the same
    /// generation, whose block size is a multiple of the other's (1024 over 64), made recovery read the 64-byte blocks
    /// at a 1024-byte stride — every sixteenth block is a valid header at its own offset — and open silently with 15 of
    /// every 16 map entries of that segment gone (found by the corruption fuzz, copy-descriptor, case 230). Since format 9
    /// the map's blocks are 48 bytes and the byte map's here 768 (16 of them).
    /// </summary>
    [Theory]
    [InlineData(false, false)]
    [InlineData(true, false)]
    [InlineData(false, true)]
    [InlineData(true, true)]
    public void DescriptorCopiedOrSwappedIntoAnotherSlot_IsReportedAsDamage_NotReadWithTheOtherBlockSize(bool crashed, bool swap)
    {
        using var dir = new TempDirectory();
        string path = dir.File("moved.heap");
        const int Entries = 900;
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, FileOptions, Options))
        {
            var map = new PersistentHashMap<long, long>(heap, typeId: 1);
            var bytes = new PersistentByteMap<long>(heap, typeId: 2);
            for (long k = 0; k < Entries; k++)
            {
                map.Set(k, k * 7);
            }

            for (long k = 0; k < 40; k++)
            {
                bytes.Set(k, new byte[700]);
            }
        }

        byte[] image = File.ReadAllBytes(path);
        (long small, ulong smallDescriptor) = FindSmall(image, cls: 0);
        (long large, ulong largeDescriptor) = FindSmall(image, cls: SizeClasses.ForPayload(700 + sizeof(long)));
        Assert.Equal(0, SizeClasses.BlockSizes[SizeClasses.ForPayload(700 + sizeof(long))] % SizeClasses.BlockSizes[0]);
        Assert.Equal(HeapLayout.DescriptorGeneration(smallDescriptor), HeapLayout.DescriptorGeneration(largeDescriptor));
        BitConverter.GetBytes(largeDescriptor).CopyTo(image, HeapLayout.SuperblockSize + (int)(small * sizeof(ulong)));
        if (swap)
        {
            BitConverter.GetBytes(smallDescriptor).CopyTo(image, HeapLayout.SuperblockSize + (int)(large * sizeof(ulong)));
        }

        if (crashed)
        {
            BitConverter.GetBytes(HeapLayout.Seal(0, HeapLayout.CleanShutdownOffset)).CopyTo(image, HeapLayout.CleanShutdownOffset);
        }

        File.WriteAllBytes(path, image);
        try
        {
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(path, FileOptions, Options);
            long count = new PersistentHashMap<long, long>(heap, typeId: 1).Count;
            Assert.Fail($"the file with descriptor {(swap ? "swapped" : "copied")} opened with {count} of {Entries} map entries and {heap.Recovery.DamagedBlocks.Count} damaged blocks reported");
        }
        catch (HeapFileException e)
        {
            Assert.Equal(HeapFileError.Corrupt, e.Error);
        }

        Assert.True(image.AsSpan(HeapLayout.SuperblockSize).SequenceEqual(File.ReadAllBytes(path).AsSpan(HeapLayout.SuperblockSize)), "a refused open changed the file past the superblock");
    }

    /// <summary>
    /// The seeded corruption fuzz (<see cref="CorruptionFuzz"/>): for every kind of damage, each damaged copy is refused
    /// or recovers exactly, and a salvaging open keeps only values their keys once had — never a crash, never silently
    /// wrong. The control (checks ignored) must be caught silently wrong, or the fuzz proves nothing.
    /// </summary>
    [Theory]
    [InlineData("garbage")]
    [InlineData("zero-page")]
    [InlineData("swap-pages")]
    [InlineData("ff-page")]
    [InlineData("copy-page")]
    [InlineData("zero-run")]
    [InlineData("copy-run")]
    [InlineData("swap-segments")]
    [InlineData("swap-descriptors")]
    [InlineData("copy-descriptor")]
    [InlineData("truncate")]
    [InlineData("extend")]
    [InlineData("fuzz")]
    [InlineData("copy-mid-write")]
    [InlineData("raw")]
    public void CorruptionFuzz_EveryDamagedCopy_IsRefusedOrExactOrSalvagedToPastValues_NeverSilentNorACrash(string kind)
    {
        using var dir = new TempDirectory();
        (int code, string output) = TestProgram.RunChild(NoEnvironment, CorruptionFuzz.Role, dir.Path, kind);
        _output.WriteLine(output);
        Assert.True(code == SafetyChild.Survived, $"exit {code}: {output}");
        if (kind is "extend" or "copy-mid-write" or "raw")
        {
            // Appended bytes are outside the heap: there is nothing for a control to miss. A copy taken mid-write has no
            // oracle (its pages are of different moments, which no check can tell from a consistent file): never a
            // crash, never an unexpected exception is all it asserts; so for a raw heap, whose payloads are never sealed.
            return;
        }

        using var controlDir = new TempDirectory();
        (int controlCode, string controlOutput) = TestProgram.RunChild(NoEnvironment, CorruptionFuzz.Role, controlDir.Path, kind, "control");
        _output.WriteLine($"control (checks ignored): exit {controlCode}: {controlOutput}");
        Assert.SkipWhen(controlCode == SafetyChild.Survived, "inconclusive: with the checks ignored no damaged copy was silently wrong, so the fuzz proves nothing");
    }

    /// <summary>
    /// A queue that lost a middle element to salvage opens with the survivors in order, keeping their sequence numbers
    /// (the gap is explained by the file's salvaged-through word): a crash right after it, or a later open, finds the
    /// same queue with no damage to report. It used to refuse to open (a gap in its order) at the salvaging open and at
    /// every later one, the survivors reachable only as raw payloads.
    /// </summary>
    [Fact]
    public void Queue_SalvagedWithAMiddleElementDropped_OpensWithTheSurvivorsInOrder_AndStaysOpenable()
    {
        using var dir = new TempDirectory();
        string path = CreateQueueWithElementTenDamaged(dir, free: false, out long victim);
        long[] expected = Enumerable.Range(0, 20).Where(i => i != 10).Select(i => i * 100L).ToArray();
        byte[] crashedAfterOpen;
        using (BufferedDurableHeap salvaged = BufferedDurableHeap.Open(path, FileOptions, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, SalvageDamagedBlocks = true }))
        {
            Assert.Contains(victim, salvaged.Recovery.DamagedBlocks);
            Assert.SkipWhen(salvaged.Heap.File.MappedFileWriteBack != MappedFileWriteBack.PrivateMapping, "needs a private mapping (Linux), whose file holds only what was written back");
            var queue = new PersistentQueue<long>(salvaged, typeId: 3);
            Assert.Equal(expected, queue.ToArray());
            Assert.Equal(Enumerable.Range(0, 20).Where(i => i != 10).Select(i => (long)i), queue.Sequences());

            // What the file holds now (a private mapping: only what was written back) is what a crash now would leave:
            // the damaged block is freed already, and the gap must still be accepted.
            crashedAfterOpen = CorruptionFuzz.ReadPastTheLock(path);
            queue.Enqueue(2000);
        }

        string crashed = dir.File("crashed.heap");
        File.WriteAllBytes(crashed, crashedAfterOpen);
        using (BufferedDurableHeap afterCrash = BufferedDurableHeap.Open(crashed, FileOptions, Options))
        {
            Assert.Empty(afterCrash.Recovery.DamagedBlocks);
            Assert.Equal(expected, new PersistentQueue<long>(afterCrash, typeId: 3).ToArray());
        }

        using BufferedDurableHeap reopened = BufferedDurableHeap.Open(path, FileOptions, Options);
        Assert.Empty(reopened.Recovery.DamagedBlocks);
        var again = new PersistentQueue<long>(reopened, typeId: 3);
        Assert.Equal(expected.Append(2000), again.ToArray());
        Assert.True(again.TryDequeue(out long head) && head == 0);
    }

    /// <summary>
    /// A salvaged queue opens on a heap with no room left: opening writes nothing. It used to renumber the survivors
    /// with a copy each, threw InsufficientMemoryException part-way, and the copies it had made became durable with the
    /// next Sync (or the clean Dispose): a gap next to an element tagged after the salvage, which every later open
    /// refused as not a consistent prefix, with no damage left to salvage (found by an adversarial round).
    /// </summary>
    [Fact]
    public void Queue_SalvagedOnAFullHeap_Opens_AndEveryLaterOpenAcceptsIt()
    {
        using var dir = new TempDirectory();
        string path = CreateQueueWithElementTenDamaged(dir, free: false, out long victim);
        long[] expected = Enumerable.Range(0, 20).Where(i => i != 10).Select(i => i * 100L).ToArray();
        var salvage = new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, SalvageDamagedBlocks = true };
        using (BufferedDurableHeap heap = BufferedDurableHeap.Open(path, FileOptions, salvage))
        {
            Assert.Contains(victim, heap.Recovery.DamagedBlocks);
            int filled = FillWithEmptyPayloads(heap);
            Assert.True(filled > 0);
            Assert.Throws<InsufficientMemoryException>(() =>
            {
                using DurableOperation op = heap.BeginOperation();
                op.Allocate(0, typeId: 99);
            });

            Assert.Equal(expected, new PersistentQueue<long>(heap, typeId: 3).ToArray());
            heap.Sync();
        }

        foreach (BufferedDurableHeapOptions options in new[] { Options, salvage })
        {
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(path, FileOptions, options);
            Assert.Empty(heap.Recovery.DamagedBlocks);
            Assert.True(heap.Recovery.SalvagedThrough > 0);
            Assert.Equal(expected, new PersistentQueue<long>(heap, typeId: 3).ToArray());
        }
    }

    /// <summary>
    /// A second salvage, of a file whose first salvage's session crashed right after the queue opened, that drops
    /// another element: the queue opens with every other element in order. It used to refuse: the first salvage had
    /// renumbered the survivors with copies, the crash left their older copies on the file, and dropping one copy brought
    /// back its element's older copy with a sequence number its successor's copy held (found by an adversarial round).
    /// </summary>
    [Fact]
    public void Queue_SalvagedAgainAfterACrash_KeepsEverySurvivorInOrder()
    {
        using var dir = new TempDirectory();
        string path = CreateQueueWithElementTenDamaged(dir, free: false, out _);
        var salvage = new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, SalvageDamagedBlocks = true };
        byte[] crashed;
        using (BufferedDurableHeap heap = BufferedDurableHeap.Open(path, FileOptions, salvage))
        {
            Assert.SkipWhen(heap.Heap.File.MappedFileWriteBack != MappedFileWriteBack.PrivateMapping, "needs a private mapping (Linux), whose file holds only what was written back");
            _ = new PersistentQueue<long>(heap, typeId: 3);
            crashed = CorruptionFuzz.ReadPastTheLock(path);
        }

        // The block the open queue reads for 1100 (its newest copy), damaged.
        long dataStart = BitConverter.ToInt64(crashed, HeapLayout.DataStartOffset);
        long second = -1;
        long newest = -1;
        for (long at = dataStart; at < crashed.Length - HeapLayout.HeaderSize - 16; at += BlockStartStride)
        {
            ulong commit = BitConverter.ToUInt64(crashed, (int)at + HeapLayout.CommitOffset);
            long epoch = BitConverter.ToInt64(crashed, (int)at + HeapLayout.EpochOffset);
            if (HeapLayout.InUse(commit) && BitConverter.ToInt64(crashed, (int)at + HeapLayout.HeaderSize + 8) == 1100 && epoch > newest)
            {
                (second, newest) = (at, epoch);
            }
        }

        Assert.True(second > 0, "the element 1100 was not found");
        Array.Clear(crashed, (int)second + HeapLayout.CommitOffset, sizeof(ulong));
        string again = dir.File("again.heap");
        File.WriteAllBytes(again, crashed);
        using BufferedDurableHeap salvaged = BufferedDurableHeap.Open(again, FileOptions, salvage);
        Assert.Contains(second, salvaged.Recovery.DamagedBlocks);
        long[] items = new PersistentQueue<long>(salvaged, typeId: 3).ToArray();

        // Every element but the two damaged ones, in order (1100 may come back from an older copy of it).
        long[] original = Enumerable.Range(0, 20).Select(i => i * 100L).ToArray();
        Assert.Equal(original.Where(v => items.Contains(v)), items);
        Assert.Equal(original.Where(v => v is not 1000 and not 1100), items.Where(v => v != 1100));
    }

    /// <summary>Allocates empty raw payloads (type id 99) until the heap is full; returns how many.</summary>
    private static int FillWithEmptyPayloads(BufferedDurableHeap heap)
    {
        for (int filled = 0; ; filled++)
        {
            using DurableOperation op = heap.BeginOperation();
            try
            {
                op.Allocate(0, typeId: 99);
            }
            catch (InsufficientMemoryException)
            {
                return filled;
            }
        }
    }

    /// <summary>
    /// A gap with no damage reported (an element's commit word replaced by a valid free word: a lost write) is an
    /// inconsistent heap: refused, naming the queue by the caller's type id (it named the stored id with the
    /// structure's kind bits, 50331651 for 3).
    /// </summary>
    [Fact]
    public void Queue_WithAGapAndNoDamageReported_IsRefusedNamingItsTypeId()
    {
        using var dir = new TempDirectory();
        string path = CreateQueueWithElementTenDamaged(dir, free: true, out _);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(path, FileOptions, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, SalvageDamagedBlocks = true });
        Assert.Empty(heap.Recovery.DamagedBlocks);
        InvalidDataException e = Assert.Throws<InvalidDataException>(() => new PersistentQueue<long>(heap, typeId: 3));
        Assert.Contains("queue with type id 3 ", e.Message, StringComparison.Ordinal);
    }

    /// <summary>A closed heap whose queue (type id 3) held 0, 100, ..., 1900; the block of 1000 (sequence 10) has a zeroed commit word, or a valid free one.</summary>
    private static string CreateQueueWithElementTenDamaged(TempDirectory dir, bool free, out long victim)
    {
        string path = dir.File("queue.heap");
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, FileOptions, Options))
        {
            var queue = new PersistentQueue<long>(heap, typeId: 3);
            for (long i = 0; i < 20; i++)
            {
                queue.Enqueue(i * 100);
            }
        }

        byte[] image = File.ReadAllBytes(path);
        long dataStart = BitConverter.ToInt64(image, HeapLayout.DataStartOffset);
        victim = -1;
        for (long at = dataStart; at < image.Length - HeapLayout.HeaderSize - 16 && victim < 0; at += BlockStartStride)
        {
            ulong commit = BitConverter.ToUInt64(image, (int)at + HeapLayout.CommitOffset);
            if (HeapLayout.InUse(commit) && BitConverter.ToInt64(image, (int)at + HeapLayout.HeaderSize) == 10 && BitConverter.ToInt64(image, (int)at + HeapLayout.HeaderSize + 8) == 1000)
            {
                victim = at;
            }
        }

        Assert.True(victim > 0, "the element with sequence 10 was not found");
        long segment = (victim - dataStart) / HeapLayout.SegmentSize;
        uint generation = HeapLayout.DescriptorGeneration(BitConverter.ToUInt64(image, HeapLayout.SuperblockSize + (int)(segment * sizeof(ulong))));
        BitConverter.GetBytes(free ? HeapLayout.FreeWord(victim, generation) : 0UL).CopyTo(image, (int)victim + HeapLayout.CommitOffset);
        File.WriteAllBytes(path, image);
        return path;
    }

    /// <summary>
    /// An open refused for damage closes nothing in order: the next open must not report a clean shutdown. A crashed
    /// file (clean word cleared) refused once as damaged used to read as cleanly closed afterwards, for the buffered and
    /// the raw heap alike, because the refused open's cleanup marked the file clean.
    /// </summary>
    [Theory]
    [InlineData(false, false)]
    [InlineData(true, false)]
    [InlineData(false, true)]
    [InlineData(true, true)]
    public void RefusedOpenOfACrashedFile_LeavesItReportedAsNotCleanlyClosed(bool raw, bool callerOwnsTheFile)
    {
        using var dir = new TempDirectory();
        string path = dir.File("crashed.heap");
        long victim = -1;
        if (raw)
        {
            using PersistentHeap heap = PersistentHeap.Create(path, FileOptions);
            PayloadRef block = heap.Allocate(100, typeId: 1);
            heap.Persist(block);
            victim = block.Offset;
        }
        else
        {
            using BufferedDurableHeap heap = BufferedDurableHeap.Create(path, FileOptions, Options);
            var map = new PersistentHashMap<long, long>(heap, typeId: 1);
            for (long k = 0; k < 100; k++)
            {
                map.Set(k, k);
            }

            heap.Sync();
            heap.Heap.ForEachAllocated((block, _) => Interlocked.CompareExchange(ref victim, block.Offset, -1));
        }

        byte[] image = File.ReadAllBytes(path);
        BitConverter.GetBytes(HeapLayout.Seal(0, HeapLayout.CleanShutdownOffset)).CopyTo(image, HeapLayout.CleanShutdownOffset);
        Array.Clear(image, (int)victim + HeapLayout.CommitOffset, sizeof(ulong));
        File.WriteAllBytes(path, image);
        Assert.Equal(HeapFileError.Corrupt, Assert.Throws<HeapFileException>(() => Open(salvage: false)).Error);
        bool reportedClean = Open(salvage: true);
        Assert.False(reportedClean, "a crashed file, refused once as damaged, was reported as cleanly closed");

        bool Open(bool salvage)
        {
            if (callerOwnsTheFile)
            {
                // The caller opens the file and disposes it itself, after the heap's open failed (or the heap's Dispose).
                using HeapFile file = HeapFile.Open(path, FileOptions);
                if (raw)
                {
                    using var onFile = new PersistentHeap(file, new PersistentHeapOptions { SalvageDamagedBlocks = salvage });
                }
                else
                {
                    using BufferedDurableHeap onFile = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, SalvageDamagedBlocks = salvage });
                }

                return file.WasCleanShutdown;
            }

            if (raw)
            {
                using PersistentHeap heap = PersistentHeap.Open(path, FileOptions, new PersistentHeapOptions { SalvageDamagedBlocks = salvage });
                return heap.File.WasCleanShutdown;
            }

            using BufferedDurableHeap buffered = BufferedDurableHeap.Open(path, FileOptions, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, SalvageDamagedBlocks = salvage });
            return buffered.Recovery.WasCleanShutdown;
        }
    }

    /// <summary>
    /// Salvage that drops a damaged anti-payload brings back the payload it cancelled; for a key removed and inserted
    /// again (a new uid, here in the same version) the map then holds two payloads of one key. It used to refuse to
    /// open (InvalidDataException), at the salvaging open and at every later one; now the newer version is the key's
    /// value, the older payload is deleted durably before the constructor returns, and a crash right after it opens
    /// without damage to the same map.
    /// </summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void Map_SalvageDroppingTheAntiPayloadOfAReinsertedKey_KeepsTheNewerValue_AndStaysOpenable(bool byteMap)
    {
        const long Capacity = 1L << 20;
        byte[] image;
        using (var domain = new SimulatedPersistenceDomain(Capacity))
        {
            using HeapFile file = HeapFile.Create(domain);
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, Options);
            var map = new MapOf(heap, byteMap);
            map.Set(7, 70);
            map.Set(8, 80);
            heap.AdvanceVersion(TimeSpan.FromSeconds(30));
            heap.AdvanceVersion(TimeSpan.FromSeconds(30));

            // Removed and inserted again in one version: an anti-payload for the old uid, a payload of a new uid.
            using (DurableOperation op = heap.BeginOperation())
            {
                Assert.True(map.Remove(7));
                map.Set(7, 71);
            }

            // Durable, not yet reclaimed: the old payload and its anti-payload are both still on the medium.
            heap.AdvanceVersion(TimeSpan.FromSeconds(30));
            image = domain.GetDurableImage();
        }

        long anti = -1;
        long dataStart = BitConverter.ToInt64(image, HeapLayout.DataStartOffset);
        for (long at = dataStart; at < image.Length - HeapLayout.HeaderSize; at += BlockStartStride)
        {
            ulong commit = BitConverter.ToUInt64(image, (int)at + HeapLayout.CommitOffset);
            if (HeapLayout.InUse(commit) && HeapLayout.CommitKind(commit) == PayloadKind.Delete)
            {
                Assert.True(anti < 0, "more than one anti-payload");
                anti = at;
            }
        }

        Assert.True(anti > 0, "no anti-payload on the medium");
        Array.Clear(image, (int)anti + HeapLayout.CommitOffset, sizeof(ulong));

        byte[] afterSalvage;
        using (var domain = SimulatedPersistenceDomain.FromImage(image, Capacity))
        {
            using HeapFile file = HeapFile.Open(domain);
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, SalvageDamagedBlocks = true });
            Assert.Contains(anti, heap.Recovery.DamagedBlocks);
            var map = new MapOf(heap, byteMap);
            Assert.Equal(71, map.Get(7));
            Assert.Equal(80, map.Get(8));
            Assert.Equal(2, map.Count);

            // A power failure right after the open: what is durable now.
            afterSalvage = domain.GetDurableImage();
        }

        using (var domain = SimulatedPersistenceDomain.FromImage(afterSalvage, Capacity))
        {
            using HeapFile file = HeapFile.Open(domain);
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, Options);
            Assert.Empty(heap.Recovery.DamagedBlocks);
            var map = new MapOf(heap, byteMap);
            Assert.Equal(71, map.Get(7));
            Assert.Equal(2, map.Count);
        }
    }

    /// <summary>A hash map or a byte map of long values, behind one face for the salvage test.</summary>
    private sealed class MapOf
    {
        private readonly PersistentHashMap<long, long>? _map;
        private readonly PersistentByteMap<long>? _bytes;

        internal MapOf(BufferedDurableHeap heap, bool byteMap)
        {
            if (byteMap)
            {
                _bytes = new PersistentByteMap<long>(heap, typeId: 4);
            }
            else
            {
                _map = new PersistentHashMap<long, long>(heap, typeId: 4);
            }
        }

        internal long Count => _map?.Count ?? _bytes!.Count;

        internal void Set(long key, long value)
        {
            if (_map is not null)
            {
                _map.Set(key, value);
            }
            else
            {
                _bytes!.Set(key, BitConverter.GetBytes(value));
            }
        }

        internal bool Remove(long key) => _map?.Remove(key) ?? _bytes!.Remove(key);

        internal long Get(long key) => _map is not null ? (_map.TryGetValue(key, out long v) ? v : -1) : _bytes!.Get(key) is byte[] b ? BitConverter.ToInt64(b) : -1;
    }

    private static (long Segment, ulong Descriptor) FindSmall(byte[] image, int cls)
    {
        long dataStart = BitConverter.ToInt64(image, HeapLayout.DataStartOffset);
        long heapSize = (long)(BitConverter.ToUInt64(image, HeapLayout.HeapSizeOffset) & HeapLayout.SealedValueMask);
        for (long s = 0; s < (heapSize - dataStart) / HeapLayout.SegmentSize; s++)
        {
            ulong descriptor = BitConverter.ToUInt64(image, HeapLayout.SuperblockSize + (int)(s * sizeof(ulong)));
            if (HeapLayout.DescriptorRole(descriptor) == HeapLayout.RoleSmall && HeapLayout.DescriptorPayload(descriptor) == cls)
            {
                return (s, descriptor);
            }
        }

        throw new InvalidOperationException($"no segment of class {cls}");
    }
}
