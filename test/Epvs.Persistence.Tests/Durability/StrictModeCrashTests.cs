using System;
using System.Collections.Generic;
using System.Linq;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// Strict mode under simulated power failures of a two-thread workload (hash map, byte map with values moving
/// across size classes, a queue per thread), and files switched between Strict and Buffered across a crash.
/// Per thread (disjoint keys, own queue) the recovered state must be the result of a prefix of that thread's operations
/// covering every operation that completed before a Sync which returned before the crash point.
/// </summary>
public sealed class StrictModeCrashTests
{
    private const int MapType = 41;
    private const int BytesType = 42;
    private const int QueueType = 43; // + thread
    private const int Threads = 2;
    private const long Length = 2 << 20;
    private const long Capacity = 16 << 20;
    private static readonly int[] Sizes = { 0, 9, 100, 700, 3000, 20_000 };
    private readonly ITestOutputHelper _output;

    public StrictModeCrashTests(ITestOutputHelper output) => _output = output;

    private enum Kind { MapSet, MapRemove, BytesSet, BytesRemove, Enqueue, Dequeue }

    private readonly record struct Op(Kind Kind, long Key, long Value, byte[]? Bytes, long ReturnedAt);

    private sealed class State
    {
        public Dictionary<long, long> Map = new();
        public Dictionary<long, byte[]> Bytes = new();
        public List<long> Queue = new();

        public State Clone() => new() { Map = new(Map), Bytes = new(Bytes), Queue = new(Queue) };

        public void Apply(Op op)
        {
            switch (op.Kind)
            {
                case Kind.MapSet: Map[op.Key] = op.Value; break;
                case Kind.MapRemove: Map.Remove(op.Key); break;
                case Kind.BytesSet: Bytes[op.Key] = op.Bytes!; break;
                case Kind.BytesRemove: Bytes.Remove(op.Key); break;
                case Kind.Enqueue: Queue.Add(op.Key); break;
                case Kind.Dequeue: Queue.RemoveAt(0); break;
            }
        }

        public bool SameAs(State o) =>
            Map.Count == o.Map.Count && Map.All(kv => o.Map.TryGetValue(kv.Key, out long v) && v == kv.Value)
            && Bytes.Count == o.Bytes.Count && Bytes.All(kv => o.Bytes.TryGetValue(kv.Key, out byte[]? v) && v.AsSpan().SequenceEqual(kv.Value))
            && Queue.SequenceEqual(o.Queue);
    }

    private sealed class Run
    {
        public List<Op>[] Ops = Enumerable.Range(0, Threads).Select(_ => new List<Op>()).ToArray();
        public List<(long Point, int[] Counts)> Promises = new();
        public List<SimulatedCrash> Crashes = new();
        public long Points;
    }

    private static bool Owns(int thread, long key) => (key % Threads) == thread;

    /// <summary>
    /// Runs the two-thread workload on a new heap once unarmed, to count its crash points, then again with
    /// <paramref name="arm"/> points armed as it goes (the count sets how far ahead of the run each is armed). Should the
    /// armed run still capture fewer than ten images, both runs are repeated, three times at most, and the run with the
    /// most images is returned.
    /// </summary>
    private static Run WorkArmedFromAnEstimate(DurabilityMode mode, int seed, int steps, int arm, State[] initial)
    {
        Run? best = null;
        for (int attempt = 0; attempt < 3 && (best is null || best.Crashes.Count < 10); attempt++)
        {
            long estimate;
            using (var probe = new SimulatedPersistenceDomain(Length, Capacity))
            {
                estimate = Work(probe, true, mode, seed, steps, 0, 0, initial, 0).Points;
            }

            using var domain = new SimulatedPersistenceDomain(Length, Capacity);
            Run run = Work(domain, true, mode, seed, steps, estimate, arm, initial, 0);
            if (best is null || run.Crashes.Count > best.Crashes.Count)
            {
                best = run;
            }
        }

        return best!;
    }

    /// <summary>Runs the two-thread workload on <paramref name="domain"/>; arms <paramref name="arm"/> crash points spread over the run (<paramref name="estimate"/>: about how many points it has).</summary>
    private static Run Work(SimulatedPersistenceDomain domain, bool create, DurabilityMode mode, int seed, int steps, long estimate, int arm, State[] initial, long elementBase)
    {
        var run = new Run();
        long start = domain.CrashPointCount;
        using (HeapFile file = create ? HeapFile.Create(domain) : HeapFile.Open(domain))
        using (BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { Mode = mode, AdvancePeriod = TimeSpan.FromMilliseconds(1) }))
        {
            var map = new PersistentHashMap<long, long>(heap, MapType);
            var bytes = new PersistentByteMap<long>(heap, BytesType);
            var queues = Enumerable.Range(0, Threads).Select(t => new PersistentQueue<long>(heap, QueueType + t)).ToArray();
            // Thread 0 arms the points as it goes, each a little ahead of the count (about two steps' worth of the
            // estimate), spread over its steps: armed up front from the estimate, the points of a run that went faster
            // than the estimating one were never reached (under load CI once captured none of 30).
            var arming = arm > 0 ? new Random(seed + 7) : null;
            long window = Math.Max(20, 2 * estimate / Math.Max(1, steps));

            int[] done = new int[Threads];
            var threads = new Thread[Threads];
            for (int t = 0; t < Threads; t++)
            {
                int thread = t;
                threads[t] = new Thread(() =>
                {
                    var random = new Random(seed * 31 + thread);
                    var queued = new Queue<long>(initial[thread].Queue);
                    long element = elementBase + (thread * 100_000);
                    List<Op> ops = run.Ops[thread];
                    for (int step = 0; step < steps; step++)
                    {
                        if (thread == 0 && arming is not null)
                        {
                            for (long i = (long)step * arm / steps; i < (long)(step + 1) * arm / steps; i++)
                            {
                                try
                                {
                                    domain.ArmCrash(domain.CrashPointCount + 1 + arming.NextInt64(window), arming.Next());
                                }
                                catch (ArgumentOutOfRangeException)
                                {
                                    // The other threads passed it meanwhile.
                                }
                            }
                        }

                        int what = random.Next(100);
                        Op op;
                        if (what < 30)
                        {
                            long key = (random.Next(20) * Threads) + thread;
                            long value = random.NextInt64();
                            map.Set(key, value);
                            op = new Op(Kind.MapSet, key, value, null, 0);
                        }
                        else if (what < 40)
                        {
                            long key = (random.Next(20) * Threads) + thread;
                            if (!map.Remove(key))
                            {
                                continue;
                            }

                            op = new Op(Kind.MapRemove, key, 0, null, 0);
                        }
                        else if (what < 65)
                        {
                            long key = (random.Next(12) * Threads) + thread;
                            byte[] value = new byte[Sizes[random.Next(Sizes.Length)] + random.Next(8)];
                            random.NextBytes(value);
                            bytes.Set(key, value);
                            op = new Op(Kind.BytesSet, key, 0, value, 0);
                        }
                        else if (what < 75)
                        {
                            long key = (random.Next(12) * Threads) + thread;
                            if (!bytes.Remove(key))
                            {
                                continue;
                            }

                            op = new Op(Kind.BytesRemove, key, 0, null, 0);
                        }
                        else if (what < 90)
                        {
                            queues[thread].Enqueue(element);
                            queued.Enqueue(element);
                            op = new Op(Kind.Enqueue, element++, 0, null, 0);
                        }
                        else
                        {
                            if (!queues[thread].TryDequeue(out long got))
                            {
                                continue;
                            }

                            long expected = queued.Dequeue();
                            if (got != expected)
                            {
                                throw new InvalidOperationException($"dequeued {got}, expected {expected}");
                            }

                            op = new Op(Kind.Dequeue, got, 0, null, 0);
                        }

                        ops.Add(op with { ReturnedAt = domain.CrashPointCount });
                        Volatile.Write(ref done[thread], ops.Count);
                        if (thread == 0 && step % 40 == 39)
                        {
                            int[] counts = new int[Threads];
                            for (int i = 0; i < Threads; i++)
                            {
                                counts[i] = Volatile.Read(ref done[i]);
                            }

                            heap.Sync(TimeSpan.FromSeconds(30));
                            lock (run.Promises)
                            {
                                run.Promises.Add((domain.CrashPointCount, counts));
                            }
                        }
                    }
                });
                threads[t].Start();
            }

            foreach (Thread thread in threads)
            {
                thread.Join();
            }
        }

        run.Points = domain.CrashPointCount - start;
        run.Crashes = domain.CapturedCrashes.ToList();
        return run;
    }

    /// <summary>Opens <paramref name="image"/> in <paramref name="mode"/> and reads each thread's state.</summary>
    private static DurabilityFaults s_recoveryFaults;

    private static State[]? Recover(byte[] image, DurabilityMode mode, out string? error)
    {
        error = null;
        using var domain = SimulatedPersistenceDomain.FromImage(image, Capacity);
        using HeapFile file = HeapFile.Open(domain);
        try
        {
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { Mode = mode, AdvancePeriod = Timeout.InfiniteTimeSpan, Faults = s_recoveryFaults });
            var states = Enumerable.Range(0, Threads).Select(_ => new State()).ToArray();
            foreach (var kv in new PersistentHashMap<long, long>(heap, MapType).ToDictionary())
            {
                states[kv.Key % Threads].Map[kv.Key] = kv.Value;
            }

            foreach (var kv in new PersistentByteMap<long>(heap, BytesType).ToList())
            {
                states[kv.Key % Threads].Bytes[kv.Key] = kv.Value;
            }

            for (int t = 0; t < Threads; t++)
            {
                states[t].Queue.AddRange(new PersistentQueue<long>(heap, QueueType + t).ToArray());
            }

            return states;
        }
        catch (Exception e)
        {
            error = e.GetType().Name + ": " + e.Message;
            return null;
        }
    }

    /// <summary>The prefix lengths of <paramref name="ops"/> (from <paramref name="initial"/>) whose result is <paramref name="recovered"/>.</summary>
    private static List<int> Prefixes(State initial, List<Op> ops, State recovered)
    {
        var result = new List<int>();
        State s = initial.Clone();
        for (int n = 0; ; n++)
        {
            if (s.SameAs(recovered))
            {
                result.Add(n);
            }

            if (n == ops.Count)
            {
                return result;
            }

            s.Apply(ops[n]);
        }
    }

    /// <summary>Checks every captured image of <paramref name="run"/>; returns violations and counts returned-but-lost.</summary>
    private static List<string> Check(Run run, State[] initial, DurabilityMode reopenMode, string label, out int lostReturned, out List<(SimulatedCrash Crash, State[] States)> recoveredStates)
    {
        var violations = new List<string>();
        lostReturned = 0;
        recoveredStates = new();
        foreach (SimulatedCrash crash in run.Crashes)
        {
            State[]? states = Recover(crash.Image, reopenMode, out string? error);
            if (states is null)
            {
                violations.Add($"{label} point {crash.Point} seed {crash.Seed}: recovery failed: {error}");
                continue;
            }

            recoveredStates.Add((crash, states));
            int[] promised = run.Promises.Where(p => p.Point <= crash.Point).Select(p => p.Counts).LastOrDefault() ?? new int[Threads];
            for (int t = 0; t < Threads; t++)
            {
                List<int> prefixes = Prefixes(initial[t], run.Ops[t], states[t]);
                int returned = run.Ops[t].Count(op => op.ReturnedAt <= crash.Point);
                if (prefixes.Count == 0)
                {
                    violations.Add($"{label} point {crash.Point} seed {crash.Seed} thread {t}: no prefix of its {run.Ops[t].Count} ops gives the recovered state (map {states[t].Map.Count}, bytes {states[t].Bytes.Count}, queue {states[t].Queue.Count})");
                }
                else if (prefixes.Max() < promised[t])
                {
                    violations.Add($"{label} point {crash.Point} seed {crash.Seed} thread {t}: recovered prefix {prefixes.Max()} below the {promised[t]} a Sync promised");
                }
                else if (prefixes.Max() < returned)
                {
                    lostReturned++;
                }
            }
        }

        return violations;
    }

    [Theory]
    [InlineData(DurabilityMode.Strict, 5101)]
    [InlineData(DurabilityMode.Strict, 5102)]
    [InlineData(DurabilityMode.Buffered, 5101)]
    public void Crash_TwoThreadWorkload_RecoversAPrefixPerThread(DurabilityMode mode, int seed)
    {
        State[] empty = Enumerable.Range(0, Threads).Select(_ => new State()).ToArray();
        Run run = WorkArmedFromAnEstimate(mode, seed, 160, 40, empty);
        List<string> violations = Check(run, empty, mode, mode.ToString(), out int lost, out _);
        _output.WriteLine($"{mode} seed {seed}: {run.Crashes.Count} images over {run.Points} points; threads x images where an op that returned before the crash was lost: {lost}");
        Assert.Empty(violations);

        // The crash points are armed from an estimate of a first run's length; two threads make each run's length vary.
        Assert.SkipWhen(run.Crashes.Count < 10, $"INCONCLUSIVE: only {run.Crashes.Count} images");
    }

    [Theory]
    [InlineData(DurabilityMode.Strict, DurabilityMode.Buffered, 5201)]
    [InlineData(DurabilityMode.Buffered, DurabilityMode.Strict, 5202)]
    public void Crash_ThenReopenInTheOtherMode_AndCrashAgain_RecoversPrefixes(DurabilityMode first, DurabilityMode second, int seed)
    {
        State[] empty = Enumerable.Range(0, Threads).Select(_ => new State()).ToArray();
        Run run = WorkArmedFromAnEstimate(first, seed, 120, 16, empty);

        // Reopened in the other mode.
        List<string> violations = Check(run, empty, second, $"{first}->{second}", out _, out var recovered);
        int phase2Images = 0, phase2Runs = 0;
        foreach ((SimulatedCrash crash, State[] states) in recovered)
        {
            // Six first-phase images, or more while the second phase has left fewer than ten images (its runs vary in length too).
            if ((phase2Runs >= 6 && phase2Images >= 10) || phase2Runs == 12)
            {
                break;
            }

            phase2Runs++;
            long estimate2;
            using (var probe = SimulatedPersistenceDomain.FromImage(crash.Image, Capacity))
            {
                estimate2 = Work(probe, false, second, seed + 1, 80, 0, 0, states, 1_000_000).Points;
            }

            using var again = SimulatedPersistenceDomain.FromImage(crash.Image, Capacity);
            Run run2 = Work(again, false, second, seed + 1, 80, estimate2, 10, states, 1_000_000);
            phase2Images += run2.Crashes.Count;

            // Crashed in the second mode, reopened in the first.
            violations.AddRange(Check(run2, states, first, $"{first}@{crash.Point}->{second}->{first}", out _, out _));
        }

        _output.WriteLine($"{first}->{second}: {run.Crashes.Count} first-phase images, {phase2Images} second-phase images");
        Assert.Empty(violations);

        // The crash points are armed from an estimate of a first run's length; two threads make each run's length vary.
        Assert.SkipWhen(phase2Images < 10, $"INCONCLUSIVE: only {run.Crashes.Count} first-phase and {phase2Images} second-phase images");
    }

    [Theory]
    [InlineData(DurabilityMode.Buffered, 5101)]
    [InlineData(DurabilityMode.Strict, 5101)]
    public void Control_RecoveryKeepingTagsBeyondTheFrontier_IsCaught(DurabilityMode mode, int seed)
    {
        // Whether the control can be caught depends on where the threads' crash points fell (payloads beyond the frontier
        // must have reached the image), and two threads make that vary from run to run: up to four seeds from the given
        // one, stopping at the first catch. One seed alone missed it now and then under CI's load.
        const int Seeds = 4;
        List<string> violations = new();
        int images = 0;
        int runs = 0;
        for (int next = seed; next < seed + Seeds && violations.Count == 0; next++)
        {
            runs++;
            State[] empty = Enumerable.Range(0, Threads).Select(_ => new State()).ToArray();
            using var domain = new SimulatedPersistenceDomain(Length, Capacity);
            Run run = Work(domain, true, mode, next, 160, 1500, 40, empty, 0);
            images += run.Crashes.Count;
            s_recoveryFaults = DurabilityFaults.KeepTagsBeyondFrontier;
            try
            {
                violations = Check(run, empty, mode, "control", out _, out _);
            }
            finally
            {
                s_recoveryFaults = DurabilityFaults.None;
            }
        }

        _output.WriteLine($"control {mode}: {violations.Count} violations in {runs} runs ({images} images), e.g. {violations.FirstOrDefault()}");

        // A run that did not catch it in any seed is inconclusive, not a pass.
        Assert.SkipWhen(violations.Count == 0, $"INCONCLUSIVE: the control (recovery keeping tags beyond the frontier) was not caught in {runs} runs ({images} images)");
    }
}
