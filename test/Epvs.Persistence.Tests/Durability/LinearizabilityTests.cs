using System;
using System.Buffers.Binary;
using System.Collections.Generic;
using System.Diagnostics;
using System.Linq;
using System.Text;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// History-based linearizability checks of the persistent structures under concurrency (no crashes): 2–4 threads on a
/// few hot keys, the background advancer at a 1–5 ms period, the index growing from empty. Each operation's invocation
/// and response are timestamped (Stopwatch ticks) and its result recorded; each key's history is checked against a
/// sequential register model (P-compositionality: a map is linearizable iff each key's sub-history is), and the queue's
/// against a FIFO, with a Wing–Gong search whose configurations are per-thread prefixes plus the model state
/// (memoized). A control shows the checker catches a broken variant (a fault flag, or a mutated history).
/// </summary>
public sealed class LinearizabilityTests
{
    private const long Absent = long.MinValue;

    /// <summary>
    /// How much later than another operation's response an invocation must be stamped for the two to count as ordered in
    /// real time: 200 ns. A timestamp is not ordered with stores (a write's last store may still sit in its core's store
    /// buffer when its response is stamped) and two cores' clocks may differ by tens of nanoseconds, so a read stamped
    /// 19 ns after a write's response could still see the older value (a CI run's false "not linearizable").
    /// </summary>
    private static readonly long Slack = Math.Max(1, Stopwatch.Frequency / 5_000_000);
    private static readonly TimeSpan RunLength = TimeSpan.FromMilliseconds(150);
    private readonly ITestOutputHelper _output;

    public LinearizabilityTests(ITestOutputHelper output) => _output = output;

    // ---------------------------------------------------------------- the model and the checker

    internal enum Kind : byte
    {
        Set,        // Flag = added (exact)
        SetAny,     // a SetMany item among several: its own "added" is not observable
        Remove,     // Flag = was present
        Read,       // Flag = found, Value = value
        Enqueue,
        Dequeue,    // Flag = dequeued, Value
        Count,      // Value = count
        Snapshot,   // Items = content
    }

    internal sealed class Op
    {
        public int Thread;
        public long Inv;
        public long Res;
        public Kind Kind;
        public long Arg;
        public bool Flag;
        public long Value;
        public long[]? Items;

        public override string ToString() => $"t{Thread} [{Inv}..{Res}] {Kind}({(Arg == Absent ? "" : Arg.ToString("X"))}) -> {Flag}/{(Value == Absent ? "absent" : Value.ToString("X"))}{(Items == null ? "" : "[" + string.Join(",", Items.Select(i => i.ToString("X"))) + "]")}";
    }

    /// <summary>Steps the per-key register model; returns false if <paramref name="op"/>'s result is impossible in <paramref name="state"/>.</summary>
    private static bool StepRegister(long state, Op op, out long next)
    {
        next = state;
        switch (op.Kind)
        {
            case Kind.Set:
                next = op.Arg;
                return op.Flag == (state == Absent);
            case Kind.SetAny:
                next = op.Arg;
                return true;
            case Kind.Remove:
                next = Absent;
                return op.Flag == (state != Absent);
            case Kind.Read:
                return op.Flag ? state == op.Value : state == Absent;
            default:
                throw new InvalidOperationException(op.Kind.ToString());
        }
    }

    /// <summary>What <see cref="Check"/> returns when the search would take more than <see cref="MaxExplored"/>
    /// configurations or <see cref="MaxMemoChars"/> of memoized keys: inconclusive, neither linearizable nor not.
    /// Under a loaded machine the operations' intervals stretch and overlap more, and the memoized configurations grew until the kernel killed the test host (24 GB: an
    /// out-of-memory kill in a CI run at a 20-million cap).</summary>
    internal const string TooLarge = "search too large";

    /// <summary>The most configurations one search explores.</summary>
    private const long MaxExplored = 1_000_000;

    /// <summary>The most characters of memoized configuration keys one search keeps (a queue's key holds its whole
    /// content): about 200 MB.</summary>
    private const long MaxMemoChars = 100_000_000;

    /// <summary>
    /// Wing–Gong search with memoization. <paramref name="threads"/> holds each thread's operations in program order
    /// (so a linearization always takes a prefix of each); an operation may go next if it was invoked before every
    /// remaining operation's earliest response. Returns null if linearizable, else a description.
    /// </summary>
    internal static string? Check<TState>(List<Op>[] threads, TState initial, Func<TState, Op, (bool Ok, TState Next)> step, Func<TState, string> key)
    {
        int t = threads.Length;
        int total = threads.Sum(l => l.Count);
        var memo = new HashSet<string>();
        var stack = new Stack<(int[] Idx, TState State, int Next)>();
        stack.Push((new int[t], initial, 0));
        int deepest = 0;
        int[] deepestIdx = new int[t];
        long explored = 0, memoChars = 0;
        while (stack.Count > 0)
        {
            (int[] idx, TState state, int nextThread) = stack.Pop();
            int done = idx.Sum();
            if (done == total)
            {
                return null;
            }

            if (done > deepest)
            {
                deepest = done;
                deepestIdx = (int[])idx.Clone();
            }

            long minRes = long.MaxValue;
            for (int i = 0; i < t; i++)
            {
                if (idx[i] < threads[i].Count)
                {
                    minRes = Math.Min(minRes, threads[i][idx[i]].Res);
                }
            }

            for (int i = nextThread; i < t; i++)
            {
                if (idx[i] >= threads[i].Count)
                {
                    continue;
                }

                Op op = threads[i][idx[i]];
                if (op.Inv > minRes + Slack)
                {
                    continue;
                }

                (bool ok, TState next) = step(state, op);
                if (!ok)
                {
                    continue;
                }

                int[] nextIdx = (int[])idx.Clone();
                nextIdx[i]++;
                string k = string.Join(",", nextIdx) + "|" + key(next);
                if (!memo.Add(k))
                {
                    continue;
                }

                memoChars += k.Length;
                if (++explored > MaxExplored || memoChars > MaxMemoChars)
                {
                    return TooLarge;
                }

                // Come back to this configuration for the next candidate after the child fails.
                stack.Push((idx, state, i + 1));
                stack.Push((nextIdx, next, 0));
                goto Next;
            }

        Next:;
        }

        var sb = new StringBuilder($"not linearizable: at most {deepest} of {total} operations linearize; the pending operations then:");
        for (int i = 0; i < t; i++)
        {
            for (int j = deepestIdx[i]; j < Math.Min(threads[i].Count, deepestIdx[i] + 3); j++)
            {
                sb.Append("\n  ").Append(threads[i][j]);
            }
        }

        for (int i = 0; i < t; i++)
        {
            for (int j = Math.Max(0, deepestIdx[i] - 3); j < deepestIdx[i]; j++)
            {
                sb.Append("\n  (done) ").Append(threads[i][j]);
            }
        }

        return sb.ToString();
    }

    internal static string? CheckRegister(List<Op>[] threads) =>
        Check(threads, Absent, (s, op) => StepRegister(s, op, out long n) ? (true, n) : (false, s), s => s.ToString());

    internal static string? CheckQueue(List<Op>[] threads) =>
        Check(threads, Array.Empty<long>(), StepQueue, s => string.Join(",", s));

    private static (bool, long[]) StepQueue(long[] q, Op op)
    {
        switch (op.Kind)
        {
            case Kind.Enqueue:
                return (true, [.. q, op.Arg]);
            case Kind.Dequeue:
                if (!op.Flag)
                {
                    return (q.Length == 0, q);
                }

                return q.Length > 0 && q[0] == op.Value ? (true, q[1..]) : (false, q);
            case Kind.Count:
                return (q.Length == op.Value, q);
            case Kind.Snapshot:
                return (q.AsSpan().SequenceEqual(op.Items), q);
            default:
                throw new InvalidOperationException(op.Kind.ToString());
        }
    }

    /// <summary>Splits per-thread (key, op) records into one history per key.</summary>
    private static Dictionary<long, List<Op>[]> PerKey(List<(long Key, Op Op)>[] records)
    {
        var result = new Dictionary<long, List<Op>[]>();
        for (int t = 0; t < records.Length; t++)
        {
            foreach ((long key, Op op) in records[t])
            {
                if (!result.TryGetValue(key, out List<Op>[]? lists))
                {
                    lists = new List<Op>[records.Length];
                    for (int i = 0; i < lists.Length; i++)
                    {
                        lists[i] = new List<Op>();
                    }

                    result[key] = lists;
                }

                lists[t].Add(op);
            }
        }

        return result;
    }

    /// <param name="records">Each thread's (key, operation) records.</param>
    /// <param name="operations">How many operations the records hold.</param>
    /// <param name="searched">How many keys' histories the search decided.</param>
    /// <param name="undecided">How many were too large to search (inconclusive).</param>
    private static string? CheckMap(List<(long Key, Op Op)>[] records, out int operations, out int searched, out int undecided)
    {
        operations = records.Sum(r => r.Count);
        searched = 0;
        undecided = 0;
        foreach ((long key, List<Op>[] history) in PerKey(records))
        {
            string? failure = CheckRegister(history);
            if (failure == TooLarge)
            {
                undecided++;
                continue;
            }

            searched++;
            if (failure != null)
            {
                return $"key {key}: {failure}";
            }
        }

        return undecided > 0 ? TooLarge : null;
    }

    // ---------------------------------------------------------------- the checker's own controls (hand-made histories)

    [Fact]
    public void Checker_AcceptsAndRejectsHandMadeHistories()
    {
        // In units well above the checker's slack, so that "after" means after.
        static Op O(int t, long inv, long res, Kind k, long arg = Absent, bool flag = false, long value = Absent) =>
            new() { Thread = t, Inv = inv * 10 * Slack, Res = res * 10 * Slack, Kind = k, Arg = arg, Flag = flag, Value = value };

        // Overlapping set and read: the read may see either value.
        Assert.Null(CheckRegister([[O(0, 0, 10, Kind.Set, 1, true), O(0, 11, 20, Kind.Set, 2, false)], [O(1, 12, 30, Kind.Read, flag: true, value: 1)]]));
        // A read that starts after set(2) ended cannot see 1 (stale read).
        Assert.NotNull(CheckRegister([[O(0, 0, 10, Kind.Set, 1, true), O(0, 11, 20, Kind.Set, 2, false)], [O(1, 21, 30, Kind.Read, flag: true, value: 1)]]));
        // Two inserts that both say "added" with no remove: impossible.
        Assert.NotNull(CheckRegister([[O(0, 0, 10, Kind.Set, 1, true)], [O(1, 0, 10, Kind.Set, 2, true)]]));
        // Read-your-removal: a read after a completed remove sees the key absent.
        Assert.NotNull(CheckRegister([[O(0, 0, 10, Kind.Set, 1, true), O(0, 11, 20, Kind.Remove, flag: true)], [O(1, 25, 30, Kind.Read, flag: true, value: 1)]]));
        // FIFO: dequeues in enqueue order when enqueues do not overlap.
        Assert.Null(CheckQueue([[O(0, 0, 1, Kind.Enqueue, 1), O(0, 2, 3, Kind.Enqueue, 2)], [O(1, 4, 5, Kind.Dequeue, flag: true, value: 1), O(1, 6, 7, Kind.Dequeue, flag: true, value: 2)]]));
        Assert.NotNull(CheckQueue([[O(0, 0, 1, Kind.Enqueue, 1), O(0, 2, 3, Kind.Enqueue, 2)], [O(1, 4, 5, Kind.Dequeue, flag: true, value: 2)]]));
        // Overlapping enqueues may dequeue in either order.
        Assert.Null(CheckQueue([[O(0, 0, 10, Kind.Enqueue, 1)], [O(1, 0, 10, Kind.Enqueue, 2)], [O(2, 11, 12, Kind.Dequeue, flag: true, value: 2), O(2, 13, 14, Kind.Dequeue, flag: true, value: 1)]]));
    }

    // ---------------------------------------------------------------- PersistentHashMap<long, long>

    private sealed class MapRun
    {
        public required List<(long Key, Op Op)>[] Records;
        public long Growths;
        public long Versions;
        public string? QuiescenceFailure;
    }

    private static long Stamp() => Stopwatch.GetTimestamp();

    /// <summary>
    /// One bounded run: <paramref name="threads"/> workers on <paramref name="keys"/> hot keys (Set, SetMany, Remove,
    /// TryGetValue, ToDictionary; values unique per write), plus cold keys inserted once each so the index grows; then
    /// a final read of every key by an extra "thread", Count and reopen checks.
    /// </summary>
    private static MapRun RunHashMap(int seed, int threads, int keys, int periodMs, DurabilityFaults faults, bool reopen)
    {
        using var dir = new TempDirectory();
        string path = dir.File("map.heap");
        var options = new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromMilliseconds(periodMs), Faults = faults };
        var records = new List<(long, Op)>[threads + 1];
        var run = new MapRun { Records = records };
        Dictionary<long, long> final;
        long coldInserted = 0;
        long startVersion;
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, new HeapFileOptions { Size = 32L << 20, Domain = PersistenceDomainKind.MappedFile }, options))
        {
            var map = new PersistentHashMap<long, long>(heap, typeId: 1);
            startVersion = heap.CurrentVersion;
            Workers.Run(threads, t =>
            {
                var random = new Random(seed * 31 + t);
                var mine = new List<(long, Op)>();
                records[t] = mine;
                long counter = 0;
                long cold = 1_000_000L * (t + 1);
                var coldLive = new Queue<long>();
                var watch = Stopwatch.StartNew();
                while (watch.Elapsed < RunLength && mine.Count < 20_000)
                {
                    long key = random.Next(keys);
                    long value = ((long)(t + 1) << 40) | ++counter;
                    int dice = random.Next(125);
                    if (dice >= 100)
                    {
                        // Cold keys in bursts: several index growths per run while the others work.
                        // Removed again later, so tombstones keep the table small and the growths frequent.
                        for (int c = 0; c < 16; c++)
                        {
                            coldLive.Enqueue(cold);
                            map.Set(cold++, 1);
                            Interlocked.Increment(ref coldInserted);
                            if (coldLive.Count > 64 && map.Remove(coldLive.Dequeue()))
                            {
                                Interlocked.Decrement(ref coldInserted);
                            }
                        }

                        continue;
                    }

                    var op = new Op { Thread = t, Arg = Absent, Value = Absent };
                    if (dice < 30)
                    {
                        op.Kind = Kind.Set;
                        op.Arg = value;
                        op.Inv = Stamp();
                        op.Flag = map.Set(key, value);
                        op.Res = Stamp();
                        mine.Add((key, op));
                    }
                    else if (dice < 40)
                    {
                        // SetMany: distinct hot keys, maybe a cold key too (which may make the index grow inside it).
                        int n = 1 + random.Next(3);
                        long[] ks = Enumerable.Range(0, keys).Select(k => (long)k).OrderBy(_ => random.Next()).Take(Math.Min(n, keys)).ToArray();
                        var items = new List<KeyValuePair<long, long>>();
                        var ops = new List<(long, Op)>();
                        foreach (long k in ks)
                        {
                            long v = ((long)(t + 1) << 40) | ++counter;
                            items.Add(new(k, v));
                            ops.Add((k, new Op { Thread = t, Kind = ks.Length == 1 ? Kind.Set : Kind.SetAny, Arg = v, Value = Absent }));
                        }

                        bool withCold = random.Next(2) == 0;
                        if (withCold)
                        {
                            items.Insert(random.Next(items.Count + 1), new(cold++, 1));
                        }

                        long inv = Stamp();
                        int added = map.SetMany(items.ToArray());
                        long res = Stamp();
                        if (withCold)
                        {
                            added--;
                            Interlocked.Increment(ref coldInserted);
                        }

                        foreach ((long k, Op o) in ops)
                        {
                            o.Inv = inv;
                            o.Res = res;
                            o.Flag = added == 1;
                            mine.Add((k, o));
                        }
                    }
                    else if (dice < 55)
                    {
                        op.Kind = Kind.Remove;
                        op.Inv = Stamp();
                        op.Flag = map.Remove(key);
                        op.Res = Stamp();
                        mine.Add((key, op));
                    }
                    else if (dice < 90)
                    {
                        op.Kind = Kind.Read;
                        op.Inv = Stamp();
                        op.Flag = map.TryGetValue(key, out long read);
                        op.Res = Stamp();
                        op.Value = op.Flag ? read : Absent;
                        mine.Add((key, op));
                    }
                    else if (dice < 93)
                    {
                        long inv = Stamp();
                        Dictionary<long, long> snapshot = map.ToDictionary();
                        long res = Stamp();
                        for (long k = 0; k < keys; k++)
                        {
                            bool found = snapshot.TryGetValue(k, out long v);
                            mine.Add((k, new Op { Thread = t, Kind = Kind.Read, Arg = Absent, Inv = inv, Res = res, Flag = found, Value = found ? v : Absent }));
                        }
                    }
                    else
                    {
                        // A cold key: grows the index while the others work.
                        map.Set(cold++, 1);
                        Interlocked.Increment(ref coldInserted);
                    }
                }
            });

            run.Versions = heap.CurrentVersion - startVersion;
            run.Growths = map.IndexGrowthAttempts;

            // Quiescent: the final state, read by an extra "thread" after everything.
            var last = new List<(long, Op)>();
            records[threads] = last;
            for (long k = 0; k < keys; k++)
            {
                long inv = Stamp();
                bool found = map.TryGetValue(k, out long v);
                last.Add((k, new Op { Thread = threads, Kind = Kind.Read, Arg = Absent, Inv = inv, Res = Stamp(), Flag = found, Value = found ? v : Absent }));
            }

            final = map.ToDictionary();
            long hotLive = last.Count(r => r.Item2.Flag);
            if (map.Count != final.Count || final.Count != hotLive + coldInserted)
            {
                run.QuiescenceFailure = $"Count {map.Count}, ToDictionary {final.Count} entries, hot keys live {hotLive} + cold inserted {coldInserted}";
            }

            foreach ((long k, Op o) in last)
            {
                if (final.TryGetValue(k, out long v) != o.Flag || (o.Flag && v != o.Value))
                {
                    run.QuiescenceFailure ??= $"key {k}: TryGetValue {o} but ToDictionary {(final.TryGetValue(k, out long w) ? w.ToString("X") : "absent")}";
                }
            }

            if (reopen)
            {
                heap.Sync();
            }
        }

        if (reopen && run.QuiescenceFailure == null)
        {
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(path, null, new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromMilliseconds(periodMs) });
            var map = new PersistentHashMap<long, long>(heap, typeId: 1);
            Dictionary<long, long> reopened = map.ToDictionary();
            if (map.Count != final.Count || reopened.Count != final.Count || final.Any(kv => !reopened.TryGetValue(kv.Key, out long v) || v != kv.Value))
            {
                run.QuiescenceFailure = $"reopen: Count {map.Count}, {reopened.Count} entries, expected {final.Count}; first difference: {final.FirstOrDefault(kv => !reopened.TryGetValue(kv.Key, out long v) || v != kv.Value)}";
            }
        }

        return run;
    }

    private (int Runs, int Operations, long Growths, long Versions, int Searched, int Undecided, string? Failure) HashMapCampaign(DurabilityFaults faults, TimeSpan budget, bool reopen)
    {
        var watch = Stopwatch.StartNew();
        int runs = 0, operations = 0, searched = 0, undecided = 0;
        long growths = 0, versions = 0;
        for (int seed = 1; watch.Elapsed < budget; seed++)
        {
            int threads = 2 + (seed % 3);
            int keys = new[] { 2, 3, 4, 8 }[seed % 4];
            int period = 1 + (seed % 5);
            MapRun run;
            try
            {
                run = RunHashMap(seed, threads, keys, period, faults, reopen);
            }
            catch (Exception e) when (faults != DurabilityFaults.None && IsHeapRefusal(e))
            {
                // A broken control may corrupt the heap enough for the heap's own checks to refuse it (a double free
                // found at Dispose, say) before the checker sees the history: caught too (a review saw it fail the
                // test). Only the heap's refusals count: a timeout or an I/O failure proves nothing.
                return (runs + 1, operations, growths, versions, searched, undecided, $"seed {seed}: the heap refused the broken variant: {e.GetType().Name}: {e.Message}");
            }

            runs++;
            growths += run.Growths;
            versions += run.Versions;
            string? failure = CheckMap(run.Records, out int ops, out int decided, out int tooLarge);
            operations += ops;
            searched += decided;
            undecided += tooLarge;
            if (failure == TooLarge)
            {
                _output.WriteLine($"seed {seed}: a key's history was too large to search (inconclusive)");
                failure = null;
            }

            failure ??= run.QuiescenceFailure;
            if (failure != null)
            {
                return (runs, operations, growths, versions, searched, undecided, $"seed {seed} (threads {threads}, keys {keys}, period {period} ms): {failure}");
            }
        }

        return (runs, operations, growths, versions, searched, undecided, null);
    }

    [Fact]
    public void HashMap_ConcurrentOperationsPerKey_AreLinearizable_AndSurviveAReopen()
    {
        (int runs, int ops, long growths, long versions, int searched, int undecided, string? failure) = HashMapCampaign(DurabilityFaults.None, TimeSpan.FromSeconds(3), reopen: true);
        _output.WriteLine($"as built: {runs} runs, {ops:N0} operations, {growths} index growths, {versions} versions, {searched} key histories decided, {undecided} too large; {failure ?? "linearizable"}");
        Assert.Null(failure);
        InconclusiveWhenMostlyUndecided(searched, undecided);
        Assert.True(growths > 0 && versions > runs, "the runs neither grew the index nor advanced versions: inconclusive");
    }

    /// <summary>
    /// Skips, as inconclusive, a campaign whose search gave up on more than a tenth as many histories as it decided: a
    /// violation needs the whole search to be proved, so the histories it gives up on are the likelier ones to hide one
    /// (a review's point), and a campaign that decided few proves little.
    /// </summary>
    private static void InconclusiveWhenMostlyUndecided(int decided, int undecided) =>
        Assert.SkipWhen(decided == 0 || undecided * 10 > decided, $"inconclusive: {undecided} histories too large to search against {decided} decided");

    /// <summary>Whether <paramref name="e"/> is the heap refusing a broken variant (its own consistency checks), on the
    /// test's thread or gathered from a worker's.</summary>
    private static bool IsHeapRefusal(Exception e) =>
        e is InvalidOperationException or HeapFileException || (e is AggregateException a && a.InnerExceptions.Any(IsHeapRefusal));

    [Fact]
    public void HashMap_InsertWithoutRecheck_IsCaughtByTheChecker() => BrokenControl(DurabilityFaults.InsertWithoutRecheck);

    [Fact]
    public void HashMap_ClearOldSlotsOnGrow_IsCaughtByTheChecker() => BrokenControl(DurabilityFaults.ClearOldSlotsOnGrow);

    [Fact]
    public void HashMap_GrowWithoutRecheck_IsCaughtByTheChecker() => BrokenControl(DurabilityFaults.GrowWithoutRecheck);

    private void BrokenControl(DurabilityFaults control)
    {
        (int runs, int ops, long growths, long versions, _, _, string? failure) = HashMapCampaign(control, TimeSpan.FromSeconds(3), reopen: false);
        _output.WriteLine($"control {control}: {runs} runs, {ops:N0} operations, {growths} growths; {failure ?? "NOT caught"}");
        Assert.SkipWhen(failure == null, $"inconclusive: the control {control} was not caught this time");
    }

    // ---------------------------------------------------------------- PersistentByteMap<long>

    private static int LengthOf(long value) => 8 * (1 + (int)((value * 31) % 50));

    private static byte[] BytesOf(long value)
    {
        byte[] bytes = new byte[LengthOf(value)];
        for (int i = 0; i < bytes.Length; i += 8)
        {
            BinaryPrimitives.WriteInt64LittleEndian(bytes.AsSpan(i), value);
        }

        return bytes;
    }

    /// <summary>The value the bytes encode, or a value no write made (a torn or wrong-length read) so the check fails.</summary>
    private static long ValueOf(byte[] bytes)
    {
        if (bytes.Length < 8)
        {
            return -1;
        }

        long value = BinaryPrimitives.ReadInt64LittleEndian(bytes);
        return bytes.AsSpan().SequenceEqual(BytesOf(value)) ? value : -2;
    }

    private static (List<(long, Op)>[] Records, string? Quiescence) RunByteMap(int seed, int threads, int keys, int periodMs)
    {
        using var dir = new TempDirectory();
        string path = dir.File("bytes.heap");
        var records = new List<(long, Op)>[threads + 1];
        string? quiescence = null;
        List<KeyValuePair<long, byte[]>> final;
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, new HeapFileOptions { Size = 32L << 20, Domain = PersistenceDomainKind.MappedFile }, new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromMilliseconds(periodMs) }))
        {
            var map = new PersistentByteMap<long>(heap, typeId: 2);
            Workers.Run(threads, t =>
            {
                var random = new Random(seed * 17 + t);
                var mine = new List<(long, Op)>();
                records[t] = mine;
                long counter = 0;
                Span<byte> small = stackalloc byte[8];
                var watch = Stopwatch.StartNew();
                while (watch.Elapsed < RunLength && mine.Count < 20_000)
                {
                    long key = random.Next(keys);
                    int dice = random.Next(100);
                    var op = new Op { Thread = t, Arg = Absent, Value = Absent };
                    if (dice < 35)
                    {
                        long value = ((long)(t + 1) << 40) | ++counter;
                        byte[] bytes = BytesOf(value);
                        op.Kind = Kind.Set;
                        op.Arg = value;
                        op.Inv = Stamp();
                        op.Flag = map.Set(key, bytes);
                        op.Res = Stamp();
                    }
                    else if (dice < 50)
                    {
                        op.Kind = Kind.Remove;
                        op.Inv = Stamp();
                        op.Flag = map.Remove(key);
                        op.Res = Stamp();
                    }
                    else if (dice < 75)
                    {
                        op.Kind = Kind.Read;
                        op.Inv = Stamp();
                        byte[]? got = map.Get(key);
                        op.Res = Stamp();
                        op.Flag = got != null;
                        op.Value = got == null ? Absent : ValueOf(got);
                    }
                    else if (dice < 95)
                    {
                        op.Kind = Kind.Read;
                        op.Inv = Stamp();
                        int length = map.TryCopyValue(key, small);
                        op.Res = Stamp();
                        op.Flag = length >= 0;
                        if (op.Flag)
                        {
                            long v = BinaryPrimitives.ReadInt64LittleEndian(small);
                            op.Value = length == LengthOf(v) ? v : -3;
                        }
                    }
                    else
                    {
                        long inv = Stamp();
                        List<KeyValuePair<long, byte[]>> list = map.ToList();
                        long res = Stamp();
                        for (long k = 0; k < keys; k++)
                        {
                            var hit = list.Where(kv => kv.Key == k).ToList();
                            mine.Add((k, new Op { Thread = t, Kind = Kind.Read, Arg = Absent, Inv = inv, Res = res, Flag = hit.Count > 0, Value = hit.Count == 0 ? Absent : hit.Count > 1 ? -4 : ValueOf(hit[0].Value) }));
                        }

                        continue;
                    }

                    mine.Add((key, op));
                }
            });

            var last = new List<(long, Op)>();
            records[threads] = last;
            for (long k = 0; k < keys; k++)
            {
                long inv = Stamp();
                byte[]? got = map.Get(k);
                last.Add((k, new Op { Thread = threads, Kind = Kind.Read, Arg = Absent, Inv = inv, Res = Stamp(), Flag = got != null, Value = got == null ? Absent : ValueOf(got) }));
            }

            final = map.ToList();
            if (map.Count != final.Count || final.Count != last.Count(r => r.Item2.Flag))
            {
                quiescence = $"Count {map.Count}, ToList {final.Count}, live by Get {last.Count(r => r.Item2.Flag)}";
            }

            heap.Sync();
        }

        if (quiescence == null)
        {
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(path, null, new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromMilliseconds(periodMs) });
            var map = new PersistentByteMap<long>(heap, typeId: 2);
            var reopened = map.ToList().ToDictionary(kv => kv.Key, kv => kv.Value);
            if (map.Count != final.Count || reopened.Count != final.Count || final.Any(kv => !reopened.TryGetValue(kv.Key, out byte[]? v) || !v.AsSpan().SequenceEqual(kv.Value)))
            {
                quiescence = $"reopen: Count {map.Count}, {reopened.Count} entries, expected {final.Count}";
            }
        }

        return (records, quiescence);
    }

    [Fact]
    public void ByteMap_ConcurrentOperationsPerKey_AreLinearizable_AndSurviveAReopen_AndAMutatedHistoryIsCaught()
    {
        var watch = Stopwatch.StartNew();
        int runs = 0, operations = 0, mutantsCaught = 0, mutants = 0, searched = 0, undecided = 0;
        for (int seed = 1; watch.Elapsed < TimeSpan.FromSeconds(3); seed++)
        {
            int threads = 2 + (seed % 3);
            int keys = new[] { 2, 3, 4, 8 }[seed % 4];
            (List<(long, Op)>[] records, string? quiescence) = RunByteMap(seed, threads, keys, 1 + (seed % 5));
            runs++;
            string? failure = CheckMap(records, out int ops, out int decided, out int tooLarge);
            operations += ops;
            searched += decided;
            undecided += tooLarge;
            failure = (failure == TooLarge ? null : failure) ?? quiescence;
            Assert.True(failure == null, $"seed {seed}: {failure}");

            // Control: a read of a key that completed after a later, completed write of it is made to return the older value.
            if (Mutate(records))
            {
                string? verdict = CheckMap(records, out _, out _, out _);
                if (verdict != TooLarge)
                {
                    mutants++;
                    mutantsCaught += verdict != null ? 1 : 0;
                }
            }
        }

        _output.WriteLine($"{runs} runs, {operations:N0} operations, {searched} key histories decided, {undecided} too large: linearizable; mutated histories caught {mutantsCaught}/{mutants}");
        InconclusiveWhenMostlyUndecided(searched, undecided);
        Assert.SkipWhen(mutants == 0, "inconclusive: no mutated history was small enough to search");
        Assert.Equal(mutants, mutantsCaught);
    }

    /// <summary>
    /// Makes one found read return a stale value: the value of a Set on the same key that completed before another Set
    /// of that key that completed before the read began (a definite stale read). Returns whether one was found.
    /// </summary>
    private static bool Mutate(List<(long Key, Op Op)>[] records)
    {
        var all = records.SelectMany(r => r).ToList();
        foreach (var read in all.Where(r => r.Op.Kind == Kind.Read && r.Op.Flag))
        {
            // Ordered beyond the checker's slack, or the mutant would not be a definite stale read.
            var sets = all.Where(r => r.Key == read.Key && r.Op.Kind == Kind.Set && r.Op.Res + Slack < read.Op.Inv).OrderBy(r => r.Op.Res).ToList();
            for (int i = 0; i < sets.Count; i++)
            {
                Op older = sets[i].Op;
                bool overwritten = sets.Skip(i + 1).Any(s => s.Op.Inv > older.Res + Slack && s.Op.Res + Slack < read.Op.Inv);
                if (overwritten && older.Arg != read.Op.Value)
                {
                    read.Op.Value = older.Arg;
                    return true;
                }
            }
        }

        return false;
    }

    // ---------------------------------------------------------------- PersistentQueue<long>

    private static (List<Op>[] Threads, string? Quiescence) RunQueue(int seed, int threads, int periodMs, int perThread)
    {
        using var dir = new TempDirectory();
        string path = dir.File("queue.heap");
        var history = new List<Op>[threads + 1];
        string? quiescence = null;
        long[] final;
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, new HeapFileOptions { Size = 32L << 20, Domain = PersistenceDomainKind.MappedFile }, new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromMilliseconds(periodMs) }))
        {
            var queue = new PersistentQueue<long>(heap, typeId: 3);
            Workers.Run(threads, t =>
            {
                var random = new Random(seed * 13 + t);
                var mine = new List<Op>();
                history[t] = mine;
                long counter = 0;
                for (int i = 0; i < perThread; i++)
                {
                    int dice = random.Next(100);
                    var op = new Op { Thread = t, Arg = Absent, Value = Absent };
                    if (dice < 45)
                    {
                        op.Kind = Kind.Enqueue;
                        op.Arg = ((long)(t + 1) << 40) | ++counter;
                        op.Inv = Stamp();
                        queue.Enqueue(op.Arg);
                        op.Res = Stamp();
                    }
                    else if (dice < 90)
                    {
                        op.Kind = Kind.Dequeue;
                        op.Inv = Stamp();
                        op.Flag = queue.TryDequeue(out long v);
                        op.Res = Stamp();
                        op.Value = op.Flag ? v : Absent;
                    }
                    else if (dice < 95)
                    {
                        op.Kind = Kind.Count;
                        op.Inv = Stamp();
                        op.Value = queue.Count;
                        op.Res = Stamp();
                    }
                    else
                    {
                        op.Kind = Kind.Snapshot;
                        op.Inv = Stamp();
                        op.Items = queue.ToArray();
                        op.Res = Stamp();
                    }

                    mine.Add(op);
                }
            });

            long inv = Stamp();
            final = queue.ToArray();
            history[threads] = [new Op { Thread = threads, Kind = Kind.Snapshot, Arg = Absent, Inv = inv, Res = Stamp(), Items = final }];
            if (queue.Count != final.Length)
            {
                quiescence = $"Count {queue.Count}, ToArray {final.Length}";
            }

            heap.Sync();
        }

        if (quiescence == null)
        {
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(path, null, new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromMilliseconds(periodMs) });
            var queue = new PersistentQueue<long>(heap, typeId: 3);
            long[] reopened = queue.ToArray();
            if (!reopened.AsSpan().SequenceEqual(final))
            {
                quiescence = $"reopen: [{string.Join(",", reopened)}] expected [{string.Join(",", final)}]";
            }
        }

        return (history, quiescence);
    }

    [Fact]
    public void Queue_ConcurrentOperations_AreLinearizableAsAFifo_AndSurviveAReopen_AndAMutatedHistoryIsCaught()
    {
        var watch = Stopwatch.StartNew();
        int runs = 0, operations = 0, mutants = 0, caught = 0, decided = 0, undecided = 0;
        for (int seed = 1; watch.Elapsed < TimeSpan.FromSeconds(3); seed++)
        {
            int threads = 2 + (seed % 3);
            (List<Op>[] history, string? quiescence) = RunQueue(seed, threads, 1 + (seed % 5), perThread: 300);
            runs++;
            operations += history.Sum(h => h.Count);
            string? failure = CheckQueue(history);
            decided += failure == TooLarge ? 0 : 1;
            undecided += failure == TooLarge ? 1 : 0;
            failure = (failure == TooLarge ? null : failure) ?? quiescence;
            Assert.True(failure == null, $"seed {seed}: {failure}");

            // Control: swap the results of two successful dequeues of one thread (of values enqueued by one thread in
            // program order, so FIFO fixes their order).
            foreach (List<Op> ops in history)
            {
                var deq = ops.Where(o => o.Kind == Kind.Dequeue && o.Flag).ToList();
                for (int i = 0; i + 1 < deq.Count; i++)
                {
                    if (deq[i].Value >> 40 == deq[i + 1].Value >> 40)
                    {
                        (deq[i].Value, deq[i + 1].Value) = (deq[i + 1].Value, deq[i].Value);
                        string? verdict = CheckQueue(history);
                        if (verdict != TooLarge)
                        {
                            mutants++;
                            caught += verdict != null ? 1 : 0;
                        }

                        goto Mutated;
                    }
                }
            }

        Mutated:;
        }

        _output.WriteLine($"{runs} runs ({decided} decided), {operations:N0} operations: linearizable; mutated histories caught {caught}/{mutants}");
        InconclusiveWhenMostlyUndecided(decided, undecided);
        Assert.SkipWhen(mutants == 0, "inconclusive: no mutated history was small enough to search");
        Assert.Equal(mutants, caught);
    }

    // ---------------------------------------------------------------- raw PersistentHeap: a block is never handed out twice

    private static (long Allocations, List<string> Violations) RunRawHeap(int seed, HeapFaults faults, TimeSpan length)
    {
        using var dir = new TempDirectory();
        using HeapFile file = HeapFile.Create(dir.File("raw.heap"), new HeapFileOptions { Size = 8L << 20, Domain = PersistenceDomainKind.MappedFile });
        using var heap = new PersistentHeap(file, new PersistentHeapOptions { Faults = faults });
        var owners = new System.Collections.Concurrent.ConcurrentDictionary<long, int>();
        var violations = new System.Collections.Concurrent.ConcurrentQueue<string>();
        long allocations = 0;
        Workers.Run(4, t =>
        {
            var random = new Random(seed * 7 + t);
            var mine = new List<(PayloadRef Block, long Stamp)>();
            long counter = 0;
            var watch = Stopwatch.StartNew();
            while (watch.Elapsed < length && violations.Count < 5)
            {
                if (mine.Count > 0 && (mine.Count > 100 || random.Next(2) == 0))
                {
                    int i = random.Next(mine.Count);
                    (PayloadRef block, long stamp) = mine[i];
                    mine[i] = mine[^1];
                    mine.RemoveAt(mine.Count - 1);
                    long seen = BinaryPrimitives.ReadInt64LittleEndian(heap.GetPayload(block));
                    if (seen != stamp)
                    {
                        violations.Enqueue($"thread {t}: block 0x{block.Offset:X} holds stamp {seen:X}, not its {stamp:X}");
                    }

                    if (!owners.TryRemove(block.Offset, out int owner) || owner != t)
                    {
                        violations.Enqueue($"thread {t}: block 0x{block.Offset:X} owned by {owner}");
                    }

                    try
                    {
                        heap.Free(block);
                    }
                    catch (InvalidOperationException e)
                    {
                        violations.Enqueue($"thread {t}: free of 0x{block.Offset:X}: {e.Message}");
                    }

                    continue;
                }

                if (!heap.TryAllocate(8 + random.Next(200), typeId: 1, out PayloadRef allocated))
                {
                    continue;
                }

                Interlocked.Increment(ref allocations);
                if (!owners.TryAdd(allocated.Offset, t))
                {
                    violations.Enqueue($"thread {t}: block 0x{allocated.Offset:X} handed out while thread {owners.GetValueOrDefault(allocated.Offset)} holds it");
                    continue;
                }

                long s = ((long)(t + 1) << 48) | ++counter;
                try
                {
                    BinaryPrimitives.WriteInt64LittleEndian(heap.GetPayload(allocated), s);
                }
                catch (InvalidOperationException e)
                {
                    violations.Enqueue($"thread {t}: new block 0x{allocated.Offset:X}: {e.Message}");
                    continue;
                }

                mine.Add((allocated, s));
            }
        });

        return (allocations, violations.ToList());
    }

    [Fact]
    public void RawHeap_ConcurrentAllocateFree_NeverHandsOutABlockTwice_AndTheControlIsCaught()
    {
        long total = 0;
        for (int seed = 1; seed <= 5; seed++)
        {
            (long allocations, List<string> violations) = RunRawHeap(seed, HeapFaults.None, TimeSpan.FromMilliseconds(300));
            total += allocations;
            Assert.True(violations.Count == 0, $"seed {seed}: {string.Join("; ", violations)}");
        }

        (long controlAllocations, List<string> controlViolations) = RunRawHeap(1, HeapFaults.ShareRefillBatch, TimeSpan.FromMilliseconds(300));
        _output.WriteLine($"as built: {total:N0} allocations, no double hand-out; control ShareRefillBatch: {controlViolations.Count} violations, e.g. {controlViolations.FirstOrDefault()}");
        Assert.SkipWhen(controlViolations.Count == 0, "inconclusive: the control ShareRefillBatch was not caught");
    }
}
