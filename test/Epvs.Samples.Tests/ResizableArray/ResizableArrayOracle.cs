using System;
using System.Threading;
using Epvs.Samples.ResizableArray;
using Epvs.Samples.Tests.Infrastructure;

namespace Epvs.Samples.Tests.ResizableArray;

/// <summary>
/// Drives an <see cref="IResizableArray"/> with concurrent pushes, reads and writes (through per-thread sessions) and
/// checks it against an oracle:
/// <list type="bullet">
/// <item><description>no lost push: every index below the final Count was returned by exactly one Push, and holds
/// its value (or a later write) at the end;</description></item>
/// <item><description>every index is readable after its push returns: the pusher reads it back at once;</description></item>
/// <item><description>no torn or stale read: a read returns the value pushed to or written to that very index, never
/// another index's value or a zero;</description></item>
/// <item><description>no lost write: each index has a single writer, who reads its write back at once, and the final
/// content equals every index's last write.</description></item>
/// </list>
/// Values encode what they are: a push value carries (thread, sequence); a write value carries (index, sequence).
/// </summary>
internal static class ResizableArrayOracle
{
    private const long PushTag = 1L << 62;
    private const long WriteTag = 1L << 61;

    public static ViolationLog Check(IResizableArray array, int threads, int operationsPerThread, int seed, int refreshEvery = 16)
    {
        var violations = new ViolationLog();
        int maxPushes = threads * operationsPerThread;
        var pushed = new long[maxPushes];
        var published = new int[maxPushes];
        var lastWrite = new long[maxPushes];
        int totalPushes = 0;

        Workers.Run(threads, t =>
        {
            var random = new Random(seed + t);
            int pushes = 0;
            long writeSeq = 0;
            using IResizableArraySession session = array.OpenSession();
            for (int k = 0; k < operationsPerThread; k++)
            {
                if (k % refreshEvery == 0)
                    session.Refresh();
                int dice = random.Next(100);
                if (dice < 35)
                {
                    long value = PushTag | ((long)t << 32) | (uint)k;
                    int index = session.Push(value);
                    pushes++;
                    if ((uint)index >= (uint)maxPushes)
                    {
                        violations.Add($"Push returned index {index}, beyond the {maxPushes} pushes possible.");
                        continue;
                    }
                    // Full fence: the value is recorded before the index is published below.
                    long previous = Interlocked.CompareExchange(ref pushed[index], value, 0);
                    if (previous != 0)
                        violations.Add($"Index {index} was returned by two pushes ({Describe(previous)} and {Describe(value)}).");
                    long back = session.Read(index);
                    if (back != value)
                        violations.Add($"Index {index} read {Describe(back)} right after its push of {Describe(value)} returned.");
                    Volatile.Write(ref published[index], 1); // release: readers see pushed[index]
                }
                else
                {
                    int n = Math.Min(array.Count, maxPushes);
                    if (n == 0)
                        continue;
                    if (dice < 65)
                    {
                        int index = random.Next(n);
                        if (Volatile.Read(ref published[index]) == 0) // acquire: pairs with the release above
                            continue;
                        long value = session.Read(index);
                        if (value != Volatile.Read(ref pushed[index]) && !(IsWrite(value) && WriteIndex(value) == index))
                            violations.Add($"Index {index} read {Describe(value)}, which was never pushed or written there (pushed {Describe(pushed[index])}).");
                    }
                    else
                    {
                        // Index i has one writer, thread i % threads, so its last write is known exactly.
                        int slots = n / threads;
                        if (slots == 0)
                            continue;
                        int index = random.Next(slots) * threads + t;
                        if (Volatile.Read(ref published[index]) == 0)
                            continue;
                        long value = WriteTag | ((long)index << 24) | (++writeSeq & 0xFFFFFF);
                        session.Write(index, value);
                        lastWrite[index] = value;
                        long back = session.Read(index);
                        if (back != value)
                            violations.Add($"Index {index} read {Describe(back)} right after its writer wrote {Describe(value)}: the write was lost.");
                    }
                }
            }
            Interlocked.Add(ref totalPushes, pushes);
        });

        int count = array.Count;
        if (count != totalPushes)
            violations.Add($"Count is {count} after {totalPushes} pushes.");
        for (int i = 0; i < Math.Min(count, maxPushes); i++)
        {
            if (published[i] == 0)
            {
                violations.Add($"Index {i} (below Count) was never returned by a push.");
                continue;
            }
            long expected = lastWrite[i] != 0 ? lastWrite[i] : pushed[i];
            long actual = array.Read(i);
            if (actual != expected)
                violations.Add($"Index {i} ends as {Describe(actual)}, expected {Describe(expected)}: a {(lastWrite[i] != 0 ? "write" : "push")} was lost.");
        }
        return violations;
    }

    private static bool IsWrite(long value) => (value & WriteTag) != 0;

    private static long WriteIndex(long value) => (value & ~WriteTag) >> 24;

    private static string Describe(long value) =>
        value == 0 ? "0"
        : (value & PushTag) != 0 ? $"push(thread {(value >> 32) & 0xFF}, op {value & 0xFFFFFFFF})"
        : IsWrite(value) ? $"write(index {WriteIndex(value)}, seq {value & 0xFFFFFF})"
        : $"0x{value:X}";
}
