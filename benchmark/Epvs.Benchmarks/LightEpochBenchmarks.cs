using System;
using BenchmarkDotNet.Attributes;
using BenchmarkDotNet.Configs;
using FasterEpoch = FASTER.core.LightEpoch;

namespace Epvs.Benchmarks;

/// <summary>
/// <see cref="LightEpoch"/> entering and leaving protection from an unprotected thread, next to FASTER.core's
/// <c>LightEpoch</c> (the baseline of each category that FASTER supports). Each invocation runs <see cref="Ops"/>
/// operations.
/// </summary>
[MemoryDiagnoser]
[GroupBenchmarksBy(BenchmarkLogicalGroupRule.ByCategory)]
[CategoriesColumn]
public class LightEpochBenchmarks
{
    private const int Ops = 16;

    private LightEpoch epoch = null!;
    private FasterEpoch faster = null!;
    private Action action = null!;
    private long actionsRun;

    [GlobalSetup]
    public void Setup()
    {
        epoch = new LightEpoch();
        faster = new FasterEpoch();
        action = () => actionsRun++;
    }

    [GlobalCleanup]
    public void Cleanup()
    {
        // Every bump's action ran inside its operation (checked, so both sides did the same work).
        if (actionsRun != 0 && epoch.SafeToReclaimEpoch < epoch.CurrentEpoch - 1)
            throw new InvalidOperationException("A deferred action was left pending.");
        epoch.Dispose();
        faster.Dispose();
    }

    [Benchmark(Baseline = true, OperationsPerInvoke = Ops), BenchmarkCategory("Resume+Suspend")]
    public void Faster_ResumeSuspend()
    {
        for (int i = 0; i < Ops; i++)
        {
            faster.Resume();
            faster.Suspend();
        }
    }

    [Benchmark(OperationsPerInvoke = Ops), BenchmarkCategory("Resume+Suspend")]
    public void Epvs_ResumeSuspend()
    {
        for (int i = 0; i < Ops; i++)
        {
            epoch.Resume();
            epoch.Suspend();
        }
    }

    [Benchmark(OperationsPerInvoke = Ops), BenchmarkCategory("Resume+Suspend")]
    public void Epvs_EnterScope()
    {
        for (int i = 0; i < Ops; i++)
        {
            using LightEpoch.Scope scope = epoch.EnterScope();
        }
    }

    /// <summary>Four nested levels, outermost included (FASTER.core does not support re-entrance).</summary>
    [Benchmark(OperationsPerInvoke = Ops), BenchmarkCategory("Nested Resume (depth 4)")]
    public void Epvs_NestedResumeDepth4()
    {
        for (int i = 0; i < Ops; i++)
        {
            epoch.Resume();
            epoch.Resume();
            epoch.Resume();
            epoch.Resume();
            epoch.Suspend();
            epoch.Suspend();
            epoch.Suspend();
            epoch.Suspend();
        }
    }

    /// <summary>Resume, bump with an action, suspend: the action runs within the operation on both sides (FASTER
    /// refreshes the caller inside the bump and runs it there; Epvs runs it when the caller suspends).</summary>
    [Benchmark(Baseline = true, OperationsPerInvoke = Ops), BenchmarkCategory("BumpCurrentEpoch(Action)")]
    public long Faster_BumpWithAction()
    {
        for (int i = 0; i < Ops; i++)
        {
            faster.Resume();
            faster.BumpCurrentEpoch(action);
            faster.Suspend();
        }
        return actionsRun;
    }

    [Benchmark(OperationsPerInvoke = Ops), BenchmarkCategory("BumpCurrentEpoch(Action)")]
    public long Epvs_BumpWithAction()
    {
        for (int i = 0; i < Ops; i++)
        {
            epoch.Resume();
            epoch.BumpCurrentEpoch(action);
            epoch.Suspend();
        }
        return actionsRun;
    }

    /// <summary>Epvs allows bumping without protection (FASTER.core requires it): the action runs in the call.</summary>
    [Benchmark(OperationsPerInvoke = Ops), BenchmarkCategory("BumpCurrentEpoch(Action)")]
    public long Epvs_BumpWithActionUnprotected()
    {
        for (int i = 0; i < Ops; i++)
            epoch.BumpCurrentEpoch(action);
        return actionsRun;
    }
}
