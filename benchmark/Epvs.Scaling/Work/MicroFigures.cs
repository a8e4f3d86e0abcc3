using System;
using System.Collections.Generic;
using System.Globalization;
using System.Linq;
using Epvs.Baselines;
using Epvs.Scaling.Arrays;
using Epvs.Scaling.Harness;

namespace Epvs.Scaling.Work;

/// <summary>The protected-work microbenchmarks of the paper's §6.2 (Figs. 17–21).</summary>
public static class MicroFigures
{
    /// <summary>A mechanism under test: a name and a factory.</summary>
    private sealed record Mechanism(string Name, Func<WorkSpec, ProtectedWorkload> Create);

    private static readonly Mechanism NoSync = new("no sync", s => new NoSyncWorkload(s));
    private static readonly Mechanism Latch = new("lock (mutual exclusion)", s => new LockWorkload(s));
    private static readonly Mechanism RwLock = new("RW lock (ReaderWriterLockSlim)", s => new ReaderWriterLockWorkload(s));
    private static readonly Mechanism Bravo = new("BRAVO", s => new BravoWorkload(s, BravoHashing.ThreadAndLock));
    private static readonly Mechanism BravoThreadOnly = new("BRAVO (thread-only hash)", s => new BravoWorkload(s, BravoHashing.ThreadOnly));
    private static readonly Mechanism Epvs = new("EPVS", s => new EpvsWorkload(s, EpvsMode.EnterLeave, shareEpoch: true));
    private static readonly Mechanism EpvsPinned = new("EPVS-pinned (Refresh)", s => new EpvsWorkload(s, EpvsMode.Pinned, shareEpoch: true));
    private static readonly Mechanism Faster = new("FASTER.core EPVS", s => new FasterEpvsWorkload(s));

    /// <summary>Fig. 17: version-change probability sweep at 2 threads.</summary>
    public static FigureResult Fig17(RunSettings settings)
    {
        double[] ps = [0, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1];
        const int threads = 2;
        var fig = new FigureResult("fig17", "Version-change probability, 2 threads (paper Fig. 17)", "p (version change per operation)",
            ps.Select(P), xIsThreads: false);
        foreach (Mechanism m in new[] { NoSync, Latch, RwLock, Bravo, Epvs, Faster })
        {
            foreach (double p in ps)
                Run(fig, settings, m, new WorkSpec(P: p), threads, P(p));
        }
        fig.RunScheduled(settings);
        fig.Note("Each operation hashes 64 thread-local bytes inside protection; with probability p it triggers a version change: EPVS requests TryAdvanceVersionWithCriticalSection(cs, v+1) from inside its region; the locks take the exclusive side. p = 1 means every operation.");
        double none = fig.Get(Epvs.Name, P(0)), rare = fig.Get(Epvs.Name, P(1e-4));
        fig.Check($"Target: EPVS at p = 1e-4 keeps ≥ 90% of its p = 0 throughput (2 threads): {ArrayFigures.Pct(rare / none)} — {(rare / none >= 0.9 ? "met" : "missed")}");
        return fig;
    }

    /// <summary>Fig. 18: epoch / visible-readers table size, p = 1e-4.</summary>
    public static FigureResult Fig18(RunSettings settings)
    {
        int[] sizes = [1, 4, 16, 128, 1024, 4096];
        var fig = new FigureResult("fig18", "Table size, p = 1e-4 (paper Fig. 18)", "initial table size (entries)",
            sizes.Select(ArrayFigures.Str), xIsThreads: false);
        int[] threadCounts = settings.Threads.Where(t => t == 2 || t == settings.Threads.Max()).Distinct().ToArray();
        foreach (Mechanism m in new[] { Epvs, EpvsPinned, Bravo })
        {
            foreach (int threads in threadCounts)
            {
                foreach (int size in sizes)
                    Run(fig, settings, m, new WorkSpec(P: 1e-4, TableSize: size), threads, ArrayFigures.Str(size), $"{m.Name}, {RunSettings.ThreadLabel(threads)} threads");
            }
        }
        fig.RunScheduled(settings);
        fig.Note("EPVS: `new LightEpoch(size)`; the table grows by appending segments when more threads are protected at once than it has entries, so a small table costs a one-time growth, not a fallback. BRAVO: a visible-readers table of that size; a reader whose slot is taken uses the underlying lock. FASTER.core's table is fixed at 128 and is not shown.");
        if (threadCounts.Any(t => t > RunSettings.Cores))
            fig.Note("Series marked * are oversubscribed (more threads than cores).");
        return fig;
    }

    /// <summary>Fig. 19: a version change's fixed work split into 1, 2, 4 or 8 phases, p = 1e-4.</summary>
    public static FigureResult Fig19(RunSettings settings)
    {
        const int criticalRounds = 16384;
        var fig = new FigureResult("fig19", "Phases per version change, p = 1e-4 (paper Fig. 19)", "threads",
            settings.Threads.Select(ArrayFigures.Str), xIsThreads: true);
        foreach (Mechanism m in new[] { Epvs, Faster })
        {
            foreach (int phases in new[] { 1, 2, 4, 8 })
            {
                foreach (int threads in settings.Threads)
                    Run(fig, settings, m, new WorkSpec(P: 1e-4, CriticalRounds: criticalRounds, Phases: phases), threads, ArrayFigures.Str(threads), $"{m.Name}, {phases} phase{(phases > 1 ? "s" : "")}");
            }
        }
        fig.RunScheduled(settings);
        fig.Note($"Each version change does {criticalRounds} hash rounds in total, split evenly over the critical sections of 1 (TryAdvanceVersionWithCriticalSection) or k state-machine transitions (REST → 1 → … → k−1 → REST, v+1).");
        return fig;
    }

    /// <summary>Fig. 20: nesting depth 1 vs 4, no version changes.</summary>
    public static FigureResult Fig20(RunSettings settings)
    {
        var fig = new FigureResult("fig20", "Nesting: 1 vs 4 acquisitions, no version changes (paper Fig. 20)", "threads",
            settings.Threads.Select(ArrayFigures.Str), xIsThreads: true);
        foreach (int threads in settings.Threads)
            Run(fig, settings, NoSync, new WorkSpec(), threads, ArrayFigures.Str(threads));
        foreach (int depth in new[] { 1, 4 })
        {
            foreach (Mechanism m in new[] { Epvs, Faster, RwLock, Bravo, BravoThreadOnly, Latch })
            {
                foreach (int threads in settings.Threads)
                    Run(fig, settings, m, new WorkSpec(Depth: depth, Instances: depth), threads, ArrayFigures.Str(threads), $"{m.Name}, depth {depth}");
            }
        }
        fig.RunScheduled(settings);
        fig.Note("Depth 4: each operation acquires 4 instances in order and releases them in reverse. EPVS: 4 schemes on one shared LightEpoch (only the outermost Enter announces). FASTER.core cannot nest on one epoch, so its 4 schemes have 4 epochs. BRAVO: 4 locks on one 4096-entry table; with the thread-only hash (the EPVS paper's port) a thread's nested reads collide with its own slot.");

        string one = "1", two = "2";
        string e1 = $"{Epvs.Name}, depth 1", rw1 = $"{RwLock.Name}, depth 1", f1 = $"{Faster.Name}, depth 1";
        double s = fig.Get(e1, two) / fig.Get(e1, one);
        double vsRw = fig.Get(e1, two) / fig.Get(rw1, two);
        fig.Check($"Target: protected work, EPVS at 2 threads ≥ 1.8× one thread: {ArrayFigures.Ratio(s)} — {(s >= 1.8 ? "met" : "missed")}");
        fig.Check($"Target: protected work, EPVS ≥ 1.5× ReaderWriterLockSlim at 2 threads: {ArrayFigures.Ratio(vsRw)} — {(vsRw >= 1.5 ? "met" : "missed")}");
        fig.Check($"EPVS / FASTER.core EPVS at 2 threads, depth 1: {ArrayFigures.Ratio(fig.Get(e1, two) / fig.Get(f1, two))}; no-sync scaling 2 vs 1 thread: {ArrayFigures.Ratio(fig.Get(NoSync.Name, two) / fig.Get(NoSync.Name, one))}");
        return fig;
    }

    /// <summary>Fig. 21: 8 instances, shared by all threads or one per thread, p = 1e-4.</summary>
    public static FigureResult Fig21(RunSettings settings)
    {
        var fig = new FigureResult("fig21", "8 instances: shared vs one per thread, p = 1e-4 (paper Fig. 21)", "threads",
            settings.Threads.Select(ArrayFigures.Str), xIsThreads: true);
        var epvsOwnEpochs = new Mechanism("EPVS", s => new EpvsWorkload(s, EpvsMode.EnterLeave, shareEpoch: false));
        foreach (int threads in settings.Threads)
        {
            Run(fig, settings, epvsOwnEpochs, new WorkSpec(P: 1e-4, Instances: 8, Shared: true), threads, ArrayFigures.Str(threads), "EPVS, all threads on 1 instance");
            Run(fig, settings, epvsOwnEpochs, new WorkSpec(P: 1e-4, Instances: 8, Shared: false), threads, ArrayFigures.Str(threads), "EPVS, 8 instances (8 epochs)");
            Run(fig, settings, Epvs, new WorkSpec(P: 1e-4, Instances: 8, Shared: false), threads, ArrayFigures.Str(threads), "EPVS, 8 schemes on 1 shared epoch");
            foreach (Mechanism m in new[] { Faster, Bravo, RwLock })
            {
                Run(fig, settings, m, new WorkSpec(P: 1e-4, Instances: 8, Shared: true), threads, ArrayFigures.Str(threads), $"{m.Name}, all threads on 1 instance");
                Run(fig, settings, m, new WorkSpec(P: 1e-4, Instances: 8, Shared: false), threads, ArrayFigures.Str(threads), $"{m.Name}, 8 instances");
            }
        }
        fig.RunScheduled(settings);
        fig.Note("Thread t uses instance t mod 8 when not shared (so up to 8 threads each have their own), every thread uses instance 0 when shared. A version change (p = 1e-4 per operation) applies to the thread's instance.");
        return fig;
    }

    private static void Run(FigureResult fig, RunSettings settings, Mechanism m, WorkSpec spec, int threads, string x, string? series = null)
    {
        series ??= m.Name;
        fig.Schedule(series, x, threads, () =>
        {
            ProtectedWorkload w = m.Create(spec);
            return new RunContext(w.Run, w.Dispose);
        });
    }

    private static string P(double p) => p == 0 ? "0" : p == 1 ? "1" : p.ToString("0e-0", CultureInfo.InvariantCulture);
}
