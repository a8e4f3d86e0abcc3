using System;
using System.Linq;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>The write-back list's sort: the natural merge of ascending runs must order any input exactly as a comparison sort does.</summary>
public sealed class AscendingRunsTests
{
    [Theory]
    [InlineData(0, 1)]
    [InlineData(1, 1)]
    [InlineData(1000, 1)]
    [InlineData(1000, 2)]
    [InlineData(1000, 3)]
    [InlineData(5000, 17)]
    [InlineData(5000, AscendingRuns.MaxRunsToMerge)]
    [InlineData(5000, AscendingRuns.MaxRunsToMerge + 1)]
    [InlineData(5000, 900)]
    public void Sort_OrdersAnyNumberOfRuns_AsAComparisonSortDoes(int count, int runs)
    {
        var random = new Random((count * 31) + runs);
        for (int sample = 0; sample < 20; sample++)
        {
            long[] items = Runs(random, count, runs);
            long[] expected = items.ToArray();
            Array.Sort(expected);
            long[] scratch = new long[1];
            // One spare item past count, which the sort must leave alone.
            long[] buffer = items.Append(-7L).ToArray();
            int found = AscendingRuns.Sort(buffer, count, ref scratch);
            Assert.Equal(expected, buffer.Take(count));
            Assert.Equal(-7L, buffer[count]);
            Assert.True(found >= 1, $"{found} runs");
        }
    }

    /// <summary><paramref name="count"/> offsets (with duplicates) in <paramref name="runs"/> ascending stretches starting at random places.</summary>
    private static long[] Runs(Random random, int count, int runs)
    {
        long[] items = new long[count];
        int perRun = Math.Max(1, count / runs);
        long position = 0;
        for (int i = 0; i < count; i++)
        {
            if (i % perRun == 0)
            {
                position = random.Next(0, 1000) * 64L;
            }

            position += 64 * random.Next(0, 3);
            items[i] = position;
        }

        return items;
    }
}
