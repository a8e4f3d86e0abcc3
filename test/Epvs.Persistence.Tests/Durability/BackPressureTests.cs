using System;
using System.Collections.Generic;
using System.Linq;
using System.Threading;
using Xunit;
using Xunit.Abstractions;

namespace Epvs.Persistence.Tests;

/// <summary>
/// The heap-full of the benchmark (a fast producer with the advancer starved of CPU: retired payloads pile up faster
/// than two-versions-later reclamation frees them). Here the advancer is absent altogether — the worst starvation —
/// and the property is that a churning workload stays within a bounded heap because operations help reclaim.
/// </summary>
public sealed class BackPressureTests
{
    private const int Seed = 4411;
    private const long Capacity = 4 << 20;
    private const int Operations = 40_000;
    private const int Keys = 64;
    private readonly ITestOutputHelper _output;

    public BackPressureTests(ITestOutputHelper output) => _output = output;

    [Theory]
    [InlineData(DurabilityMode.Transient)]
    [InlineData(DurabilityMode.Buffered)]
    public void Churn_WithTheAdvancerStarved_StaysWithinTheHeapByHelpingReclaim(DurabilityMode mode)
    {
        List<string> violations = Churn(mode, DurabilityFaults.None, out long peak, out long limit);
        _output.WriteLine($"seed={Seed} mode={mode}: peak backlog {peak} bytes, limit {limit}; {string.Join(" | ", violations)}");
        Assert.Empty(violations);
    }

    [Theory]
    [InlineData(DurabilityMode.Transient)]
    [InlineData(DurabilityMode.Buffered)]
    public void Churn_WithoutBackPressure_IsCaughtRunningOutOfBlocks(DurabilityMode mode)
    {
        List<string> violations = Churn(mode, DurabilityFaults.NoBackPressure, out _, out _);
        _output.WriteLine($"control: {string.Join(" | ", violations)}");
        Assert.True(
            violations.Any(v => v.Contains("heap full") || v.Contains("backlog")),
            "INCONCLUSIVE: the broken control (no back-pressure) was not caught; the check proves nothing on this run.");
    }

    /// <summary>One thread churns 1 KB set/remove on a few keys of a 4 MiB heap with no advancer; reports a heap-full and a backlog over twice the limit.</summary>
    private static List<string> Churn(DurabilityMode mode, DurabilityFaults faults, out long peak, out long limit)
    {
        var violations = new List<string>();
        peak = 0;
        using var domain = new SimulatedPersistenceDomain(Capacity);
        using HeapFile file = HeapFile.Create(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { Mode = mode, AdvancePeriod = Timeout.InfiniteTimeSpan, Faults = faults });
        limit = Math.Max(1L << 20, file.Size / 8);
        var map = new PersistentByteMap<long>(heap, DurableWorkload.MapTypeId);
        var random = new Random(Seed);
        byte[] value = new byte[1000];
        for (int i = 0; i < Operations; i++)
        {
            long key = random.Next(Keys);
            try
            {
                if (random.Next(2) == 0)
                {
                    map.Set(key, value);
                }
                else
                {
                    map.Remove(key);
                }
            }
            catch (InsufficientMemoryException e)
            {
                violations.Add($"heap full after {i} operations (backlog {heap.ReclaimBacklog} bytes, {heap.Heap.GetStatistics()}): {e.Message}");
                break;
            }

            peak = Math.Max(peak, heap.ReclaimBacklog);
        }

        // The bound: the limit, plus what one thread retires between two looks at the backlog, plus one cycle's worth.
        if (peak > 2 * limit)
        {
            violations.Add($"backlog peaked at {peak} bytes, over twice the limit {limit}");
        }

        return violations;
    }
}
