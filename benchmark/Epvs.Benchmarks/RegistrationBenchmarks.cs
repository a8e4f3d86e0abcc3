using System;
using System.Threading;
using BenchmarkDotNet.Attributes;
using BenchmarkDotNet.Configs;
using FasterEpoch = FASTER.core.LightEpoch;

namespace Epvs.Benchmarks;

/// <summary>
/// Cost of registering a deferred action with <c>BumpCurrentEpoch(Action)</c> while another thread cycles
/// Resume/Suspend in a loop (issue #9 item 6), next to FASTER.core's <c>LightEpoch</c>. Each invocation runs
/// <see cref="Ops"/> registrations.
/// </summary>
[MemoryDiagnoser]
[GroupBenchmarksBy(BenchmarkLogicalGroupRule.ByCategory)]
[CategoriesColumn]
public class RegistrationBenchmarks
{
    private const int Ops = 16;

    private LightEpoch epoch = null!;
    private FasterEpoch faster = null!;
    private Action action = null!;
    private long actionsRun;
    private Thread? cycler;
    private volatile bool stop;

    [GlobalSetup(Targets = new[] { nameof(Epvs_RegisterOtherThreadCycling), nameof(Epvs_RegisterUnprotectedOtherThreadCycling) })]
    public void SetupEpvs()
    {
        epoch = new LightEpoch();
        action = () => Interlocked.Increment(ref actionsRun);
        StartCycler(() =>
        {
            while (!stop)
            {
                epoch.Resume();
                epoch.Suspend();
            }
        });
    }

    [GlobalSetup(Target = nameof(Faster_RegisterOtherThreadCycling))]
    public void SetupFaster()
    {
        faster = new FasterEpoch();
        action = () => Interlocked.Increment(ref actionsRun);
        StartCycler(() =>
        {
            while (!stop)
            {
                faster.Resume();
                faster.Suspend();
            }
        });
    }

    private void StartCycler(Action loop)
    {
        cycler = new Thread(() => loop()) { IsBackground = true, Name = "cycler" };
        cycler.Start();
    }

    [GlobalCleanup]
    public void Cleanup()
    {
        stop = true;
        if (cycler is not null && !cycler.Join(TimeSpan.FromSeconds(30)))
            throw new TimeoutException("cycler did not stop");
        epoch?.Dispose(); // runs anything still pending
        faster?.Dispose();
    }

    /// <summary>Resume, register, Suspend while another thread cycles Resume/Suspend (FASTER.core needs the caller
    /// protected; its bump refreshes the caller).</summary>
    [Benchmark(Baseline = true, OperationsPerInvoke = Ops), BenchmarkCategory("Register, other thread cycling")]
    public long Faster_RegisterOtherThreadCycling()
    {
        for (int i = 0; i < Ops; i++)
        {
            faster.Resume();
            faster.BumpCurrentEpoch(action);
            faster.Suspend();
        }
        return actionsRun;
    }

    [Benchmark(OperationsPerInvoke = Ops), BenchmarkCategory("Register, other thread cycling")]
    public long Epvs_RegisterOtherThreadCycling()
    {
        for (int i = 0; i < Ops; i++)
        {
            epoch.Resume();
            epoch.BumpCurrentEpoch(action);
            epoch.Suspend();
        }
        return actionsRun;
    }

    /// <summary>The registering thread is not protected (Epvs allows it).</summary>
    [Benchmark(OperationsPerInvoke = Ops), BenchmarkCategory("Register, other thread cycling")]
    public long Epvs_RegisterUnprotectedOtherThreadCycling()
    {
        for (int i = 0; i < Ops; i++)
            epoch.BumpCurrentEpoch(action);
        return actionsRun;
    }
}
