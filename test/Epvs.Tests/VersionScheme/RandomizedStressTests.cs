using System;
using System.Diagnostics;
using System.Threading;
using Xunit;

namespace Epvs.Tests;

/// <summary>
/// A seeded, bounded random mix of Enter/Refresh/Leave, nesting across schemes that share an epoch, simple advances
/// requested inside and outside regions, and three-phase machines, on several threads. Checks mutual exclusion
/// (no region sees a critical section running or a published version other than its own) and monotonic versions
/// (each thread sees every scheme's version only grow; each version is entered by one critical section).
/// Nesting stays within one epoch (see the remarks on <see cref="EpochProtectedVersionScheme"/>). Longer runs: set
/// EPVS_STRESS_SECONDS.
/// </summary>
public class RandomizedStressTests
{
    private readonly ITestOutputHelper output;

    public RandomizedStressTests(ITestOutputHelper output) => this.output = output;

    private sealed class Tracked
    {
        public Tracked(EpochProtectedVersionScheme scheme) => Scheme = scheme;

        public EpochProtectedVersionScheme Scheme { get; }

        public long Published = 1;
        public int Running;
        public int[] EnteredVersions = new int[1 << 19];
    }

    private static int Seconds => int.TryParse(Environment.GetEnvironmentVariable("EPVS_STRESS_SECONDS"), out int s) ? s : 2;

    [Theory]
    [InlineData(1)]
    [InlineData(2)]
    [InlineData(3)]
    public void RandomMix_SeveralSchemesAndThreads_MutualExclusionAndMonotonicVersionsHold(int seed)
    {
        output.WriteLine($"seed {seed}, {Seconds} s");
        string? failure = RunMix(seed, Seconds);
        Assert.True(failure is null, failure);
    }

    [Fact]
    public void RandomMix_ControlTrustingStaleAnnouncements_IsCaught()
    {
        // The control: a nested Enter that trusts an announcement a concurrent bump's scan may have missed (the
        // re-announce in LightEpoch.Resume switched off). The same mix must catch it.
        string? caught = null;
        int seed = 100;
        LightEpoch.DisableReannounceForTesting = true;
        try
        {
            // Each seed catches it about one time in four on two cores: up to 24 (stopping at the first catch).
            for (; seed < 124 && caught is null; seed++)
                caught = RunMix(seed, 2);
        }
        finally
        {
            LightEpoch.DisableReannounceForTesting = false;
        }
        output.WriteLine($"control: {caught ?? "not caught"} (seeds 100..{seed - 1})");
        Assert.SkipWhen(caught is null, "inconclusive: the control (stale announcements trusted) was not caught in 24 seeds");
    }

    private string? RunMix(int seed, int seconds)
    {
        using var shared = new LightEpoch(initialTableSize: 2);
        using var own = new EpochProtectedVersionScheme();
        using var a = new EpochProtectedVersionScheme(shared);
        using var b = new EpochProtectedVersionScheme(shared);
        var schemes = new[] { new Tracked(a), new Tracked(b), new Tracked(own) };
        string? failure = null;
        long regions = 0;
        var deadline = Stopwatch.StartNew();

        void Fail(string message) => Interlocked.CompareExchange(ref failure, message, null);

        void CriticalSection(Tracked t, long from, long to)
        {
            if (Interlocked.Exchange(ref t.Running, 1) != 0)
                Fail($"two critical sections at once on {from}->{to}");
            if (Volatile.Read(ref t.Published) != from)
                Fail($"critical section {from}->{to} found published version {t.Published}");
            Thread.SpinWait(30);
            if (to < t.EnteredVersions.Length)
                Interlocked.Increment(ref t.EnteredVersions[to]);
            Volatile.Write(ref t.Published, to);
            Volatile.Write(ref t.Running, 0);
        }

        void CheckRegion(Tracked t, long observed, string where)
        {
            if (Volatile.Read(ref t.Running) != 0)
                Fail($"region in version {observed} overlapped a critical section ({where})");
            long published = Volatile.Read(ref t.Published);
            if (published != observed)
                Fail($"region observed {observed} but {published} was published ({where})");
        }

        GuardedThread.RunAll(4, worker =>
        {
            var rng = new Random(seed * 100 + worker);
            var lastSeen = new long[schemes.Length];
            var depth = new int[schemes.Length];
            var observed = new long[schemes.Length];
            int ops = 0;
            while (deadline.Elapsed.TotalSeconds < seconds && ops < 100_000 * seconds && Volatile.Read(ref failure) is null)
            {
                ops++;
                int i = rng.Next(schemes.Length);
                Tracked t = schemes[i];
                int op = rng.Next(100);
                // Nest freely within the shared epoch (schemes 0 and 1), never across epochs: protection held on one
                // epoch while waiting on another can deadlock, like two locks taken in opposite orders (documented).
                bool otherEpochHeld = i == 2 ? depth[0] + depth[1] > 0 : depth[2] > 0;
                if (otherEpochHeld && depth[i] == 0 && op < 35)
                    op = 95;
                if (op < 35 && depth[i] < 3)
                {
                    long v = t.Scheme.Enter().Version;
                    if (depth[i] > 0 && v != observed[i])
                        Fail($"nested Enter saw {v} inside a region that observed {observed[i]}");
                    if (v < lastSeen[i])
                        Fail($"version went backwards: {lastSeen[i]} -> {v}");
                    lastSeen[i] = observed[i] = v;
                    depth[i]++;
                    CheckRegion(t, v, "enter");
                    Interlocked.Increment(ref regions);
                }
                else if (op < 65 && depth[i] > 0)
                {
                    CheckRegion(t, observed[i], "leave");
                    t.Scheme.Leave();
                    depth[i]--;
                }
                else if (op < 75 && depth[i] > 0)
                {
                    long v = t.Scheme.Refresh().Version;
                    if (v < lastSeen[i])
                        Fail($"version went backwards on refresh: {lastSeen[i]} -> {v}");
                    // Nested or not, every region of this thread on this scheme now observes v.
                    lastSeen[i] = observed[i] = v;
                    CheckRegion(t, v, "refresh");
                }
                else if (op < 88)
                {
                    long target = (depth[i] > 0 ? observed[i] : t.Scheme.CurrentState.Version) + 1;
                    t.Scheme.TryAdvanceVersionWithCriticalSection((from, to) => CriticalSection(t, from, to), target);
                }
                else if (op < 93)
                {
                    var machine = new PhaseMachine(3)
                    {
                        OnEntering = (from, to) =>
                        {
                            if (from.Version != to.Version)
                                CriticalSection(t, from.Version, to.Version);
                        },
                    };
                    t.Scheme.TryExecuteStateMachine(machine);
                }
                else if (AnyProtected(depth))
                {
                    // Step out of everything now and then, so transitions requested under protection get through.
                    for (int k = 0; k < schemes.Length; k++)
                    {
                        while (depth[k] > 0)
                        {
                            schemes[k].Scheme.Leave();
                            depth[k]--;
                        }
                    }
                }
            }
            for (int k = 0; k < schemes.Length; k++)
            {
                while (depth[k]-- > 0)
                    schemes[k].Scheme.Leave();
            }
        });

        if (failure is not null)
            return failure;
        foreach (Tracked t in schemes)
        {
            Bounded.WaitUntil(() => !t.Scheme.CurrentState.IsIntermediate, "schemes to settle");
            long final = Volatile.Read(ref t.Published);
            for (long v = 2; v <= final && v < t.EnteredVersions.Length; v++)
            {
                if (t.EnteredVersions[v] > 1)
                    return $"version {v} was entered {t.EnteredVersions[v]} times";
            }
            output.WriteLine($"scheme reached version {final} in state {t.Scheme.CurrentState}");
        }
        output.WriteLine($"{regions} regions");
        Assert.True(regions > 1000, "the mix did too little to mean anything");
        return null;
    }

    private static bool AnyProtected(int[] depth)
    {
        foreach (int d in depth)
        {
            if (d > 0)
                return true;
        }
        return false;
    }
}
