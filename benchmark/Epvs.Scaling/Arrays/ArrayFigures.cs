using System;
using System.Collections.Generic;
using System.Globalization;
using System.Linq;
using Epvs.Baselines;
using Epvs.Samples.ResizableArray;
using Epvs.Scaling.Harness;

namespace Epvs.Scaling.Arrays;

/// <summary>The resizable-array experiments of the paper's §6.1 (Figs. 11–14), on the samples/ResizableArray
/// variants plus <see cref="BravoResizableArray"/>.</summary>
public static class ArrayFigures
{
    private const int Batch = 64;

    /// <summary>One array variant of a figure.</summary>
    private sealed record Variant(string Name, Func<IResizableArray> Create, bool IsMock = false);

    /// <summary>Fig. 11: read/write 50/50, no pushes, on an array prefilled with 1M elements.</summary>
    public static FigureResult Fig11(RunSettings settings)
    {
        int prefill = settings.Quick ? 1 << 16 : 1_000_000;
        var fig = new FigureResult("fig11", "Resizable array, read/write 50/50 (paper Fig. 11)", "threads",
            settings.Threads.Select(Str), xIsThreads: true);
        foreach (Variant v in ReadWriteVariants(prefill, bravoTable: null))
            RunVariant(fig, settings, v, prefill, pushPercent: 0);
        fig.RunScheduled(settings);
        fig.Note($"Array prefilled with {prefill:N0} elements; each operation reads or writes a random prefilled index; sessions refresh every {Batch} operations (EPVS-pinned refreshes its protection there, the others do nothing).");
        AddArrayChecks(fig);
        return fig;
    }

    /// <summary>Fig. 12: push mixes from a nearly empty array (10% and 50% pushes).</summary>
    public static IEnumerable<FigureResult> Fig12(RunSettings settings)
    {
        foreach (int push in new[] { 10, 50 })
        {
            var fig = new FigureResult($"fig12-push{push}", $"Resizable array, {push}% push (paper Fig. 12)", "threads",
                settings.Threads.Select(Str), xIsThreads: true);
            foreach (Variant v in PushVariants(settings, TimeSpan.Zero))
                RunVariant(fig, settings, v, PushPrefill, push);
            fig.RunScheduled(settings);
            fig.Note($"Starts with {PushPrefill} elements in a full array of {PushPrefill}, so pushes resize from the start; reads hit any index this thread knows to exist, writes hit the prefilled indices; the rest of the mix is half reads, half writes.");
            fig.Note("The latch-free mock is preallocated and cannot grow: each thread gets an equal share of its spare capacity, after which its pushes become reads (it is the unreachable upper bound).");
            yield return fig;
        }
    }

    /// <summary>Fig. 13: as Fig. 12 (10% push) with a 10 ms delay added to every resize.</summary>
    public static FigureResult Fig13(RunSettings settings)
    {
        var delay = TimeSpan.FromMilliseconds(10);
        var fig = new FigureResult("fig13", "Resizable array, 10% push, 10 ms resize delay (paper Fig. 13)", "threads",
            settings.Threads.Select(Str), xIsThreads: true);
        foreach (Variant v in PushVariants(settings, delay))
            RunVariant(fig, settings, v, PushPrefill, pushPercent: 10);
        fig.RunScheduled(settings);
        fig.Note("Every resize sleeps 10 ms: inside the critical section (simple-EPVS, EPVS-pinned) or the write lock (latched, BRAVO); in the two-phase variant the copy and the delay run in the COPYING phase, outside the critical section.");
        return fig;
    }

    /// <summary>Fig. 14: Fig. 11's workload with BRAVO's visible-readers table cut to 128 entries.</summary>
    public static FigureResult Fig14(RunSettings settings)
    {
        int prefill = settings.Quick ? 1 << 16 : 1_000_000;
        var fig = new FigureResult("fig14", "Resizable array, read/write, 128-entry tables (paper Fig. 14)", "threads",
            settings.Threads.Select(Str), xIsThreads: true);
        var small = new VisibleReadersTable(128);
        var variants = new List<Variant>
        {
            new("simple-EPVS", () => new SimpleEpvsResizableArray(prefill)),
            new("EPVS-pinned", () => new EpvsPinnedResizableArray(prefill)),
            new("BRAVO (128-entry table)", () => new BravoResizableArray(prefill, small)),
            new("BRAVO (4096-entry table)", () => new BravoResizableArray(prefill, new VisibleReadersTable(4096))),
            new("latched (RW lock)", () => new LatchedResizableArray(prefill)),
        };
        foreach (Variant v in variants)
            RunVariant(fig, settings, v, prefill, pushPercent: 0);
        fig.RunScheduled(settings);
        fig.Note("EPVS's epoch table starts at 16 entries and grows only when more threads are protected at once (the samples' arrays create their scheme with the default LightEpoch), so it already runs below 128 entries; it resolves a collision by probing to a free slot and keeps the slot across operations, where BRAVO falls back to the underlying lock.");
        return fig;
    }

    private const int PushPrefill = 1024;

    private static IEnumerable<Variant> ReadWriteVariants(int prefill, VisibleReadersTable? bravoTable) =>
    [
        new("latch-free-mock", () => new LatchFreeMockResizableArray(prefill), IsMock: true),
        new("latched (RW lock)", () => new LatchedResizableArray(prefill)),
        new("BRAVO", () => new BravoResizableArray(prefill, bravoTable)),
        new("simple-EPVS", () => new SimpleEpvsResizableArray(prefill)),
        new("2-phase-EPVS", () => new TwoPhaseEpvsResizableArray(prefill)),
        new("EPVS-pinned", () => new EpvsPinnedResizableArray(prefill)),
    ];

    private static IEnumerable<Variant> PushVariants(RunSettings settings, TimeSpan delay)
    {
        int mockCapacity = settings.Quick ? 4 << 20 : 32 << 20;
        return
        [
            new("latch-free-mock", () => new LatchFreeMockResizableArray(mockCapacity), IsMock: true),
            new("latched (RW lock)", () => new LatchedResizableArray(PushPrefill, delay)),
            new("BRAVO", () => new BravoResizableArray(PushPrefill, null, delay)),
            new("simple-EPVS", () => new SimpleEpvsResizableArray(PushPrefill, delay)),
            new("2-phase-EPVS", () => new TwoPhaseEpvsResizableArray(PushPrefill, delay)),
            new("EPVS-pinned", () => new EpvsPinnedResizableArray(PushPrefill, delay)),
        ];
    }

    private static void RunVariant(FigureResult fig, RunSettings settings, Variant variant, int prefill, int pushPercent)
    {
        foreach (int threads in settings.Threads)
        {
            fig.Schedule(variant.Name, Str(threads), threads, () => Setup(variant, threads, prefill, pushPercent));
        }
    }

    private static RunContext Setup(Variant variant, int threads, int prefill, int pushPercent)
    {
        IResizableArray array = variant.Create();
        for (int i = 0; i < prefill; i++)
            array.Push(i);
        long pushBudget = variant.IsMock ? (array.Capacity - array.Count) / threads : long.MaxValue;

        long Worker(int thread, StopFlag stop)
        {
            var rng = new FastRandom((ulong)thread + 1);
            long pushesLeft = pushBudget;
            int known = prefill; // indices whose push has returned, as far as this thread knows
            long ops = 0;
            using IResizableArraySession session = array.OpenSession();
            while (!stop.IsSet)
            {
                for (int i = 0; i < Batch; i++)
                {
                    int dice = rng.Next(100);
                    if (dice < pushPercent && pushesLeft > 0)
                    {
                        int index = session.Push(dice);
                        pushesLeft--;
                        if (index >= known)
                            known = index + 1;
                    }
                    else if ((dice & 1) == 0)
                    {
                        session.Read(rng.Next(known));
                    }
                    else
                    {
                        session.Write(rng.Next(prefill), dice);
                    }
                }
                ops += Batch;
                session.Refresh();
            }
            return ops;
        }

        return new RunContext(Worker, array.Dispose);
    }

    private static void AddArrayChecks(FigureResult fig)
    {
        const string two = "2";
        double mock = fig.Get("latch-free-mock", two);
        double pinned = fig.Get("EPVS-pinned", two);
        double simple = fig.Get("simple-EPVS", two);
        double latched = fig.Get("latched (RW lock)", two);
        fig.Check($"Target EPVS-pinned ≥ 70% of the latch-free mock at 2 threads: {Pct(pinned / mock)} — {(pinned / mock >= 0.70 ? "met" : "missed")}");
        fig.Check($"Target simple-EPVS ≥ 1.5× latched at 2 threads: {Ratio(simple / latched)} — {(simple / latched >= 1.5 ? "met" : "missed")}");
    }

    internal static string Str(int v) => v.ToString(CultureInfo.InvariantCulture);

    internal static string Pct(double r) => double.IsNaN(r) ? "n/a" : (r * 100).ToString("0", CultureInfo.InvariantCulture) + "%";

    internal static string Ratio(double r) => double.IsNaN(r) ? "n/a" : r.ToString("0.00", CultureInfo.InvariantCulture) + "×";
}
