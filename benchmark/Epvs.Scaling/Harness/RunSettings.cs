using System;

namespace Epvs.Scaling.Harness;

/// <summary>How long each point runs and how often.</summary>
/// <param name="Duration">Measured time of one run.</param>
/// <param name="Repetitions">Runs per point; the median is reported.</param>
/// <param name="Warmup">An unmeasured run before the measured ones (zero for none).</param>
/// <param name="Threads">Thread counts of the scaling figures.</param>
/// <param name="Quick">Smoke mode: short runs, smaller arrays.</param>
public sealed record RunSettings(TimeSpan Duration, int Repetitions, TimeSpan Warmup, int[] Threads, bool Quick)
{
    /// <summary>Logical cores of this machine; thread counts above it are oversubscribed.</summary>
    public static int Cores { get; } = Environment.ProcessorCount;

    /// <summary>The published settings: 3 runs of 0.5 s after a 0.2 s warm-up.</summary>
    public static RunSettings Full { get; } = new(TimeSpan.FromMilliseconds(500), 3, TimeSpan.FromMilliseconds(200), [1, 2, 4, 8], false);

    /// <summary>Smoke settings: one 60 ms run per point after a 20 ms warm-up (which absorbs JIT time).</summary>
    public static RunSettings QuickSettings { get; } = new(TimeSpan.FromMilliseconds(60), 1, TimeSpan.FromMilliseconds(20), [1, 2, 4, 8], true);

    /// <summary>A label for a thread count, starred when oversubscribed.</summary>
    public static string ThreadLabel(int threads) => threads > Cores ? $"{threads}*" : threads.ToString();
}
