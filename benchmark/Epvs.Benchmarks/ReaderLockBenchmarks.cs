using System.Threading;
using BenchmarkDotNet.Attributes;
using BenchmarkDotNet.Configs;
using Epvs.Baselines;
using FasterEpoch = FASTER.core.LightEpoch;
using FasterEpvs = FASTER.core.EpochProtectedVersionScheme;

namespace Epvs.Benchmarks;

/// <summary>
/// The reader side of every mechanism the paper compares, uncontended on one thread: acquire and release shared
/// access (or protection). Baseline: <see cref="ReaderWriterLockSlim"/>. Each invocation runs <see cref="Ops"/>
/// operations.
/// </summary>
[MemoryDiagnoser]
// A category of its own: the suite joins every class into one report grouped by category, where a class without one
// would share a group (and the ratios' baseline) with every other such class.
[GroupBenchmarksBy(BenchmarkLogicalGroupRule.ByCategory)]
[CategoriesColumn]
[BenchmarkCategory("Reader side, uncontended")]
public class ReaderLockBenchmarks
{
    private const int Ops = 16;

    private readonly ReaderWriterLockSlim rwLock = new(LockRecursionPolicy.NoRecursion);
    private readonly object monitor = new();
    private readonly Lock threadingLock = new();
    private BravoReaderWriterLock bravo = null!;
    private LightEpoch epoch = null!;
    private EpochProtectedVersionScheme scheme = null!;
    private FasterEpoch faster = null!;
    private FasterEpoch fasterSchemeEpoch = null!;
    private FasterEpvs fasterScheme = null!;

    [GlobalSetup]
    public void Setup()
    {
        bravo = new BravoReaderWriterLock();
        epoch = new LightEpoch();
        scheme = new EpochProtectedVersionScheme();
        faster = new FasterEpoch();
        fasterSchemeEpoch = new FasterEpoch();
        fasterScheme = new FasterEpvs(fasterSchemeEpoch);
    }

    [GlobalCleanup]
    public void Cleanup()
    {
        bravo.Dispose();
        epoch.Dispose();
        scheme.Dispose();
        faster.Dispose();
        fasterSchemeEpoch.Dispose();
    }

    [Benchmark(Baseline = true, OperationsPerInvoke = Ops)]
    public void ReaderWriterLockSlim_Read()
    {
        for (int i = 0; i < Ops; i++)
        {
            rwLock.EnterReadLock();
            rwLock.ExitReadLock();
        }
    }

    [Benchmark(OperationsPerInvoke = Ops)]
    public void Monitor_Lock()
    {
        for (int i = 0; i < Ops; i++)
        {
            lock (monitor)
            {
            }
        }
    }

    [Benchmark(OperationsPerInvoke = Ops)]
    public void ThreadingLock_EnterScope()
    {
        for (int i = 0; i < Ops; i++)
        {
            using Lock.Scope scope = threadingLock.EnterScope();
        }
    }

    [Benchmark(OperationsPerInvoke = Ops)]
    public void Bravo_Read()
    {
        for (int i = 0; i < Ops; i++)
        {
            int token = bravo.EnterReadLock();
            bravo.ExitReadLock(token);
        }
    }

    [Benchmark(OperationsPerInvoke = Ops)]
    public void Faster_ResumeSuspend()
    {
        for (int i = 0; i < Ops; i++)
        {
            faster.Resume();
            faster.Suspend();
        }
    }

    [Benchmark(OperationsPerInvoke = Ops)]
    public void Epvs_ResumeSuspend()
    {
        for (int i = 0; i < Ops; i++)
        {
            epoch.Resume();
            epoch.Suspend();
        }
    }

    [Benchmark(OperationsPerInvoke = Ops)]
    public long Faster_EpvsEnterLeave()
    {
        long v = 0;
        for (int i = 0; i < Ops; i++)
        {
            v += fasterScheme.Enter().Version;
            fasterScheme.Leave();
        }
        return v;
    }

    [Benchmark(OperationsPerInvoke = Ops)]
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
}
