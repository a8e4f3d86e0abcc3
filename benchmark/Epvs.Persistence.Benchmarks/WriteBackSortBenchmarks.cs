using System;
using BenchmarkDotNet.Attributes;

namespace Epvs.Persistence.Benchmarks;

/// <summary>
/// The advancer's sort of a version's write-back list, side by side with a comparison sort: 60,000 block offsets of a
/// 1 GiB heap in ascending runs of 32 (a thread-cache batch each, as when pool refills from sweeps interleave), far
/// more runs than the natural merge takes, so <see cref="AscendingRuns"/> uses its radix sort; and the reclaim's
/// coarser order of the same list (<see cref="AscendingRuns.SortByHighBits"/>).
/// </summary>
public class WriteBackSortBenchmarks
{
    private const int Count = 60_000;
    private const int RunLength = 32;
    private readonly long[] _source = new long[Count];
    private readonly long[] _items = new long[Count];
    private long[] _scratch = new long[Count];

    [GlobalSetup]
    public void Setup()
    {
        var random = new Random(1);
        long position = 0;
        for (int i = 0; i < Count; i++)
        {
            if (i % RunLength == 0)
            {
                position = random.Next(0, 1 << 24) * 64L;
            }

            position += 64;
            _source[i] = position;
        }
    }

    // Each invocation first copies the unsorted list back (the same 480 KB copy in both, included in both times).
    [Benchmark(Baseline = true)]
    public void ArraySort()
    {
        Array.Copy(_source, _items, Count);
        Array.Sort(_items, 0, Count);
    }

    [Benchmark]
    public int AscendingRunsSort()
    {
        Array.Copy(_source, _items, Count);
        return AscendingRuns.Sort(_items, Count, ref _scratch);
    }

    /// <summary>The reclaim's order (by 64 KiB stretch of the file only, the order a parking pass needs) of the same list.</summary>
    [Benchmark]
    public int AscendingRunsSortBySegment()
    {
        Array.Copy(_source, _items, Count);
        return AscendingRuns.SortByHighBits(_items, Count, HeapLayout.SegmentShift, ref _scratch);
    }
}
