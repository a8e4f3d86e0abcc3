using System;
using System.Threading;

namespace Epvs.Tests;

/// <summary>
/// Runs protected regions on reader threads against a stream of transitions whose critical sections publish the new
/// version (slowly, to widen the window), and counts regions that saw a critical section running or a published
/// version other than the one their Enter/Refresh returned.
/// </summary>
internal static class ExclusionChecker
{
    public sealed record Result(long Violations, string? FirstViolation, int Transitions, long Regions);

    public static Result Run(ISchemeUnderTest scheme, int readers, int transitions, int seed, bool useRefresh)
    {
        long published = scheme.CurrentVersion;
        int criticalSectionRunning = 0;
        int stop = 0;
        long violations = 0;
        long regions = 0;
        string? first = null;

        void Check(long observed, string where)
        {
            int running = Volatile.Read(ref criticalSectionRunning);
            long seen = Volatile.Read(ref published);
            if (running != 0 || seen != observed)
            {
                Interlocked.Increment(ref violations);
                Interlocked.CompareExchange(ref first,
                    $"{scheme.Name}: region that observed version {observed} saw published={seen}, critical section running={running} ({where})", null);
            }
        }

        var workers = new GuardedThread[readers];
        for (int r = 0; r < readers; r++)
        {
            var rng = new Random(seed + r);
            workers[r] = GuardedThread.Start(() =>
            {
                while (Volatile.Read(ref stop) == 0)
                {
                    long v = scheme.Enter();
                    Check(v, "after Enter");
                    Thread.SpinWait(rng.Next(1, 50));
                    Check(v, "inside");
                    if (useRefresh && rng.Next(4) == 0)
                    {
                        v = scheme.Refresh();
                        Check(v, "after Refresh");
                        Thread.SpinWait(rng.Next(1, 50));
                        Check(v, "inside after Refresh");
                    }
                    scheme.Leave();
                    Interlocked.Increment(ref regions);
                }
            }, $"reader {r}");
        }

        int done = 0;
        try
        {
            for (int i = 0; i < transitions; i++)
            {
                long target;
                var spinner = new SpinWait();
                while (true)
                {
                    target = scheme.CurrentVersion + 1;
                    if (scheme.TryAdvance((from, to) =>
                    {
                        Volatile.Write(ref criticalSectionRunning, 1);
                        for (int k = 0; k < 8; k++)
                            Thread.SpinWait(20);
                        Volatile.Write(ref published, to);
                        Volatile.Write(ref criticalSectionRunning, 0);
                    }, target))
                        break;
                    spinner.SpinOnce();
                }
                Bounded.WaitUntil(() => scheme.CurrentVersion >= target && Volatile.Read(ref published) >= target,
                    $"{scheme.Name}: transition to {target}");
                done++;
            }
        }
        finally
        {
            Volatile.Write(ref stop, 1);
            foreach (GuardedThread w in workers)
                w.Join();
        }
        return new Result(Volatile.Read(ref violations), first, done, Volatile.Read(ref regions));
    }
}
