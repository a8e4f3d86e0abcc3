using System;
using System.Collections.Generic;
using System.Linq;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// Issue 10, formats 6 and 7: a buffered heap seals a version in the pass that writes it back, under one fence, so a
/// crash can leave a durable seal over bytes that are not. Recovery frees a sealed block whose check fails as a torn
/// write only when its Epoch word holds the block's empty mark (<see cref="HeapLayout.EmptyEpoch"/>, bound to the
/// offset; 0 in format 6) — a free whose mark reached the file without its free word, or a seal over an Epoch word that
/// did not — or its version tag and Epoch word both name the version in flight (the durable frontier + 1). A damaged
/// block of a durable version holds its own version in both, so damage is never taken for a torn write by one
/// coincidence, and a zeroed Epoch word never passes. Formatting writes the empty mark, every free writes it with its
/// free word (durable together before the block is handed out again), and recovery rewrites free blocks that hold
/// anything else. Each rule has a broken control.
/// </summary>
public sealed unsafe class TornSealTests
{
    private const int TypeId = 12;
    private const int PayloadSize = 40;

    [Fact]
    public void ASealOfTheVersionInFlight_OverBytesThatDidNotReachTheFile_IsTorn_WithThatVersionOrTheEmptyMarkInTheEpochWord()
    {
        const long InFlight = 1000;
        byte[] block = SealedBlock(InFlight, out long offset, out uint generation);
        fixed (byte* p = block)
        {
            ulong* h = (ulong*)p;
            p[HeapLayout.HeaderSize + 3] ^= 0x40;
            Assert.Equal(BlockState.Torn, HeapLayout.Classify(p, offset, generation, 1024, out _, InFlight));

            // The Epoch word as formatting or a free left it (the empty mark), or zeroed, or as an older use left it,
            // or the empty mark of another block, or the payload of a durable version.
            h[1] = HeapLayout.EmptyEpoch(offset);
            Assert.Equal(BlockState.Torn, HeapLayout.Classify(p, offset, generation, 1024, out _, InFlight));
            h[1] = 0;
            Assert.Equal(BlockState.Damaged, HeapLayout.Classify(p, offset, generation, 1024, out _, InFlight));
            h[1] = HeapLayout.EmptyEpoch(offset + 64);
            Assert.Equal(BlockState.Damaged, HeapLayout.Classify(p, offset, generation, 1024, out _, InFlight));
            h[1] = InFlight - 3;
            Assert.Equal(BlockState.Damaged, HeapLayout.Classify(p, offset, generation, 1024, out _, InFlight));
            h[1] = InFlight;
            Assert.Equal(BlockState.Damaged, HeapLayout.Classify(p, offset, generation, 1024, out _, InFlight + 1));
            Assert.Equal(BlockState.Damaged, HeapLayout.Classify(p, offset, generation, 1024, out _));
            Assert.Equal(BlockState.Damaged, HeapLayout.Classify(p, offset, generation, 1024, out _, InFlight + 65536));
        }
    }

    /// <summary>
    /// The block of the last durable version F (even, so that flipping the tag's lowest bit names F + 1, the version in
    /// flight): every single-bit flip of header or payload is still damage. The control trusts the tag alone.
    /// </summary>
    [Fact]
    public void ABlockOfTheLastDurableVersion_EverySingleBitFlip_IsDamage_WhileTheNextVersionIsInFlight()
    {
        Assert.Empty(FlipsNotTakenForDamage(HeapFaults.None));
    }

    [Fact]
    public void Control_TornSealsRecognisedByTheVersionTagAlone_IsCaught()
    {
        List<string> missed = FlipsNotTakenForDamage(HeapFaults.TornSealsByVersionTagOnly);
        Assert.True(missed.Count > 0, "INCONCLUSIVE: the control took every flip for damage");
    }

    /// <summary>
    /// A block of the last durable version whose Epoch word holds its empty mark: a free of it (garbage, its replacement
    /// durable) whose mark reached the file without its free word — torn, freed. The control takes it for damage.
    /// </summary>
    [Fact]
    public void ABlockOfTheLastDurableVersion_WithItsEmptyMarkInTheEpochWord_IsAFreeTheCrashInterrupted()
    {
        Assert.Equal(BlockState.Torn, OverwrittenEpochWord(4242, HeapLayout.EmptyEpoch, HeapFaults.None));
        Assert.Equal(BlockState.Damaged, OverwrittenEpochWord(4242, HeapLayout.EmptyEpoch, HeapFaults.MarkedFreesAreDamage));
    }

    /// <summary>An Epoch word damaged into the version in flight, in a block of the last durable version, is damage: its tag names its own version. The control trusts the Epoch word alone.</summary>
    [Fact]
    public void ABlockOfTheLastDurableVersion_WithTheVersionInFlightInItsEpochWord_IsDamage()
    {
        Assert.Equal(BlockState.Damaged, OverwrittenEpochWord(4242, _ => 4243, HeapFaults.None));
        Assert.Equal(BlockState.Torn, OverwrittenEpochWord(4242, _ => 4243, HeapFaults.TornSealsByEpochWordOnly));
    }

    /// <summary>
    /// Format 6's residual case, closed by the empty mark: a live block of a durable version whose tag equals the tag of
    /// the version in flight (65,536 versions older) and whose Epoch word was zeroed (a zeroed range of the file) is
    /// damage, as the word is neither that version nor the block's mark. The control trusts the tag alone.
    /// </summary>
    [Fact]
    public void AnOlderBlockWithTheTagOfTheVersionInFlight_WithItsEpochWordZeroed_IsDamage()
    {
        Assert.Equal(BlockState.Damaged, OverwrittenEpochWord(4242, _ => 0, HeapFaults.None, inFlight: 4242 + 65536));
        Assert.Equal(BlockState.Torn, OverwrittenEpochWord(4242, _ => 0, HeapFaults.TornSealsByVersionTagOnly, inFlight: 4242 + 65536));
    }

    /// <summary>
    /// After the frees are swept (durable in the sweep log) and a crash, recovery writes them into the blocks: every free
    /// block in the durable image then holds its empty mark in its Epoch word, and so does every unused block
    /// (formatting writes it). The control leaves the Epoch word as it was (0 after formatting).
    /// </summary>
    [Fact]
    public void AfterASweep_EveryFreeOrUnusedBlockInTheDurableImage_HoldsItsEmptyMark()
    {
        Assert.Equal((0, 0), UnmarkedEmptyBlocks(HeapFaults.None, out int free, out int unused));
        Assert.True(free > 0 && unused > 0, $"{free} free and {unused} unused blocks: the scenario exercised too little");
        (int controlFree, int controlUnused) = UnmarkedEmptyBlocks(HeapFaults.LeaveEpochWordsUnmarked, out _, out _);
        Assert.True(controlFree > 0 && controlUnused > 0, $"INCONCLUSIVE: the control left {controlFree} free and {controlUnused} unused blocks unmarked");
    }

    /// <summary>
    /// Frees write the empty mark next to the free word, in the same write-back: some enumerated crash image of the small
    /// run holds a mark without its free word. Recovery frees such a block; the control, which takes it for damage, makes
    /// a plain crash read as damage.
    /// </summary>
    [Fact]
    public void Control_MarkedFreesTakenForDamage_MakeAPlainCrashReadAsDamage()
    {
        List<string> violations = BufferedDurabilityCrashTests.EnumerateCrashes(DurabilityFaults.None, DurabilityFaults.None, out int images, out _, heapFaults: HeapFaults.MarkedFreesAreDamage);
        Assert.True(images > 100, $"only {images} crash images");
        Assert.True(violations.Any(v => v.Contains("damaged blocks", StringComparison.Ordinal)), $"INCONCLUSIVE: no image of the control reported damage ({violations.Count} violations)");
    }

    /// <summary>
    /// A large block's segment is formatted with the empty mark in its header's Epoch word, durably, before the block is
    /// handed out: in the durable image taken before the version is written back, the header is the formatted one. The
    /// control leaves 0 there.
    /// </summary>
    [Fact]
    public void ALargeBlock_IsFormattedWithItsEmptyMark()
    {
        (long offset, ulong word) = LargeHeaderEpochWordBeforeWriteBack(HeapFaults.None);
        Assert.Equal(HeapLayout.EmptyEpoch(offset), word);
        Assert.Equal(0UL, LargeHeaderEpochWordBeforeWriteBack(HeapFaults.LeaveEpochWordsUnmarked).Word);
    }

    /// <summary>
    /// An allocation a crash interrupted before its commit word leaves its Epoch word in a free (or unused) block:
    /// recovery rewrites it to the block's empty mark, durably, before the block is handed out.
    /// </summary>
    [Fact]
    public void Recovery_MarksEmptyTheEpochWordOfAFreeBlockThatHoldsAVersion()
    {
        ulong recovered = EpochWordAfterRecovery(HeapFaults.None, out long victim);
        Assert.Equal(HeapLayout.EmptyEpoch(victim), recovered);
        Assert.Equal(77UL, EpochWordAfterRecovery(HeapFaults.LeaveEpochWordsUnmarked, out _));
    }

    /// <summary>
    /// The chain of the rule end to end: in the enumerated crash images of the small run (whose blocks are freed and
    /// reused), Epoch words left unmarked (0 after formatting, a freed block's version) make some torn seal read as damage after a plain
    /// crash. (The enumeration without the control, which must report nothing, is in <see cref="BufferedDurabilityCrashTests"/>.)
    /// </summary>
    [Fact]
    public void Control_EpochWordsLeftUnmarked_MakeAPlainCrashReadAsDamage()
    {
        List<string> violations = BufferedDurabilityCrashTests.EnumerateCrashes(DurabilityFaults.None, DurabilityFaults.None, out int images, out _, heapFaults: HeapFaults.LeaveEpochWordsUnmarked);
        Assert.True(images > 100, $"only {images} crash images");
        Assert.True(violations.Any(v => v.Contains("damaged blocks", StringComparison.Ordinal)), $"INCONCLUSIVE: no image of the control reported damage ({violations.Count} violations)");
    }

    private static byte[] SealedBlock(long version, out long offset, out uint generation)
    {
        var random = new Random((int)version);
        offset = 4096 * 3 + (64L * random.Next(1000));
        generation = (uint)random.Next(1, 1 << 24);
        byte[] block = new byte[HeapLayout.HeaderSize + PayloadSize];
        random.NextBytes(block.AsSpan(HeapLayout.HeaderSize));
        ulong uid = (ulong)random.NextInt64(1, long.MaxValue), shape = HeapLayout.Shape(PayloadSize, random.Next(1 << 20));
        ulong commit = HeapLayout.SealedCommit(uid, (ulong)version, shape, offset, generation, (PayloadKind)random.Next(1, 4), block.AsSpan(HeapLayout.HeaderSize));
        BitConverter.TryWriteBytes(block.AsSpan(0), uid);
        BitConverter.TryWriteBytes(block.AsSpan(8), (ulong)version);
        BitConverter.TryWriteBytes(block.AsSpan(16), shape);
        BitConverter.TryWriteBytes(block.AsSpan(24), commit);
        return block;
    }

    private static List<string> FlipsNotTakenForDamage(HeapFaults faults)
    {
        var missed = new List<string>();
        foreach (long durable in new long[] { 2, 1000, 65534, 65536, 1L << 33 })
        {
            byte[] block = SealedBlock(durable, out long offset, out uint generation);
            fixed (byte* p = block)
            {
                Assert.Equal(BlockState.Sealed, HeapLayout.Classify(p, offset, generation, 1024, out _, durable + 1, faults));
                for (int bit = 0; bit < block.Length * 8; bit++)
                {
                    p[bit / 8] ^= (byte)(1 << (bit % 8));
                    BlockState state = HeapLayout.Classify(p, offset, generation, 1024, out _, durable + 1, faults);
                    p[bit / 8] ^= (byte)(1 << (bit % 8));
                    if (state != BlockState.Damaged)
                    {
                        missed.Add($"version {durable}, bit {bit}: {state}");
                    }
                }
            }
        }

        return missed;
    }

    /// <summary>Classifies a sealed block of <paramref name="durable"/> whose Epoch word was overwritten (with <paramref name="word"/> of the block's offset) while <paramref name="inFlight"/> (default: the next version) is in flight.</summary>
    private static BlockState OverwrittenEpochWord(long durable, Func<long, ulong> word, HeapFaults faults, long inFlight = 0)
    {
        byte[] block = SealedBlock(durable, out long offset, out uint generation);
        fixed (byte* p = block)
        {
            ((ulong*)p)[1] = word(offset);
            return HeapLayout.Classify(p, offset, generation, 1024, out _, inFlight == 0 ? durable + 1 : inFlight, faults);
        }
    }

    /// <summary>Fills a map, replaces every value over a few versions, flushes the parked frees; counts the free and the unused blocks of the durable image whose Epoch word is not their empty mark.</summary>
    private static (int Free, int Unused) UnmarkedEmptyBlocks(HeapFaults faults, out int free, out int unused)
    {
        using var domain = new SimulatedPersistenceDomain(4 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, HeapFaults = faults });
        var map = new PersistentHashMap<long, long>(heap, TypeId);
        for (int round = 0; round < 4; round++)
        {
            for (long k = 0; k < 200; k++)
            {
                map.Set(k, k + round);
            }

            heap.Sync();
        }

        heap.Sync();
        heap.Sync();
        heap.Heap.FlushPendingFrees();

        // The sweeps made their frees durable in the sweep log (format 10); a crash now, and recovery writes them into
        // the blocks, each with its mark.
        using var recovered = SimulatedPersistenceDomain.FromImage(domain.GetDurableImage(), 4 << 20);
        using HeapFile recoveredFile = HeapFile.Open(recovered);
        using BufferedDurableHeap recoveredHeap = BufferedDurableHeap.Open(recoveredFile, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, HeapFaults = faults });
        byte[] image = recovered.GetDurableImage();
        free = 0;
        unused = 0;
        int unmarkedFree = 0, unmarkedUnused = 0;
        foreach (long offset in SmallBlocks(image))
        {
            ulong commit = BitConverter.ToUInt64(image, (int)offset + HeapLayout.CommitOffset);
            bool unmarked = BitConverter.ToUInt64(image, (int)offset + HeapLayout.EpochOffset) != HeapLayout.EmptyEpoch(offset);
            if (HeapLayout.CommitState(commit) == HeapLayout.StateFree)
            {
                free++;
                unmarkedFree += unmarked ? 1 : 0;
            }
            else if (HeapLayout.CommitState(commit) == HeapLayout.StateUnused)
            {
                unused++;
                unmarkedUnused += unmarked ? 1 : 0;
            }
        }

        return (unmarkedFree, unmarkedUnused);
    }

    /// <summary>Writes an Epoch word into a never-used block of a live segment of a crashed image, recovers, and returns that word as recovery left it in the file.</summary>
    private static ulong EpochWordAfterRecovery(HeapFaults faults, out long victim)
    {
        byte[] image;
        using (var domain = new SimulatedPersistenceDomain(4 << 20))
        {
            using HeapFile file = HeapFile.Create(domain);
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
            var map = new PersistentHashMap<long, long>(heap, TypeId);
            for (long k = 0; k < 20; k++)
            {
                map.Set(k, k);
            }

            heap.Sync();
            image = domain.GetDurableImage();
        }

        victim = SmallBlocks(image).Last(o => HeapLayout.CommitState(BitConverter.ToUInt64(image, (int)o + HeapLayout.CommitOffset)) == HeapLayout.StateUnused);
        BitConverter.GetBytes(77UL).CopyTo(image, (int)victim + HeapLayout.EpochOffset);
        using (var domain = SimulatedPersistenceDomain.FromImage(image))
        {
            using HeapFile file = HeapFile.Open(domain);
            using (BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, HeapFaults = faults }))
            {
                Assert.False(heap.Recovery.FastReopen, "the image was reopened from its saved state: no scan looked at the block");
                return BitConverter.ToUInt64(domain.GetDurableImage(), (int)victim + HeapLayout.EpochOffset);
            }
        }
    }

    /// <summary>Sets a value too large for a small block, and returns its block's offset and the Epoch word of its header in the durable image before the version is written back.</summary>
    private static (long Offset, ulong Word) LargeHeaderEpochWordBeforeWriteBack(HeapFaults faults)
    {
        using var domain = new SimulatedPersistenceDomain(4 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, HeapFaults = faults });
        var map = new PersistentByteMap<long>(heap, TypeId);
        map.Set(1, new byte[SizeClasses.MaxSmallPayload + 1000]);
        byte[] image = domain.GetDurableImage();
        long dataStart = BitConverter.ToInt64(image, HeapLayout.DataStartOffset);
        for (long s = 0; s < (image.Length - dataStart) / HeapLayout.SegmentSize; s++)
        {
            ulong descriptor = BitConverter.ToUInt64(image, HeapLayout.SuperblockSize + (int)(s * sizeof(ulong)));
            if (HeapLayout.IsValidDescriptor(descriptor, s) && HeapLayout.DescriptorRole(descriptor) == HeapLayout.RoleLargeStart)
            {
                long offset = dataStart + (s * HeapLayout.SegmentSize);
                Assert.Equal(HeapLayout.StateUnused, HeapLayout.CommitState(BitConverter.ToUInt64(image, (int)offset + HeapLayout.CommitOffset)));
                return (offset, BitConverter.ToUInt64(image, (int)offset + HeapLayout.EpochOffset));
            }
        }

        throw new Xunit.Sdk.XunitException("no large block in the durable image");
    }

    /// <summary>Every block of the small-block segments of <paramref name="image"/>.</summary>
    private static IEnumerable<long> SmallBlocks(byte[] image)
    {
        long dataStart = BitConverter.ToInt64(image, HeapLayout.DataStartOffset);
        long segments = (image.Length - dataStart) / HeapLayout.SegmentSize;
        for (long s = 0; s < segments; s++)
        {
            ulong descriptor = BitConverter.ToUInt64(image, HeapLayout.SuperblockSize + (int)(s * sizeof(ulong)));
            if (!HeapLayout.IsValidDescriptor(descriptor, s) || HeapLayout.DescriptorRole(descriptor) != HeapLayout.RoleSmall)
            {
                continue;
            }

            int cls = (int)HeapLayout.DescriptorPayload(descriptor);
            long start = dataStart + (s * HeapLayout.SegmentSize);
            for (int k = 0; k < SizeClasses.BlocksPerSegment[cls]; k++)
            {
                yield return start + ((long)k * SizeClasses.BlockSizes[cls]);
            }
        }
    }
}
