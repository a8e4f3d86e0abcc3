using System;
using System.Threading;
using BenchmarkDotNet.Attributes;
using BenchmarkDotNet.Configs;
using FasterEpoch = FASTER.core.LightEpoch;
using FasterEpvs = FASTER.core.EpochProtectedVersionScheme;
using FasterStatus = FASTER.core.StateMachineExecutionStatus;

namespace Epvs.Benchmarks;

/// <summary>
/// Latency of one version change requested with <c>TryAdvanceVersionWithCriticalSection</c> by an unprotected thread
/// and waited for until the new version is visible, with 0 or 1 other threads inside a protected region calling
/// <c>Refresh</c> in a loop (the critical section then waits for, and usually runs on, that thread).
/// </summary>
[MemoryDiagnoser]
[GroupBenchmarksBy(BenchmarkLogicalGroupRule.ByCategory, BenchmarkLogicalGroupRule.ByParams)]
[CategoriesColumn]
public class TransitionBenchmarks
{
    private EpochProtectedVersionScheme scheme = null!;
    private FasterEpoch fasterEpoch = null!;
    private FasterEpvs fasterScheme = null!;
    private Action<long, long> criticalSection = null!;
    private Thread? refresher;
    private volatile bool stop;
    private long criticalSections;

    /// <summary>Threads inside protection that refresh in a loop.</summary>
    [Params(0, 1)]
    public int Refreshers { get; set; }

    [GlobalSetup(Target = nameof(Epvs_AdvanceVersion))]
    public void SetupEpvs()
    {
        scheme = new EpochProtectedVersionScheme();
        criticalSection = (_, _) => criticalSections++;
        StartRefresher(() =>
        {
            scheme.Enter();
            while (!stop)
            {
                for (int i = 0; i < 64; i++)
                    scheme.Refresh();
            }
            scheme.Leave();
        });
    }

    [GlobalSetup(Target = nameof(Faster_AdvanceVersion))]
    public void SetupFaster()
    {
        fasterEpoch = new FasterEpoch();
        fasterScheme = new FasterEpvs(fasterEpoch);
        criticalSection = (_, _) => criticalSections++;
        StartRefresher(() =>
        {
            fasterScheme.Enter();
            while (!stop)
            {
                for (int i = 0; i < 64; i++)
                    fasterScheme.Refresh();
            }
            fasterScheme.Leave();
        });
    }

    private void StartRefresher(Action loop)
    {
        if (Refreshers == 0)
            return;
        refresher = new Thread(() => loop()) { IsBackground = true, Name = "refresher" };
        refresher.Start();
    }

    [GlobalCleanup]
    public void Cleanup()
    {
        stop = true;
        if (refresher is not null && !refresher.Join(TimeSpan.FromSeconds(30)))
            throw new TimeoutException("refresher did not stop");
        scheme?.Dispose();
        fasterEpoch?.Dispose();
    }

    [Benchmark(Baseline = true), BenchmarkCategory("TryAdvanceVersionWithCriticalSection")]
    public long Faster_AdvanceVersion()
    {
        long target = fasterScheme.CurrentState().Version + 1;
        var spinner = new SpinWait();
        while (fasterScheme.TryAdvanceVersionWithCriticalSection(criticalSection, target) == FasterStatus.RETRY)
            spinner.SpinOnce(sleep1Threshold: -1);
        spinner.Reset();
        while (fasterScheme.CurrentState().Version < target)
            spinner.SpinOnce(sleep1Threshold: -1);
        return target;
    }

    [Benchmark, BenchmarkCategory("TryAdvanceVersionWithCriticalSection")]
    public long Epvs_AdvanceVersion()
    {
        long target = scheme.CurrentState.Version + 1;
        var spinner = new SpinWait();
        while (scheme.TryAdvanceVersionWithCriticalSection(criticalSection, target) == StateMachineExecutionStatus.Retry)
            spinner.SpinOnce(sleep1Threshold: -1);
        spinner.Reset();
        while (scheme.CurrentState.Version < target)
            spinner.SpinOnce(sleep1Threshold: -1);
        return target;
    }
}
