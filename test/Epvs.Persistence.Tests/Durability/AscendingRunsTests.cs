using System;
using System.Collections.Generic;
using System.Linq;
using System.Runtime.InteropServices;
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

    [Theory]
    [InlineData(100_000, 6, 40)]
    [InlineData(100_000, 0, 31)]
    [InlineData(20_000, 6, 62)]
    [InlineData(50_000, 6, 30)]
    [InlineData(3_000, 0, 3)]
    public void Sort_ManyRuns_OrdersOffsetsOfAnyMagnitude(int count, int alignmentBits, int magnitudeBits)
    {
        // Random order (far more runs than the merge takes): the radix sort, over offsets up to 2^magnitudeBits,
        // multiples of 2^alignmentBits (block offsets are multiples of 64), with duplicates and zeros.
        var random = new Random(count + alignmentBits + magnitudeBits);
        long[] items = new long[count + 1];
        for (int i = 0; i < count; i++)
        {
            long value = random.NextInt64(0, 1L << (magnitudeBits - 1)) << 1 >> alignmentBits << alignmentBits;
            items[i] = i % 97 == 0 ? 0 : (i % 89 == 0 ? items[i / 2] : value);
        }

        items[count] = -7;
        long[] expected = items.Take(count).ToArray();
        Array.Sort(expected);
        long[] scratch = new long[1];
        Assert.Equal(AscendingRuns.MaxRunsToMerge + 1, AscendingRuns.Sort(items, count, ref scratch));
        Assert.Equal(expected, items.Take(count));
        Assert.Equal(-7L, items[count]);
    }

    [Theory]
    [InlineData(100_000, 4, 28, 16)]
    [InlineData(100_000, 4, 40, 16)]
    [InlineData(50_000, 0, 20, 16)]
    [InlineData(5_000, 4, 16, 16)]
    [InlineData(5_000, 4, 12, 16)]
    [InlineData(5_000, 4, 28, 0)]
    [InlineData(5_000, 4, 28, 17)]
    public void SortByHighBits_OrdersBy64KiBStretchKeepingEveryItem(int count, int alignmentBits, int magnitudeBits, int fromBit)
    {
        // The reclaim's order (random offsets, so the radix sort): by the bits from fromBit up, each item still there.
        var random = new Random(count + alignmentBits + magnitudeBits + fromBit);
        long[] items = new long[count + 1];
        for (int i = 0; i < count; i++)
        {
            items[i] = random.NextInt64(0, 1L << magnitudeBits) >> alignmentBits << alignmentBits;
        }

        items[count] = -7;
        long[] expected = items.Take(count).Order().ToArray();
        long[] scratch = [];
        AscendingRuns.SortByHighBits(items, count, fromBit, ref scratch);
        Assert.Equal(-7L, items[count]);
        Assert.Equal(expected, items.Take(count).Order());
        for (int i = 1; i < count; i++)
        {
            Assert.True(items[i - 1] >> fromBit <= items[i] >> fromBit, $"item {i}: 0x{items[i]:X} after 0x{items[i - 1]:X}");
        }
    }

    [Theory]
    [InlineData(3_000, 40)]
    [InlineData(30_000, 900)]
    public void Sort_TheListOfASweepLogHalf_OrdersItInPlace(int count, int runs)
    {
        // The sweep log's turn sorts the span of its list of a half's blocks (a run per appended batch): the items
        // outside the span (the list's spare capacity) stay as they were, and the scratch grows from empty.
        var random = new Random(count + runs);
        var listed = new List<long>(count + 16);
        listed.AddRange(Runs(random, count, runs));
        long[] expected = listed.ToArray();
        Array.Sort(expected);
        long[] scratch = [];
        int found = AscendingRuns.Sort(CollectionsMarshal.AsSpan(listed), ref scratch);
        Assert.Equal(expected, listed);
        Assert.True(scratch.Length >= count, $"scratch of {scratch.Length} for {count} items");
        // (A run that starts above the end of the one before continues it: at most as many runs as stretches.)
        Assert.InRange(found, 2, Math.Min(runs, AscendingRuns.MaxRunsToMerge + 1));
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
