using System;
using BenchmarkDotNet.Attributes;
using BenchmarkDotNet.Configs;
using FasterEpoch = FASTER.core.LightEpoch;
using FasterEpvs = FASTER.core.EpochProtectedVersionScheme;

namespace Epvs.Benchmarks;

/// <summary>
/// Operations of a thread that stays protected: <see cref="LightEpoch.ProtectAndDrain"/>,
/// <see cref="EpochProtectedVersionScheme.Refresh"/>, and a nested enter on a second scheme sharing the epoch. The
/// benchmark thread enters protection in the global setup (BenchmarkDotNet runs setup and iterations on one thread).
/// </summary>
[MemoryDiagnoser]
[GroupBenchmarksBy(BenchmarkLogicalGroupRule.ByCategory)]
[CategoriesColumn]
public class ProtectedBenchmarks
{
    private const int Ops = 16;

    private LightEpoch epoch = null!;
    private FasterEpoch faster = null!;
    private EpochProtectedVersionScheme scheme = null!;
    private EpochProtectedVersionScheme inner = null!;
    private FasterEpoch fasterSchemeEpoch = null!;
    private FasterEpvs fasterScheme = null!;

    [GlobalSetup]
    public void Setup()
    {
        epoch = new LightEpoch();
        faster = new FasterEpoch();
        scheme = new EpochProtectedVersionScheme(epoch);
        inner = new EpochProtectedVersionScheme(epoch);
        fasterSchemeEpoch = new FasterEpoch();
        fasterScheme = new FasterEpvs(fasterSchemeEpoch);

        // Each side's thread is protected on its own instances; the two libraries do not interact.
        scheme.Enter();
        faster.Resume();
        fasterScheme.Enter();
        if (!epoch.ThisInstanceProtected() || !faster.ThisInstanceProtected())
            throw new InvalidOperationException("setup did not leave the thread protected");
    }

    [GlobalCleanup]
    public void Cleanup()
    {
        scheme.Leave();
        faster.Suspend();
        fasterScheme.Leave();
        scheme.Dispose();
        inner.Dispose();
        epoch.Dispose();
        faster.Dispose();
        fasterSchemeEpoch.Dispose();
    }

    [Benchmark(Baseline = true, OperationsPerInvoke = Ops), BenchmarkCategory("ProtectAndDrain")]
    public void Faster_ProtectAndDrain()
    {
        for (int i = 0; i < Ops; i++)
            faster.ProtectAndDrain();
    }

    [Benchmark(OperationsPerInvoke = Ops), BenchmarkCategory("ProtectAndDrain")]
    public void Epvs_ProtectAndDrain()
    {
        for (int i = 0; i < Ops; i++)
            epoch.ProtectAndDrain();
    }

    [Benchmark(Baseline = true, OperationsPerInvoke = Ops), BenchmarkCategory("EPVS Refresh")]
    public long Faster_Refresh()
    {
        long v = 0;
        for (int i = 0; i < Ops; i++)
            v += fasterScheme.Refresh().Version;
        return v;
    }

    [Benchmark(OperationsPerInvoke = Ops), BenchmarkCategory("EPVS Refresh")]
    public long Epvs_Refresh()
    {
        long v = 0;
        for (int i = 0; i < Ops; i++)
            v += scheme.Refresh().Version;
        return v;
    }

    /// <summary>Enter and leave a second scheme on the same epoch inside the outer region (G8; FASTER.core cannot
    /// nest).</summary>
    [Benchmark(OperationsPerInvoke = Ops), BenchmarkCategory("EPVS nested Enter+Leave (shared epoch)")]
    public long Epvs_NestedEnterLeave()
    {
        long v = 0;
        for (int i = 0; i < Ops; i++)
        {
            v += inner.Enter().Version;
            inner.Leave();
        }
        return v;
    }
}
