using BenchmarkDotNet.Attributes;
using BenchmarkDotNet.Configs;
using FasterEpoch = FASTER.core.LightEpoch;
using FasterEpvs = FASTER.core.EpochProtectedVersionScheme;

namespace Epvs.Benchmarks;

/// <summary>
/// <see cref="EpochProtectedVersionScheme"/> entering and leaving a protected region from an unprotected thread, next
/// to FASTER.core's scheme (the baseline). Each invocation runs <see cref="Ops"/> operations.
/// </summary>
[MemoryDiagnoser]
[GroupBenchmarksBy(BenchmarkLogicalGroupRule.ByCategory)]
[CategoriesColumn]
public class VersionSchemeBenchmarks
{
    private const int Ops = 16;

    private EpochProtectedVersionScheme scheme = null!;
    private EpochProtectedVersionScheme outer = null!;
    private EpochProtectedVersionScheme inner = null!;
    private FasterEpoch fasterEpoch = null!;
    private FasterEpvs fasterScheme = null!;

    [GlobalSetup]
    public void Setup()
    {
        scheme = new EpochProtectedVersionScheme();
        var shared = new LightEpoch();
        outer = new EpochProtectedVersionScheme(shared);
        inner = new EpochProtectedVersionScheme(shared);
        fasterEpoch = new FasterEpoch();
        fasterScheme = new FasterEpvs(fasterEpoch);
    }

    [GlobalCleanup]
    public void Cleanup()
    {
        scheme.Dispose();
        outer.Dispose();
        inner.Dispose();
        outer.Epoch.Dispose();
        fasterEpoch.Dispose();
    }

    [Benchmark(Baseline = true, OperationsPerInvoke = Ops), BenchmarkCategory("EPVS Enter+Leave")]
    public long Faster_EnterLeave()
    {
        long v = 0;
        for (int i = 0; i < Ops; i++)
        {
            v += fasterScheme.Enter().Version;
            fasterScheme.Leave();
        }
        return v;
    }

    [Benchmark(OperationsPerInvoke = Ops), BenchmarkCategory("EPVS Enter+Leave")]
    public long Epvs_EnterLeave()
    {
        long v = 0;
        for (int i = 0; i < Ops; i++)
        {
            v += scheme.Enter().Version;
            scheme.Leave();
        }
        return v;
    }

    [Benchmark(OperationsPerInvoke = Ops), BenchmarkCategory("EPVS Enter+Leave")]
    public long Epvs_EnterScope()
    {
        long v = 0;
        for (int i = 0; i < Ops; i++)
        {
            using EpochProtectedVersionScheme.Scope scope = scheme.EnterScope(out VersionSchemeState s);
            v += s.Version;
        }
        return v;
    }

    /// <summary>Two schemes on one epoch, the second entered inside the first (only the outer one announces).</summary>
    [Benchmark(OperationsPerInvoke = Ops), BenchmarkCategory("EPVS Enter+Leave, nested pair (shared epoch)")]
    public long Epvs_NestedPairEnterLeave()
    {
        long v = 0;
        for (int i = 0; i < Ops; i++)
        {
            v += outer.Enter().Version;
            v += inner.Enter().Version;
            inner.Leave();
            outer.Leave();
        }
        return v;
    }
}
