using System;
using System.Collections.Generic;
using System.Linq;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// Issue 10, the sealing window: a cycle persists the frontier of version F and then seals F's blocks. A crash in
/// between leaves F durable but unsealed — checked by their headers only — and a header of F damaged then reads as an
/// interrupted allocation (torn), which recovery freed without a word. Recovery now recognizes the window (kept blocks
/// of durable versions that are not sealed), lists the torn blocks it had to free as unverified, and seals F, so the
/// next recovery checks F whole. The control leaves F unsealed after recovery and must be caught.
/// </summary>
public sealed unsafe class SealingWindowTests
{
    private const int TypeId = 3;
    private const int Keys = 64;
    private const int Updated = 16;
    private static readonly BufferedDurableHeapOptions Manual = new() { AdvancePeriod = Timeout.InfiniteTimeSpan };

    [Fact]
    public void ACrashBetweenTheFrontierAndTheSeals_IsSealedByRecovery_AndTheNextRecoveryFindsNoWindow()
    {
        (byte[] image, long frontier) = CaptureWindow();
        (byte[] after, DurableRecoveryReport first) = Recover(image, DurabilityFaults.None);
        Assert.Equal(frontier, first.RecoveredVersion);
        Assert.True(first.SealedAtRecovery >= Updated, $"recovery sealed {first.SealedAtRecovery} blocks; the window version has at least {Updated}");
        Assert.Equal(0, UnsealedLiveBlocks(after));

        (_, DurableRecoveryReport second) = Recover(after, DurabilityFaults.None);
        Assert.Equal(0, second.SealedAtRecovery);
        Assert.Empty(second.UnverifiedBlocks);
    }

    [Fact]
    public void Control_RecoveryLeavingTheWindowUnsealed_IsCaught()
    {
        (byte[] image, _) = CaptureWindow();
        (byte[] after, DurableRecoveryReport first) = Recover(image, DurabilityFaults.LeaveRecoveredBlocksUnsealed);
        Assert.Equal(0, first.SealedAtRecovery);
        Assert.True(UnsealedLiveBlocks(after) >= Updated, "INCONCLUSIVE: the control's recovery left no block unsealed");
    }

    [Fact]
    public void ADamagedHeaderInTheWindow_IsListedAsUnverified_NotFreedWithoutAWord()
    {
        (byte[] image, long frontier) = CaptureWindow();

        // Damage one block of the window version: a flipped bit of its epoch word (its header check then fails).
        long victim = DamageAnUnsealedBlockOf(image, frontier);
        (_, DurableRecoveryReport report) = Recover(image, DurabilityFaults.None);
        Assert.Contains(victim, report.UnverifiedBlocks);
    }

    /// <summary>
    /// The version's only block is the damaged one (an application that syncs after every write): no unsealed block of
    /// it survives to show the window, so recovery must learn of it from the sealed frontier, not from the blocks.
    /// </summary>
    [Fact]
    public void ADamagedHeaderOfAVersionsOnlyBlock_IsListedAsUnverified()
    {
        (byte[] image, long version) = CaptureWindow(heap =>
        {
            PersistentHashMap<long, long> map = FilledMap(heap);
            return () => map.Set(5, -5);
        });

        long victim = DamageAnUnsealedBlockOf(image, version);
        (_, DurableRecoveryReport report) = Recover(image, DurabilityFaults.None);
        Assert.Contains(victim, report.UnverifiedBlocks);
    }

    /// <summary>
    /// A queue element of the window version whose header was damaged: recovery frees it as torn and lists it; the queue
    /// then takes the gap for the lost element (as after a salvage) instead of refusing the heap at this open and every
    /// later one.
    /// </summary>
    [Fact]
    public void AQueueElementLostInTheWindow_IsListed_AndTheQueueOpensWithoutIt()
    {
        const int QueueType = 4;
        (byte[] image, long version) = CaptureWindow(heap =>
        {
            var queue = new PersistentQueue<long>(heap, QueueType);
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
        });

        long victim = DamageAnUnsealedBlockOf(image, version);
        using var recoveredDomain = SimulatedPersistenceDomain.FromImage(image);
        using HeapFile recoveredFile = HeapFile.Open(recoveredDomain);
        using BufferedDurableHeap recovered = BufferedDurableHeap.Open(recoveredFile, Manual);
        Assert.Contains(victim, recovered.Recovery.UnverifiedBlocks);
        long[] elements = new PersistentQueue<long>(recovered, QueueType).ToArray();
        Assert.Equal(6, elements.Length);
        Assert.Equal(elements.Order().ToArray(), elements);
        Assert.Equal(new long[] { 0, 1, 2, 3 }, elements[..4]);
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
    public void ATornAllocationOutsideTheWindow_IsNotListed()
    {
        // A clean capture after the seals: nothing of the durable versions is unsealed, so a torn block (an allocation
        // of a later version that never reached the file whole) is freed as before, with nothing to report.
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
        long target;
        fixed (byte* p = image)
        {
            // Make one free or unused block look like an interrupted allocation: a commit word that says allocated, over
            // header words its check does not match.
            target = FirstEmptyBlockOfALiveSegment(image);
            ulong* h = (ulong*)(p + target);
            uint generation = HeapLayout.DescriptorGeneration(BitConverter.ToUInt64(image, HeapLayout.SuperblockSize + (int)((target - BitConverter.ToInt64(image, HeapLayout.DataStartOffset)) / HeapLayout.SegmentSize * sizeof(ulong))));
            h[3] = HeapLayout.AllocatedCommit(12345, 99, HeapLayout.Shape(16, 1), target, generation, PayloadKind.Alloc);
            h[0] = 54321;
        }

        (byte[] after, DurableRecoveryReport report) = Recover(image, DurabilityFaults.None);
        Assert.Equal(HeapLayout.StateFree, HeapLayout.CommitState(BitConverter.ToUInt64(after, (int)target + HeapLayout.CommitOffset)));
        Assert.Equal(0, report.SealedAtRecovery);
        Assert.Empty(report.UnverifiedBlocks);
    }

    /// <summary>
    /// A map written over a few versions, then <see cref="Updated"/> keys updated in version F; the durable image is
    /// taken in F's cycle once the frontier covers F and before its blocks are sealed.
    /// </summary>
    private static (byte[] Image, long Frontier) CaptureWindow() => CaptureWindow(heap =>
    {
        PersistentHashMap<long, long> map = FilledMap(heap);
        return () =>
        {
            for (long k = 0; k < Updated; k++)
            {
                map.Set(k, -k);
            }
        };
    });

    /// <summary>
    /// Runs <paramref name="setUp"/> on a new heap (its writes made durable and sealed by a Sync), then the writes it
    /// returns in the next version F, and takes the durable image in F's cycle once the frontier covers F and before
    /// its blocks are sealed.
    /// </summary>
    private static (byte[] Image, long Frontier) CaptureWindow(Func<BufferedDurableHeap, Action> setUp)
    {
        using var domain = new SimulatedPersistenceDomain(4 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, Manual);
        Action inWindow = setUp(heap);
        heap.Sync();
        long version = heap.CurrentVersion;
        inWindow();

        byte[]? image = null;
        heap.BeforeSealForTesting = completed =>
        {
            if (completed == version)
            {
                image = domain.GetDurableImage();
            }
        };
        heap.Sync();
        heap.BeforeSealForTesting = null;
        Assert.NotNull(image);
        return (image!, version);
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

    /// <summary>Flips a bit of the epoch word of an allocated, unsealed block of <paramref name="version"/> in <paramref name="image"/> (its header check then fails); returns its offset.</summary>
    private static long DamageAnUnsealedBlockOf(byte[] image, long version)
    {
        fixed (byte* p = image)
        {
            foreach (long offset in LiveBlocks(image))
            {
                ulong* h = (ulong*)(p + offset);
                if ((long)h[1] == version && HeapLayout.CommitState(h[3]) == HeapLayout.StateAllocated)
                {
                    h[1] ^= 1UL << 17;
                    return offset;
                }
            }
        }

        Assert.Fail($"no unsealed block of version {version} in the image");
        return -1;
    }

    /// <summary>Opens <paramref name="image"/> (a copy), recovers the map, and returns the durable image after recovery with the report.</summary>
    private static (byte[] After, DurableRecoveryReport Report) Recover(byte[] image, DurabilityFaults faults)
    {
        using var domain = SimulatedPersistenceDomain.FromImage(image);
        DurableRecoveryReport report;
        using (HeapFile file = HeapFile.Open(domain))
        using (BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, Faults = faults }))
        {
            report = heap.Recovery;

            // The image as recovery left it (before this heap's own cycles or its clean close could seal anything).
            byte[] after = domain.GetDurableImage();
            _ = new PersistentHashMap<long, long>(heap, TypeId);
            return (after, report);
        }
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
