using System;
using System.Collections.Generic;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// The superblock word that records an earlier salvage (SalvagedThrough, offset 120) was read as 0, "never salvaged",
/// whenever it failed its check: one flipped bit erased the record without a word, and a structure that met what the
/// salvage had left (a queue gap, a key's older payload) then refused the heap as inconsistent without naming the damaged
/// word. Found by the first adversarial round of session 16. A damaged word is now reported (<see cref="HeapFileError.Corrupt"/>)
/// before anything is written, unless the open salvages, which rewrites it after the scan.
/// </summary>
public sealed class SalvagedThroughWordTests
{
    private const long Capacity = 4L << 20;
    private const int TypeId = 7;
    private static readonly BufferedDurableHeapOptions NoAdvancer = new() { AdvancePeriod = Timeout.InfiniteTimeSpan };

    /// <summary>A clean file of 20 synced keys whose superblock says an earlier session salvaged through version 2.</summary>
    private static byte[] FileThatWasSalvaged()
    {
        using var domain = new SimulatedPersistenceDomain(Capacity);
        using (HeapFile file = HeapFile.Create(domain))
        {
            using var heap = BufferedDurableHeap.Open(file, NoAdvancer);
            var map = new PersistentHashMap<long, long>(heap, TypeId);
            for (long k = 0; k < 20; k++)
            {
                map.Set(k, k * 10);
            }

            heap.Sync(TimeSpan.FromSeconds(30));
            file.SalvagedThrough = 2; // as a salvage of an earlier session left it
        }

        return domain.GetDurableImage();
    }

    public static TheoryData<string> Damages => new() { "value bit", "check bit", "zeroed" };

    private static void Damage(byte[] image, string how)
    {
        switch (how)
        {
            case "value bit":
                image[HeapLayout.SalvagedThroughOffset] ^= 0x04;
                break;
            case "check bit":
                image[HeapLayout.SalvagedThroughOffset + 7] ^= 0x10;
                break;
            default:
                Array.Clear(image, HeapLayout.SalvagedThroughOffset, sizeof(ulong));
                break;
        }
    }

    [Theory]
    [MemberData(nameof(Damages))]
    public void ADamagedSalvageRecord_IsReported_AndNothingIsWritten(string how)
    {
        byte[] image = FileThatWasSalvaged();
        Damage(image, how);
        byte[] before = (byte[])image.Clone();
        using var domain = SimulatedPersistenceDomain.FromImage(image, Capacity);
        using (HeapFile file = HeapFile.Open(domain))
        {
            var e = Assert.Throws<HeapFileException>(() => BufferedDurableHeap.Open(file, NoAdvancer).Dispose());
            Assert.Equal(HeapFileError.Corrupt, e.Error);
            Assert.Contains("salvaged-through word at offset 120", e.Message, StringComparison.Ordinal);
        }

        // The clean-shutdown word is the only one an open may have written (HeapFile's own open); no block changed.
        byte[] after = domain.GetDurableImage();
        Assert.True(after.AsSpan(HeapLayout.SuperblockSize).SequenceEqual(before.AsSpan(HeapLayout.SuperblockSize)), "the refused open wrote past the superblock");
        Assert.Equal(BitConverter.ToUInt64(before, HeapLayout.SalvagedThroughOffset), BitConverter.ToUInt64(after, HeapLayout.SalvagedThroughOffset));
    }

    [Fact]
    public void ASalvagingOpen_RewritesTheRecord_AndKeepsTheData()
    {
        byte[] image = FileThatWasSalvaged();
        Damage(image, "value bit");
        byte[] salvaged;
        long recovered;
        using (var domain = SimulatedPersistenceDomain.FromImage(image, Capacity))
        {
            using (HeapFile file = HeapFile.Open(domain))
            {
                using var heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, SalvageDamagedBlocks = true });
                recovered = heap.Recovery.RecoveredVersion;
                // Everything up to the recovered version may hold what an earlier salvage left: the structures accept it.
                Assert.Equal(recovered, heap.Recovery.SalvagedThrough);
                AssertTwentyKeys(new PersistentHashMap<long, long>(heap, TypeId));
            }

            salvaged = domain.GetDurableImage();
        }

        using var again = SimulatedPersistenceDomain.FromImage(salvaged, Capacity);
        using HeapFile reopened = HeapFile.Open(again);
        using var plain = BufferedDurableHeap.Open(reopened, NoAdvancer);
        Assert.Equal(recovered, plain.Recovery.SalvagedThrough);
        AssertTwentyKeys(new PersistentHashMap<long, long>(plain, TypeId));
    }

    private static void AssertTwentyKeys(PersistentHashMap<long, long> map)
    {
        Dictionary<long, long> contents = map.ToDictionary();
        Assert.Equal(20, contents.Count);
        for (long k = 0; k < 20; k++)
        {
            Assert.Equal(k * 10, contents[k]);
        }
    }
}
