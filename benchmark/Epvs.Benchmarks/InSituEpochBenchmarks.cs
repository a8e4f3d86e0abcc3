using System;
using BenchmarkDotNet.Attributes;
using BenchmarkDotNet.Configs;
using FasterEpoch = FASTER.core.LightEpoch;

namespace Epvs.Benchmarks;

/// <summary>
/// What epoch protection costs around memory-bound work, as a data structure pays it: each operation is two dependent
/// cache misses in a 256 MiB table and a store to a third random line, in a 256 MiB array of its own (a hash lookup and a
/// payload write; the table is never written, so its chain stays as long as it was built), unprotected
/// (the baseline), inside <see cref="LightEpoch"/> Resume/Suspend, and inside FASTER.core's. An empty operation
/// (<see cref="LightEpochBenchmarks"/>) hides this cost: there the fence of Resume has nothing to wait for. The fence
/// alone (<see cref="FullFenceOnly"/>) shows how much of it any announcement with store-load ordering pays.
/// </summary>
[MemoryDiagnoser]
// A category of its own: the suite joins every class into one report grouped by category, where a class without one
// would share a group (and the ratios' baseline) with every other such class.
[GroupBenchmarksBy(BenchmarkLogicalGroupRule.ByCategory)]
[CategoriesColumn]
[BenchmarkCategory("In situ: two misses + a store")]
public class InSituEpochBenchmarks
{
    private const int Ops = 1024;
    private const int Entries = 1 << 25;

    private LightEpoch epoch = null!;
    private FasterEpoch faster = null!;
    private long[] table = null!;
    private long[] payloads = null!;
    private ulong state = 0x9E37_79B9_7F4A_7C15UL;

    [GlobalSetup]
    public void Setup()
    {
        epoch = new LightEpoch();
        faster = new FasterEpoch();
        table = new long[Entries];
        payloads = new long[Entries];
        for (int i = 0; i < Entries; i++)
        {
            // A fixed permutation-like chain, so the second load depends on the first.
            table[i] = (long)(((ulong)i * 0x9E37_79B9UL) & (Entries - 1));
            // Touched here, so no measured store pays the page's first-touch fault.
            payloads[i] = i;
        }
    }

    [GlobalCleanup]
    public void Cleanup()
    {
        epoch.Dispose();
        faster.Dispose();
    }

    [Benchmark(Baseline = true, OperationsPerInvoke = Ops)]
    public long Unprotected()
    {
        long sum = 0;
        for (int i = 0; i < Ops; i++)
        {
            sum += Body(i);
        }

        return sum;
    }

    [Benchmark(OperationsPerInvoke = Ops)]
    public long Epvs_ResumeSuspend()
    {
        long sum = 0;
        for (int i = 0; i < Ops; i++)
        {
            epoch.Resume();
            sum += Body(i);
            epoch.Suspend();
        }

        return sum;
    }

    /// <summary>Only the full fence an entry needs (store-load ordering of the announcement), no epoch: how much of the cost is the fence itself.</summary>
    [Benchmark(OperationsPerInvoke = Ops)]
    public long FullFenceOnly()
    {
        long sum = 0;
        for (int i = 0; i < Ops; i++)
        {
            System.Threading.Interlocked.MemoryBarrier();
            sum += Body(i);
        }

        return sum;
    }

    [Benchmark(OperationsPerInvoke = Ops)]
    public long Faster_ResumeSuspend()
    {
        long sum = 0;
        for (int i = 0; i < Ops; i++)
        {
            faster.Resume();
            sum += Body(i);
            faster.Suspend();
        }

        return sum;
    }

    private long Body(int i)
    {
        ulong x = state;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        state = x;
        long[] t = table;
        long first = t[(long)(x & (Entries - 1))];
        long second = t[first];
        // The store goes to its own array: stored into the table, the small values of i would replace chain entries,
        // and after a few million operations the second load would land in the table's first 8 KB (a hit, not a miss).
        payloads[(second ^ (long)(x >> 40)) & (Entries - 1)] = i;
        return second;
    }
}
