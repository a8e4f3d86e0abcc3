using System;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// A buffered cycle that writes back version v parks the frees of version v − 1 (the payloads v − 1 replaced) while its
/// own write-back goes to the disk, before its fence and frontier: their replacements have been durable since the
/// previous cycle and no reader of them is left, so they need not wait for v's frontier, and the cycle ends as soon as
/// that frontier is persisted. The frees stay correct: the replaced payload's block is handed out again only through the
/// sweep, and a reopen finds the replacement.
/// </summary>
public sealed class ParkBeforeFenceTests
{
    private const long Capacity = 4 << 20;

    [Fact]
    public void ACycle_ParksThePreviousVersionsFrees_BeforeItPersistsItsOwnFrontier()
    {
        using var domain = new SimulatedPersistenceDomain(Capacity);
        using HeapFile file = HeapFile.Create(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
        var map = new PersistentHashMap<long, long>(heap, DurableWorkload.MapTypeId);
        map.Set(1, 10);
        heap.AdvanceVersion(TimeSpan.FromSeconds(30));

        // Replaced in version w: the cycle that writes back w + 1 parks the old payload's free.
        long w = heap.CurrentVersion;
        map.Set(1, 11);
        heap.AdvanceVersion(TimeSpan.FromSeconds(30));
        Assert.Equal(w, heap.DurableFrontier);

        int parkings = 0;
        long frontierAtParking = -1;
        heap.AfterReclaimMarkedForTesting = () =>
        {
            parkings++;
            frontierAtParking = heap.DurableFrontier;
        };
        long frontier = heap.AdvanceVersion(TimeSpan.FromSeconds(30));
        heap.AfterReclaimMarkedForTesting = null;

        Assert.Equal(w + 1, frontier);
        Assert.Equal(1, parkings);
        Assert.True(frontierAtParking == w, $"the frees of version {w} were parked with the frontier at {frontierAtParking}: after the cycle persisted its own ({w + 1}), not before its fence");

        // Reopened from what is durable: the replacement, not the parked payload.
        heap.Sync();
        using var image = SimulatedPersistenceDomain.FromImage(domain.GetDurableImage());
        using HeapFile again = HeapFile.Open(image);
        using BufferedDurableHeap recovered = BufferedDurableHeap.Open(again, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
        Assert.True(new PersistentHashMap<long, long>(recovered, DurableWorkload.MapTypeId).TryGetValue(1, out long value));
        Assert.Equal(11, value);
    }
}
