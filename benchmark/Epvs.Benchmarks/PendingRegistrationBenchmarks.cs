using System;
using System.Threading;
using BenchmarkDotNet.Attributes;
using BenchmarkDotNet.Configs;

namespace Epvs.Benchmarks;

/// <summary>
/// Cost of registering a deferred action with <c>BumpCurrentEpoch(Action)</c> from an unprotected thread while another
/// thread is parked inside protection and about <see cref="Pending"/> actions are already waiting behind it (issue #9
/// item 6). Epvs only: FASTER.core's drain list has 16 slots, and a 17th registration while a thread is parked spins
/// forever. Each iteration starts from exactly <see cref="Pending"/> waiting actions and adds
/// <c>InvocationCount × ParkedOps</c> = 256 more.
/// </summary>
[MemoryDiagnoser]
[GroupBenchmarksBy(BenchmarkLogicalGroupRule.ByCategory, BenchmarkLogicalGroupRule.ByParams)]
[CategoriesColumn]
[InvocationCount(4, 1)]
public class PendingRegistrationBenchmarks
{
    private const int ParkedOps = 64;

    private LightEpoch epoch = null!;
    private Action action = null!;
    private long actionsRun;
    private Thread? parked;
    private volatile bool stop;
    private readonly SemaphoreSlim park = new(0);
    private readonly SemaphoreSlim parkedInside = new(0);
    private readonly SemaphoreSlim release = new(0);
    private readonly SemaphoreSlim released = new(0);

    /// <summary>Actions already pending (held back by the parked thread) when an iteration starts.</summary>
    [Params(1_000, 20_000)]
    public int Pending { get; set; }

    [GlobalSetup]
    public void Setup()
    {
        epoch = new LightEpoch();
        action = () => Interlocked.Increment(ref actionsRun);
        parked = new Thread(() =>
        {
            while (true)
            {
                park.Wait();
                if (stop)
                    return;
                epoch.Resume();
                parkedInside.Release();
                release.Wait();
                epoch.Suspend(); // runs everything that was pending
                released.Release();
            }
        })
        { IsBackground = true, Name = "parked" };
        parked.Start();
    }

    /// <summary>Parks the thread and registers <see cref="Pending"/> actions behind it (not measured).</summary>
    [IterationSetup(Target = nameof(Epvs_RegisterWhileParked))]
    public void Park()
    {
        park.Release();
        Wait(parkedInside);
        for (int i = 0; i < Pending; i++)
            epoch.BumpCurrentEpoch(action);
    }

    /// <summary>Lets the parked thread leave (it runs every pending action) and checks that nothing was left.</summary>
    [IterationCleanup(Target = nameof(Epvs_RegisterWhileParked))]
    public void Unpark()
    {
        release.Release();
        Wait(released);
        if (epoch.GetSnapshot().PendingActionEpochs.Count != 0)
            throw new InvalidOperationException("actions were left pending after the parked thread left");
    }

    private static void Wait(SemaphoreSlim semaphore)
    {
        if (!semaphore.Wait(TimeSpan.FromSeconds(60)))
            throw new TimeoutException("the parked thread did not answer");
    }

    [GlobalCleanup]
    public void Cleanup()
    {
        stop = true;
        park.Release();
        if (parked is not null && !parked.Join(TimeSpan.FromSeconds(30)))
            throw new TimeoutException("parked thread did not stop");
        epoch.Dispose();
    }

    /// <summary>One unprotected registration while a thread is parked inside protection with about
    /// <see cref="Pending"/> actions waiting (each iteration adds <c>4 × 64</c> more).</summary>
    [Benchmark(OperationsPerInvoke = ParkedOps), BenchmarkCategory("Register, parked thread")]
    public long Epvs_RegisterWhileParked()
    {
        for (int i = 0; i < ParkedOps; i++)
            epoch.BumpCurrentEpoch(action);
        return actionsRun;
    }
}
