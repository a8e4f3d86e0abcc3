using System;
using System.Collections.Generic;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// The persisted epoch clock bounds every version begun on the file, so that recovery starts new versions above every
/// tag a crash can leave there. Each cycle persists the clock of the next transition (frontier + 2) with its frontier,
/// in one write-back and fence, so the transition's critical section — which every thread beginning an operation waits
/// for — persists nothing (through the page cache a persist is a pwrite and an fdatasync): only the first transition
/// after the heap opened does. The control persists too small a clock and never in the transition.
/// </summary>
public sealed class EpochClockTests
{
    private const int TypeId = 5;

    [Fact]
    public void EveryVersion_BeginsWithTheDurableClockAtOrAboveIt_AcrossCyclesAndAReopen()
    {
        Assert.Empty(VersionsAboveTheDurableClock(DurabilityFaults.None, out int checkedVersions));
        Assert.True(checkedVersions >= 20, $"only {checkedVersions} versions began");
        Assert.NotEmpty(VersionsAboveTheDurableClock(DurabilityFaults.ClockLeftBehind, out _));
    }

    [Fact]
    public void OnlyTheFirstTransitionAfterOpening_PersistsTheClock()
    {
        using var domain = new SimulatedPersistenceDomain(4 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
        var map = new PersistentHashMap<long, long>(heap, TypeId);
        for (int round = 0; round < 10; round++)
        {
            map.Set(round, round);
            heap.Sync();
        }

        Assert.Equal(1, heap.ClockPersistsInTransitionsForTesting);
        Assert.Equal(heap.DurableFrontier + 2, file.EpochClock);
    }

    /// <summary>Runs cycles with writes, reopens the durable image (recovery), runs more; returns every version that began while the durable clock was below it.</summary>
    private static List<string> VersionsAboveTheDurableClock(DurabilityFaults faults, out int checkedVersions)
    {
        var violations = new List<string>();
        int count = 0;
        byte[] image;
        using (var domain = new SimulatedPersistenceDomain(4 << 20))
        {
            using HeapFile file = HeapFile.Create(domain);
            using (BufferedDurableHeap heap = Open(file, domain, faults, violations, () => count++))
            {
                Run(heap);
            }

            image = domain.GetDurableImage();
        }

        using (var domain = SimulatedPersistenceDomain.FromImage(image))
        {
            using HeapFile file = HeapFile.Open(domain);
            using BufferedDurableHeap heap = Open(file, domain, faults, violations, () => count++);
            Run(heap);
        }

        checkedVersions = count;
        return violations;
    }

    private static BufferedDurableHeap Open(HeapFile file, SimulatedPersistenceDomain domain, DurabilityFaults faults, List<string> violations, Action counted)
    {
        BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, Faults = faults });
        heap.VersionBeginsForTesting = version =>
        {
            counted();
            long clock = (long)(BitConverter.ToUInt64(domain.GetDurableImage(), HeapLayout.EpochClockOffset) & HeapLayout.SealedValueMask);
            if (clock < version)
            {
                violations.Add($"version {version} began with the durable clock at {clock}");
            }
        };
        return heap;
    }

    private static void Run(BufferedDurableHeap heap)
    {
        var map = new PersistentHashMap<long, long>(heap, TypeId);
        for (int round = 0; round < 10; round++)
        {
            map.Set(round % 3, round);
            heap.Sync();
        }
    }
}
