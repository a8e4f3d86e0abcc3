using System;
using System.IO;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// A probe: a map opened with a key type of the same size but another equality (<c>long</c> data opened with
/// <c>double</c> keys: 0 and -0.0 are Equal, and so are two NaNs). Without a salvage on record the open is refused ("two
/// live payloads for one key") and nothing changes. Once the file recorded any earlier salvage — even of another
/// structure's block — the structures' salvage resolution took the Equal keys for a salvage's leftovers and deleted all
/// but one of each, durably and without a word: the right type then found 3 of 5 entries. Keys of other bytes are no
/// salvage leftover (a map keeps a key's first bytes), so the open is refused in both cases now, for the hash map and
/// the byte map. The control (<see cref="BufferedDurableHeap.SalvageAnyEqualKeysForTesting"/>, the old resolution)
/// deletes entries: caught.
/// </summary>
public sealed class SalvageWrongKeyTypeTests
{
    private const long Capacity = 8L << 20;
    private const int MapId = 1, RawId = 9;

    // 0 and long.MinValue are 0.0 and -0.0 (Equal as doubles); the next two are NaNs (Equal as doubles).
    private static readonly long[] Keys = { 0, long.MinValue, 0x7FF0_0000_0000_0001, 0x7FF0_0000_0000_0002, 5 };

    private static readonly BufferedDurableHeapOptions NoAdvancer = new() { AdvancePeriod = Timeout.InfiniteTimeSpan };

    [Theory]
    [InlineData(false, false, false)]
    [InlineData(true, false, false)]
    [InlineData(true, true, false)]
    [InlineData(false, true, false)]
    [InlineData(true, false, true)]
    [InlineData(true, true, true)]
    public void AWrongKeyTypeOfTheSameSize_NeverDeletesEntries(bool salvagedEarlier, bool byteMap, bool control)
    {
        byte[] image = Image(salvagedEarlier, byteMap);
        string outcome;
        using (var domain = SimulatedPersistenceDomain.FromImage(image, Capacity))
        {
            using (HeapFile file = HeapFile.Open(domain))
            using (BufferedDurableHeap heap = BufferedDurableHeap.Open(file, NoAdvancer))
            {
                heap.SalvageAnyEqualKeysForTesting = control;
                try
                {
                    long count = byteMap ? new PersistentByteMap<double>(heap, MapId).Count : new PersistentHashMap<double, long>(heap, MapId).Count;
                    outcome = $"opened with {count} entries";
                }
                catch (InvalidDataException e)
                {
                    outcome = "refused: " + e.Message;
                }
            }

            image = domain.GetDurableImage();
        }

        using (var domain = SimulatedPersistenceDomain.FromImage(image, Capacity))
        using (HeapFile file = HeapFile.Open(domain))
        using (BufferedDurableHeap heap = BufferedDurableHeap.Open(file, NoAdvancer))
        {
            long count = byteMap ? new PersistentByteMap<long>(heap, MapId).Count : new PersistentHashMap<long, long>(heap, MapId).Count;
            if (control)
            {
                Assert.True(count < Keys.Length, $"the control deleted nothing (wrong-type open {outcome})");
                return;
            }

            Assert.True(count == Keys.Length, $"wrong-type open {outcome}; the right type now finds {count} of {Keys.Length} entries (report: {heap.Recovery})");
            Assert.StartsWith("refused", outcome, StringComparison.Ordinal);
        }
    }

    /// <summary>A heap with the map's five entries and a raw payload; with <paramref name="salvagedEarlier"/>, the raw
    /// payload damaged and an open that salvaged it (the map not touched).</summary>
    private static byte[] Image(bool salvagedEarlier, bool byteMap)
    {
        byte[] image;
        long rawOffset;
        using (var domain = new SimulatedPersistenceDomain(1L << 20, Capacity))
        {
            using (HeapFile file = HeapFile.Create(domain))
            using (BufferedDurableHeap heap = BufferedDurableHeap.Open(file, NoAdvancer))
            {
                if (byteMap)
                {
                    var map = new PersistentByteMap<long>(heap, MapId);
                    foreach (long k in Keys)
                    {
                        map.Set(k, BitConverter.GetBytes(1000 + (k & 0xFF)));
                    }
                }
                else
                {
                    var map = new PersistentHashMap<long, long>(heap, MapId);
                    foreach (long k in Keys)
                    {
                        map.Set(k, 1000 + (k & 0xFF));
                    }
                }

                using (DurableOperation op = heap.BeginOperation())
                {
                    PayloadRef r = op.Allocate(64, RawId);
                    op.GetPayload(r).Fill(7);
                    rawOffset = r.Offset;
                }

                heap.Sync();
            }

            image = domain.GetDurableImage();
        }

        if (!salvagedEarlier)
        {
            return image;
        }

        image[rawOffset + HeapLayout.HeaderSize + 3] ^= 0x01;
        using (var domain = SimulatedPersistenceDomain.FromImage(image, Capacity))
        {
            using (HeapFile file = HeapFile.Open(domain))
            using (BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, SalvageDamagedBlocks = true }))
            {
                Assert.Single(heap.Recovery.DamagedBlocks);
            }

            return domain.GetDurableImage();
        }
    }
}
