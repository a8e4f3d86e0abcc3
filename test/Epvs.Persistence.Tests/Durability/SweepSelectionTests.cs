using System;
using System.Collections.Generic;
using System.Linq;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// Issue 10, the sweep's choice of segments: the densest parked segments, as few as hold the blocks asked for, in address
/// order (chosen from a histogram of their counts, where sorting every segment by count took O(n log n) delegate
/// comparisons under the sweep's lock). Checked against the sort it replaced, on random heaps.
/// </summary>
public sealed class SweepSelectionTests
{
    [Theory]
    [InlineData(1)]
    [InlineData(2)]
    [InlineData(3)]
    public void TheDensestSegments_AsFewAsHoldTheMinimum_InAddressOrder(int seed)
    {
        var random = new Random(seed);
        for (int round = 0; round < 200; round++)
        {
            var candidates = new List<(int Count, long Segment)>();
            long segment = 0;
            int segments = random.Next(0, 300);
            for (int i = 0; i < segments; i++)
            {
                segment += random.Next(1, 4);
                // Few distinct counts, so that ties at the threshold are common.
                candidates.Add((random.Next(0, 4) == 0 ? 1024 : random.Next(1, 40), segment));
            }

            long total = candidates.Sum(c => (long)c.Count);
            long minimum = random.Next(0, 3) switch
            {
                0 => random.NextInt64(0, total + 2),
                1 => total + random.Next(0, 100),
                _ => random.Next(0, 64),
            };

            List<(int Count, long Segment)> chosen = PersistentHeap.DensestInAddressOrder(candidates, minimum);
            List<(int Count, long Segment)> reference = BySort(candidates, minimum);

            Assert.Equal(reference.Select(c => c.Count).OrderBy(c => c), chosen.Select(c => c.Count).OrderBy(c => c));
            Assert.Equal(chosen.OrderBy(c => c.Segment), chosen);
            Assert.All(chosen, c => Assert.Contains(c, candidates));
            Assert.Equal(chosen.Count, chosen.Select(c => c.Segment).Distinct().Count());
        }
    }

    /// <summary>The selection it replaced: sort by count, densest first, take until the minimum, sort by address.</summary>
    private static List<(int Count, long Segment)> BySort(List<(int Count, long Segment)> candidates, long minimum)
    {
        var sorted = candidates.OrderByDescending(c => c.Count).ToList();
        long take = 0;
        int chosen = 0;
        while (chosen < sorted.Count && take < minimum)
        {
            take += sorted[chosen++].Count;
        }

        return sorted.Take(chosen).OrderBy(c => c.Segment).ToList();
    }
}
