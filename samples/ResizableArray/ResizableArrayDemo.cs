using System;
using System.Collections.Generic;
using System.IO;

namespace Epvs.Samples.ResizableArray;

/// <summary>Runs every variant side by side and prints a table; used by this sample's Program and by the Tour.</summary>
public static class ResizableArrayDemo
{
    /// <summary>Runs each variant for <paramref name="perVariant"/> and prints throughput relative to the latched
    /// baseline.</summary>
    /// <param name="output">Where to print.</param>
    /// <param name="perVariant">Measured time per variant.</param>
    /// <param name="threads">Worker threads.</param>
    /// <param name="pushPercent">Percentage of pushes in the mix.</param>
    /// <returns>The results, latched baseline first.</returns>
    public static IReadOnlyList<ThroughputResult> Run(TextWriter output, TimeSpan perVariant, int threads = 2, int pushPercent = 10)
    {
        ArgumentNullException.ThrowIfNull(output);
        const int Prefill = 1 << 20;
        const int MockCapacity = Prefill + (1 << 25); // 256 MiB of longs; the driver never pushes past it
        const int Seed = 20240601;
        output.WriteLine($"  {threads} threads, {pushPercent}% push / {(100 - pushPercent) / 2}% read / {(100 - pushPercent) / 2}% write, {Prefill:N0} prefilled, {perVariant.TotalSeconds:0.#} s per variant");
        output.WriteLine($"  {"variant",-20} {"Mops/s",8} {"x latched",10} {"pushes",12} {"capacity",12}");
        var results = new List<ThroughputResult>();
        double baseline = 0;
        foreach (ResizableArrayKind kind in ResizableArrayFactory.AllKinds)
        {
            ThroughputResult result;
            using (IResizableArray array = ResizableArrayFactory.Create(kind, Prefill, MockCapacity))
                result = ResizableArrayThroughput.Run(array, threads, perVariant, pushPercent, Prefill, Seed);
            if (kind == ResizableArrayKind.Latched)
                baseline = result.MillionOpsPerSecond;
            results.Add(result);
            string ratio = baseline > 0 ? $"{result.MillionOpsPerSecond / baseline:0.00}x" : "-";
            output.WriteLine($"  {result.Name,-20} {result.MillionOpsPerSecond,8:0.0} {ratio,10} {result.FinalCount - Prefill,12:N0} {result.FinalCapacity,12:N0}");
            GC.Collect();
        }
        return results;
    }
}
