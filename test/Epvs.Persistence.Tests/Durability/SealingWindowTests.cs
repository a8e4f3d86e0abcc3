using System;
using System.Collections.Generic;
using System.Linq;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// Issue 10, the sealing window. A cycle used to persist version F's frontier and then seal F's blocks: a crash in
/// between left F durable but checked by its headers only, and a header of F damaged then read as an interrupted
/// allocation (torn) — freed, with at most a list nobody had to read, and the key's previous value back. Each cycle now
/// seals F, and makes the sealed-frontier word durable with the seals, before the frontier covers F: a crash before the
/// frontier drops F whole (a consistent prefix), and every block a frontier covers is checked whole. Recovery still
/// meets an open window in a file whose sealed-frontier word is below its frontier (written in the old order — the
/// control <see cref="DurabilityFaults.PersistFrontierBeforeSeals"/> writes one — or with the word damaged): it takes
/// every torn block for damage, refused unless salvaged, and seals the version's unsealed blocks.
/// </summary>
public sealed unsafe class SealingWindowTests
{
    private const int TypeId = 3;
    private const int Keys = 64;
    private const int Updated = 16;
    private static readonly BufferedDurableHeapOptions Manual = new() { AdvancePeriod = Timeout.InfiniteTimeSpan };

    [Fact]
    public void WhenAVersionIsSealed_ItsFrontierIsNotYetDurable_SoACrashThereDropsTheVersionWhole()
    {
        (byte[] image, long version) = CaptureAtTheSeals(DurabilityFaults.None);
        Assert.True(DurableFrontierOf(image) < version, $"the frontier ({DurableFrontierOf(image)}) covered version {version} before its seals");

        // Sealed, written back and fenced in one pass (format 6): still not covered by the frontier.
        (image, version) = CaptureSealedBeforeTheFrontier();
        Assert.True(DurableFrontierOf(image) < version, $"the frontier ({DurableFrontierOf(image)}) covered version {version} before its seals were durable");
        Assert.Equal(0, UnsealedLiveBlocks(image));

        // A payload of F damaged there (or torn: the same to recovery): F is beyond the frontier, and the block's tag and
        // Epoch word name F, the version in flight: dropped whole with it; every key reads its value of the version
        // before (a consistent prefix), and nothing the frontier covers is damaged.
        DamageAPayloadOf(image, version);
        (_, DurableRecoveryReport report, Dictionary<long, long> values) = Recover(image, DurabilityFaults.None);
        Assert.Equal(version - 1, report.RecoveredVersion);
        Assert.Empty(report.DamagedBlocks);
        Assert.Equal(Enumerable.Range(0, Keys).ToDictionary(k => (long)k, k => (long)k), values);
    }

    /// <summary>
    /// A sealed block of the version in flight whose Epoch word holds neither that version nor its empty mark is no torn
    /// write (the allocation wrote the version there, and formatting or a free the mark durably before): damage, reported although the version
    /// is beyond the frontier — recovery cannot tell it from a damaged block of a durable version otherwise.
    /// </summary>
    [Fact]
    public void ASealedBlockOfTheVersionInFlightWithADamagedEpochWord_IsReportedAsDamage()
    {
        (byte[] image, long version) = CaptureSealedBeforeTheFrontier();
        long victim = -1;
        fixed (byte* p = image)
        {
            foreach (long offset in LiveBlocks(image))
            {
                ulong* h = (ulong*)(p + offset);
                if ((long)h[1] == version && HeapLayout.CommitState(h[3]) == HeapLayout.StateSealed)
                {
                    h[1] ^= 1UL << 17;
                    victim = offset;
                    break;
                }
            }
        }

        Assert.True(victim > 0, $"no sealed block of version {version} in the image");
        using var domain = SimulatedPersistenceDomain.FromImage(image);
        using HeapFile file = HeapFile.Open(domain);
        HeapFileException refused = Assert.Throws<HeapFileException>(() => BufferedDurableHeap.Open(file, Manual).Dispose());
        Assert.Equal(new[] { victim }, refused.DamagedBlocks);
    }

    [Fact]
    public void Control_FrontierPersistedBeforeTheSeals_IsCaught()
    {
        (byte[] image, long version) = CaptureAtTheSeals(DurabilityFaults.PersistFrontierBeforeSeals);
        Assert.Equal(version, DurableFrontierOf(image));
    }

    [Fact]
    public void AnOpenWindow_ADamagedHeaderIsRefusedAsDamage_AndRecoveryChangesNothing()
    {
        (byte[] image, long version) = CaptureAtTheSeals(DurabilityFaults.PersistFrontierBeforeSeals);
        long victim = DamageAnUnsealedBlockOf(image, version);
        byte[] before = (byte[])image.Clone();
        using var domain = SimulatedPersistenceDomain.FromImage(image);
        using (HeapFile file = HeapFile.Open(domain))
        {
            HeapFileException refused = Assert.Throws<HeapFileException>(() => BufferedDurableHeap.Open(file, Manual).Dispose());
            Assert.Equal(HeapFileError.Corrupt, refused.Error);
            Assert.Equal(new[] { victim }, refused.DamagedBlocks);
        }

        // Nothing but the open's own clean-shutdown word changed.
        byte[] after = domain.GetDurableImage();
        Assert.True(after.AsSpan(HeapLayout.SuperblockSize).SequenceEqual(before.AsSpan(HeapLayout.SuperblockSize)), "the refused recovery changed blocks");
    }

    [Fact]
    public void Control_TornBlocksTrustedInAnOpenWindow_OpenSilentlyWithTheOldValue()
    {
        (byte[] image, long version) = CaptureAtTheSeals(DurabilityFaults.PersistFrontierBeforeSeals, OneUpdate);
        DamageAnUnsealedBlockOf(image, version);
        (_, DurableRecoveryReport report, Dictionary<long, long> values) = Recover(image, DurabilityFaults.TrustTornBlocksBelowTheSealedFrontier);
        Assert.Equal(version, report.RecoveredVersion);
        Assert.Empty(report.DamagedBlocks);
        Assert.Equal(5, values[5]);
    }

    /// <summary>
    /// The version's only block is the damaged one (an application that syncs after every write): no unsealed block of
    /// it survives to show the window, so recovery must learn of it from the sealed-frontier word, not from the blocks.
    /// </summary>
    [Fact]
    public void AnOpenWindow_ADamagedHeaderOfAVersionsOnlyBlock_IsDamage_AndSalvageListsIt()
    {
        (byte[] image, long version) = CaptureAtTheSeals(DurabilityFaults.PersistFrontierBeforeSeals, OneUpdate);
        long victim = DamageAnUnsealedBlockOf(image, version);
        using (var domain = SimulatedPersistenceDomain.FromImage(image))
        using (HeapFile file = HeapFile.Open(domain))
        {
            HeapFileException refused = Assert.Throws<HeapFileException>(() => BufferedDurableHeap.Open(file, Manual).Dispose());
            Assert.Equal(new[] { victim }, refused.DamagedBlocks);
        }

        (_, DurableRecoveryReport report, Dictionary<long, long> values) = Recover(image, DurabilityFaults.None, salvage: true);
        Assert.Equal(new[] { victim }, report.DamagedBlocks);
        Assert.Equal(5, values[5]);
    }

    [Fact]
    public void AnOpenWindow_WithoutDamage_OpensAndIsSealedByRecovery_AndTheNextRecoveryFindsNoWindow()
    {
        (byte[] image, long version) = CaptureAtTheSeals(DurabilityFaults.PersistFrontierBeforeSeals);
        (byte[] after, DurableRecoveryReport first, Dictionary<long, long> values) = Recover(image, DurabilityFaults.None);
        Assert.Equal(version, first.RecoveredVersion);
        Assert.Equal(-Updated + 1, values[Updated - 1]);
        Assert.True(first.SealedAtRecovery >= Updated, $"recovery sealed {first.SealedAtRecovery} blocks; the window version has at least {Updated}");
        Assert.Equal(0, UnsealedLiveBlocks(after));

        (_, DurableRecoveryReport second, _) = Recover(after, DurabilityFaults.None);
        Assert.Equal(0, second.SealedAtRecovery);
    }

    [Fact]
    public void Control_RecoveryLeavingTheWindowUnsealed_IsCaught()
    {
        (byte[] image, _) = CaptureAtTheSeals(DurabilityFaults.PersistFrontierBeforeSeals);
        (byte[] after, DurableRecoveryReport first, _) = Recover(image, DurabilityFaults.LeaveRecoveredBlocksUnsealed);
        Assert.Equal(0, first.SealedAtRecovery);
        Assert.True(UnsealedLiveBlocks(after) >= Updated, "INCONCLUSIVE: the control's recovery left no block unsealed");
    }

    /// <summary>
    /// A queue element of an open window's version whose header was damaged: refused by default; salvaged, it is listed
    /// and the queue opens with the gap (as after any salvage).
    /// </summary>
    [Fact]
    public void AnOpenWindow_AQueueElementSalvaged_IsListed_AndTheQueueOpensWithoutIt()
    {
        const int QueueType = 4;
        (byte[] image, long version) = CaptureAtTheSeals(DurabilityFaults.PersistFrontierBeforeSeals, heap => FourThenThreeElements(heap, QueueType));

        long victim = DamageAnUnsealedBlockOf(image, version);
        using var recoveredDomain = SimulatedPersistenceDomain.FromImage(image);
        using HeapFile recoveredFile = HeapFile.Open(recoveredDomain);
        using BufferedDurableHeap recovered = BufferedDurableHeap.Open(recoveredFile, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, SalvageDamagedBlocks = true });
        Assert.Equal(new[] { victim }, recovered.Recovery.DamagedBlocks);
        long[] elements = new PersistentQueue<long>(recovered, QueueType).ToArray();
        Assert.Equal(6, elements.Length);
        Assert.Equal(elements.Order().ToArray(), elements);
        Assert.Equal(new long[] { 0, 1, 2, 3 }, elements[..4]);
    }

    /// <summary>
    /// A salvage resolves a map's duplicates when the map is constructed: one not opened in the salvaging session used to
    /// refuse the heap at every later open. The file records the salvage, so a later open resolves them (durably).
    /// </summary>
    [Fact]
    public void AMapNotOpenedInTheSalvagingSession_ResolvesWhatTheSalvageLeft_AtALaterOpen()
    {
        using SimulatedPersistenceDomain domain = SalvagedWithKeySevenTwice(out _);

        using (HeapFile file = HeapFile.Open(domain))
        using (BufferedDurableHeap later = BufferedDurableHeap.Open(file, Manual))
        {
            Assert.Empty(later.Recovery.DamagedBlocks);
            Dictionary<long, long> values = new PersistentHashMap<long, long>(later, TypeId).ToDictionary();
            Assert.Equal(70, values[7]);
            Assert.Equal(Keys, values.Count);
        }
    }

    /// <summary>
    /// A salvage's duplicate (key 7, both payloads at or below the salvaged-through word) beside one no salvage explains
    /// (key 3, one payload newer than the word): the map must refuse the heap, not resolve the first and lose the second
    /// payload of key 3 — neither in the map nor freed.
    /// </summary>
    [Fact]
    public void ADuplicateNewerThanTheSalvage_IsRefusedEvenBesideASalvagesDuplicate()
    {
        using SimulatedPersistenceDomain domain = SalvagedWithKeySevenTwice(out long salvagedThrough);

        // A later session (the map not opened) leaves a second live payload of key 3, newer than the salvage.
        using (HeapFile file = HeapFile.Open(domain))
        using (BufferedDurableHeap later = BufferedDurableHeap.Open(file, Manual))
        {
            using (DurableOperation op = later.BeginOperation())
            {
                Assert.True(op.Version > salvagedThrough);
                PayloadRef block = op.AllocateTyped(16, StructureKind.Encode(StructureKind.HashMap, TypeId, sizeof(long)));
                Span<byte> bytes = op.GetPayload(block);
                System.Runtime.InteropServices.MemoryMarshal.Write(bytes, 3L);
                System.Runtime.InteropServices.MemoryMarshal.Write(bytes[8..], 999L);
            }

            later.Sync();
        }

        using (HeapFile file = HeapFile.Open(domain))
        using (BufferedDurableHeap heap = BufferedDurableHeap.Open(file, Manual))
        {
            Assert.Throws<System.IO.InvalidDataException>(() => new PersistentHashMap<long, long>(heap, TypeId));
        }
    }

    /// <summary>The salvage is recorded before it frees anything: an open that fails after its frees still leaves the structures able to resolve what it left.</summary>
    [Fact]
    public void AQueueGapOfASalvageWhoseOpenFailed_IsClosedAtTheNextOpen()
    {
        const int QueueType = 4;
        (byte[] image, long version) = CaptureAtTheSeals(DurabilityFaults.PersistFrontierBeforeSeals, heap => FourThenThreeElements(heap, QueueType));

        DamageAnUnsealedBlockOf(image, version);
        using var domain = SimulatedPersistenceDomain.FromImage(image);
        using (HeapFile file = HeapFile.Open(domain))
        {
            var failing = new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromMilliseconds(20), SalvageDamagedBlocks = true, StartingAdvancerForTesting = () => throw new OutOfMemoryException("no thread") };
            Assert.Throws<OutOfMemoryException>(() => BufferedDurableHeap.Open(file, failing));
        }

        using HeapFile reopened = HeapFile.Open(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(reopened, Manual);
        Assert.Empty(heap.Recovery.DamagedBlocks);

        // Not silent: the report of every later open says the file was salvaged, and through which version.
        Assert.Equal(version, heap.Recovery.SalvagedThrough);
        long[] elements = new PersistentQueue<long>(heap, QueueType).ToArray();
        Assert.Equal(6, elements.Length);
        Assert.Equal(new long[] { 0, 1, 2, 3 }, elements[..4]);
    }

    /// <summary>
    /// A key inserted, removed and inserted again in one version, the removal's anti-payload damaged: salvaged, two
    /// payloads of the key carry that version. The map used to refuse the heap at every open, salvage or not; it keeps the
    /// one with the larger uid (the later insert of one thread).
    /// </summary>
    [Fact]
    public void ASalvagedKeyWithTwoPayloadsOfOneVersion_KeepsTheLaterInsertOfItsThread()
    {
        (byte[] image, long version) = CaptureAtTheSeals(DurabilityFaults.PersistFrontierBeforeSeals, heap =>
        {
            PersistentHashMap<long, long> map = FilledMap(heap);
            return () =>
            {
                map.Set(1000, 1);
                map.Remove(1000);
                map.Set(1000, 2);
            };
        });

        DamageAnUnsealedBlockOf(image, version, PayloadKind.Delete);
        (_, DurableRecoveryReport report, Dictionary<long, long> values) = Recover(image, DurabilityFaults.None, salvage: true);
        Assert.Single(report.DamagedBlocks);
        Assert.Equal(2, values[1000]);
        Assert.Equal(Keys + 1, values.Count);
    }

    [Fact]
    public void ADamagedSealedFrontierWord_OpensAWindow_ATornBlockIsThenDamage()
    {
        byte[] image = SyncedImageWithATornBlock(out long torn);

        // The word itself damaged: it fails its check (-1), below any frontier.
        image[HeapLayout.SealedFrontierOffset + 2] ^= 0x10;
        HeapFileException refused;
        using (var domain = SimulatedPersistenceDomain.FromImage(image))
        using (HeapFile file = HeapFile.Open(domain))
        {
            refused = Assert.Throws<HeapFileException>(() => BufferedDurableHeap.Open(file, Manual).Dispose());
        }

        Assert.Equal(new[] { torn }, refused.DamagedBlocks);
    }

    [Fact]
    public void ARawHeapsRecovery_ListsNoUnsealedBlocks()
    {
        // A raw heap never seals: listing its unsealed blocks would cost 8 bytes for every block of the heap.
        using var domain = new SimulatedPersistenceDomain(4 << 20);
        using (HeapFile file = HeapFile.Create(domain))
        using (var heap = new PersistentHeap(file))
        {
            for (int i = 0; i < 100; i++)
            {
                heap.Persist(heap.Allocate(16, 1));
            }
        }

        byte[] image = AsAfterACrash(domain.GetDurableImage());
        using var again = SimulatedPersistenceDomain.FromImage(image);
        using HeapFile reopened = HeapFile.Open(again);
        using var recovered = new PersistentHeap(reopened);
        Assert.False(recovered.OpenedFromSavedState);
        Assert.Equal(100, recovered.GetStatistics().LiveBlocks);
        Assert.Empty(recovered.RecoveryUnsealedBlocks);
    }

    [Fact]
    public void ATornAllocationOutsideAWindow_IsFreedWithoutAReport()
    {
        // Every durable version sealed: a torn block (an allocation of a later version that never reached the file whole)
        // is freed, with nothing to report.
        byte[] image = SyncedImageWithATornBlock(out long target);
        (byte[] after, DurableRecoveryReport report, _) = Recover(image, DurabilityFaults.None);
        Assert.Equal(HeapLayout.StateFree, HeapLayout.CommitState(BitConverter.ToUInt64(after, (int)target + HeapLayout.CommitOffset)));
        Assert.Equal(0, report.SealedAtRecovery);
        Assert.Empty(report.DamagedBlocks);
        Assert.Equal(0, report.SalvagedThrough);
    }

    /// <summary>A filled map, synced twice, as after a crash, with one free or unused block made to look like an interrupted allocation.</summary>
    private static byte[] SyncedImageWithATornBlock(out long target)
    {
        var domain = new SimulatedPersistenceDomain(4 << 20);
        using (HeapFile file = HeapFile.Create(domain))
        using (BufferedDurableHeap heap = BufferedDurableHeap.Open(file, Manual))
        {
            FilledMap(heap);
            heap.Sync();
            heap.Sync();
        }

        byte[] image = AsAfterACrash(domain.GetDurableImage());
        domain.Dispose();
        fixed (byte* p = image)
        {
            // A commit word that says allocated, over header words its check does not match.
            target = FirstEmptyBlockOfALiveSegment(image);
            ulong* h = (ulong*)(p + target);
            uint generation = HeapLayout.DescriptorGeneration(BitConverter.ToUInt64(image, HeapLayout.SuperblockSize + (int)((target - BitConverter.ToInt64(image, HeapLayout.DataStartOffset)) / HeapLayout.SegmentSize * sizeof(ulong))));
            h[3] = HeapLayout.AllocatedCommit(12345, 99, HeapLayout.Shape(16, 1), target, generation, PayloadKind.Alloc);
            h[0] = 54321;
        }

        return image;
    }

    /// <summary>A queue of elements 0 to 3; elements 4 to 6 are enqueued in version F.</summary>
    private static Action FourThenThreeElements(BufferedDurableHeap heap, int queueType)
    {
        var queue = new PersistentQueue<long>(heap, queueType);
        for (long i = 0; i < 4; i++)
        {
            queue.Enqueue(i);
        }

        return () =>
        {
            for (long i = 4; i < 7; i++)
            {
                queue.Enqueue(i);
            }
        };
    }

    /// <summary>
    /// A map whose key 7 was removed and set again in version F, the removal's anti-payload damaged, salvaged by an open
    /// that does not open the map: the key's old payload is live again beside its new one. Returns the file after that
    /// open, and the salvaged-through word it left.
    /// </summary>
    private static SimulatedPersistenceDomain SalvagedWithKeySevenTwice(out long salvagedThrough)
    {
        (byte[] image, long version) = CaptureAtTheSeals(DurabilityFaults.PersistFrontierBeforeSeals, heap =>
        {
            PersistentHashMap<long, long> map = FilledMap(heap);
            return () =>
            {
                map.Remove(7);
                map.Set(7, 70);
            };
        });

        DamageAnUnsealedBlockOf(image, version, PayloadKind.Delete);
        var domain = SimulatedPersistenceDomain.FromImage(image);
        using HeapFile file = HeapFile.Open(domain);
        using BufferedDurableHeap salvaged = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, SalvageDamagedBlocks = true });
        Assert.Single(salvaged.Recovery.DamagedBlocks);
        salvagedThrough = salvaged.SalvagedThrough;
        return domain;
    }

    /// <summary>The set-up of the single-block tests: one key updated in version F.</summary>
    private static Action OneUpdate(BufferedDurableHeap heap)
    {
        PersistentHashMap<long, long> map = FilledMap(heap);
        return () => map.Set(5, -5);
    }

    private static long DurableFrontierOf(byte[] image)
    {
        Assert.True(HeapLayout.TryUnseal(BitConverter.ToUInt64(image, HeapLayout.DurableFrontierOffset), HeapLayout.DurableFrontierOffset, out long frontier));
        return frontier;
    }

    /// <summary>
    /// A map written over a few versions, then <see cref="Updated"/> keys updated in version F (key k to -k); the durable
    /// image is taken in F's cycle just before its blocks are sealed.
    /// </summary>
    private static (byte[] Image, long Version) CaptureAtTheSeals(DurabilityFaults faults) => CaptureAtTheSeals(faults, UpdateSome);

    /// <summary>The set-up of the window tests: a filled map, then <see cref="Updated"/> keys updated in version F (key k to -k).</summary>
    private static Action UpdateSome(BufferedDurableHeap heap)
    {
        PersistentHashMap<long, long> map = FilledMap(heap);
        return () =>
        {
            for (long k = 0; k < Updated; k++)
            {
                map.Set(k, -k);
            }
        };
    }

    /// <summary>
    /// Runs <paramref name="setUp"/> on a new heap with <paramref name="faults"/> (its writes made durable and sealed by
    /// a Sync), then the writes it returns in the next version F, and takes the durable image in F's cycle just before its
    /// blocks are sealed — or, with <paramref name="afterTheFence"/>, once they are sealed, written back and fenced,
    /// before F's frontier is persisted.
    /// </summary>
    private static (byte[] Image, long Version) CaptureAtTheSeals(DurabilityFaults faults, Func<BufferedDurableHeap, Action> setUp, bool afterTheFence = false)
    {
        using var domain = new SimulatedPersistenceDomain(4 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, Faults = faults });
        Action inVersion = setUp(heap);
        heap.Sync();
        long version = heap.CurrentVersion;
        inVersion();

        byte[]? image = null;
        Action<long> capture = completed =>
        {
            if (completed == version)
            {
                image = domain.GetDurableImage();
            }
        };
        if (afterTheFence)
        {
            heap.SealedBeforeTheFrontierForTesting = capture;
        }
        else
        {
            heap.BeforeSealForTesting = capture;
        }

        heap.Sync();
        heap.BeforeSealForTesting = heap.SealedBeforeTheFrontierForTesting = null;
        Assert.NotNull(image);
        return (image!, version);
    }

    /// <summary>The window tests' workload, the durable image taken once version F is sealed, written back and fenced, before its frontier is persisted.</summary>
    private static (byte[] Image, long Version) CaptureSealedBeforeTheFrontier() => CaptureAtTheSeals(DurabilityFaults.None, UpdateSome, afterTheFence: true);

    /// <summary>Flips a payload bit of a sealed block of <paramref name="version"/> in <paramref name="image"/>; returns its offset.</summary>
    private static long DamageAPayloadOf(byte[] image, long version)
    {
        fixed (byte* p = image)
        {
            foreach (long offset in LiveBlocks(image))
            {
                ulong* h = (ulong*)(p + offset);
                if ((long)h[1] == version && HeapLayout.CommitState(h[3]) == HeapLayout.StateSealed && HeapLayout.ShapeSize(h[2]) > 0)
                {
                    p[offset + HeapLayout.HeaderSize] ^= 0x10;
                    return offset;
                }
            }
        }

        Assert.Fail($"no sealed block of version {version} in the image");
        return -1;
    }

    /// <summary>A map of <see cref="Keys"/> keys, each set to itself.</summary>
    private static PersistentHashMap<long, long> FilledMap(BufferedDurableHeap heap)
    {
        var map = new PersistentHashMap<long, long>(heap, TypeId);
        for (long k = 0; k < Keys; k++)
        {
            map.Set(k, k);
        }

        return map;
    }

    /// <summary>The clean-shutdown word as an open leaves it: the next open runs the full scan, which classifies every block.</summary>
    private static byte[] AsAfterACrash(byte[] image)
    {
        BitConverter.GetBytes(HeapLayout.Seal(0, HeapLayout.CleanShutdownOffset)).CopyTo(image, HeapLayout.CleanShutdownOffset);
        return image;
    }

    /// <summary>Flips a bit of the epoch word of an allocated, unsealed block of <paramref name="version"/> (of <paramref name="kind"/>, if given) in <paramref name="image"/> (its header check then fails); returns its offset.</summary>
    private static long DamageAnUnsealedBlockOf(byte[] image, long version, PayloadKind? kind = null)
    {
        fixed (byte* p = image)
        {
            foreach (long offset in LiveBlocks(image))
            {
                ulong* h = (ulong*)(p + offset);
                if ((long)h[1] == version && HeapLayout.CommitState(h[3]) == HeapLayout.StateAllocated && (kind is null || HeapLayout.CommitKind(h[3]) == kind))
                {
                    h[1] ^= 1UL << 17;
                    return offset;
                }
            }
        }

        Assert.Fail($"no unsealed block of version {version} in the image");
        return -1;
    }

    /// <summary>Opens <paramref name="image"/> (a copy), recovers the map, and returns the durable image after recovery with the report and the map's contents.</summary>
    private static (byte[] After, DurableRecoveryReport Report, Dictionary<long, long> Values) Recover(byte[] image, DurabilityFaults faults, bool salvage = false)
    {
        using var domain = SimulatedPersistenceDomain.FromImage(image);
        using HeapFile file = HeapFile.Open(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, Faults = faults, SalvageDamagedBlocks = salvage });

        // The image as recovery left it (before this heap's own cycles or its clean close could seal anything).
        byte[] after = domain.GetDurableImage();
        Dictionary<long, long> values = new PersistentHashMap<long, long>(heap, TypeId).ToDictionary();
        return (after, heap.Recovery, values);
    }

    private static int UnsealedLiveBlocks(byte[] image)
    {
        int unsealed = 0;
        foreach (long offset in LiveBlocks(image))
        {
            if (HeapLayout.CommitState(BitConverter.ToUInt64(image, (int)offset + HeapLayout.CommitOffset)) == HeapLayout.StateAllocated)
            {
                unsealed++;
            }
        }

        return unsealed;
    }

    private static List<long> LiveBlocks(byte[] image) => ZeroedWordDamageTests.LiveBlocks(image);

    private static long FirstEmptyBlockOfALiveSegment(byte[] image)
    {
        long dataStart = BitConverter.ToInt64(image, HeapLayout.DataStartOffset);
        long first = LiveBlocks(image)[0];
        long segmentStart = dataStart + ((first - dataStart) / HeapLayout.SegmentSize * HeapLayout.SegmentSize);
        ulong descriptor = BitConverter.ToUInt64(image, HeapLayout.SuperblockSize + (int)((segmentStart - dataStart) / HeapLayout.SegmentSize * sizeof(ulong)));
        int cls = (int)HeapLayout.DescriptorPayload(descriptor);
        for (int k = SizeClasses.BlocksPerSegment[cls] - 1; k >= 0; k--)
        {
            long offset = segmentStart + ((long)k * SizeClasses.BlockSizes[cls]);
            if (!HeapLayout.InUse(BitConverter.ToUInt64(image, (int)offset + HeapLayout.CommitOffset)))
            {
                return offset;
            }
        }

        throw new InvalidOperationException("the first live segment has no empty block");
    }
}
