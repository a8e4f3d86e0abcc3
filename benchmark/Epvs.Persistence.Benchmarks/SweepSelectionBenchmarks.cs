using System;
using System.Collections.Generic;
using BenchmarkDotNet.Attributes;

namespace Epvs.Persistence.Benchmarks;

/// <summary>
/// A sweep's choice of the densest parked segments (under the sweep's lock, at every stocking that sweeps): 16,384
/// segments of a 1 GiB heap with 1 to 1,024 parked blocks each, as few as hold 100,000 blocks, in address order. The
/// two delegate sorts it used (by count, then the chosen by address) against the histogram of counts that replaced them.
/// </summary>
[MemoryDiagnoser]
public class SweepSelectionBenchmarks
{
    private const int Segments = 16_384;
    private const long Minimum = 100_000;
    private readonly List<(int Count, long Segment)> _candidates = new(Segments);

    [GlobalSetup]
    public void Setup()
    {
        var random = new Random(1);
        for (long segment = 0; segment < Segments; segment++)
        {
            _candidates.Add((random.Next(1, 1025), segment));
        }
    }

    // Each invocation works on a copy of the candidates (the same copy in both, included in both times).
    [Benchmark(Baseline = true)]
    public int SortByCountThenAddress()
    {
        var candidates = new List<(int Count, long Segment)>(_candidates);
        candidates.Sort((a, b) => b.Count.CompareTo(a.Count));
        long take = 0;
        int chosen = 0;
        while (chosen < candidates.Count && take < Minimum)
        {
            take += candidates[chosen++].Count;
        }

        candidates.RemoveRange(chosen, candidates.Count - chosen);
        candidates.Sort((a, b) => a.Segment.CompareTo(b.Segment));
        return candidates.Count;
    }

    [Benchmark]
    public int HistogramOfCounts()
    {
        var candidates = new List<(int Count, long Segment)>(_candidates);
        return PersistentHeap.DensestInAddressOrder(candidates, Minimum).Count;
    }
}
