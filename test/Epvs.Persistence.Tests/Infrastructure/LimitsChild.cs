using System;
using System.Collections.Generic;
using System.IO;
using System.Threading;

namespace Epvs.Persistence.Tests;

/// <summary>
/// Child-process scenarios of <see cref="LimitTests"/> (a probe's findings): the version space of a buffered heap running
/// out, and crafted files whose checked words hold values past what the format writes. Each prints "verdict: ok" or
/// "verdict: broken: why"; a crash kills only the child.
/// </summary>
internal static class LimitsChild
{
    internal const string Role = "limits";

    internal static int Run(string scenario, string path, bool control)
    {
        try
        {
            string? broken = scenario switch
            {
                "version-limit" => VersionLimit(path, control),
                "clock-at-max" => ClockAtMax(path),
                "dispose-at-limit" => DisposeAtLimit(path),
                "large-size-word" => LargeSizeWord(path, control),
                "saved-state-words" => SavedStateWords(path),
                _ => throw new ArgumentException($"unknown scenario {scenario}"),
            };
            Console.WriteLine(broken is null ? "verdict: ok" : $"verdict: broken: {broken}");
            return 0;
        }
        catch (Exception e)
        {
            Console.WriteLine($"unexpected: {e}");
            return 3;
        }
    }

    private static readonly HeapFileOptions Mapped = new() { Domain = PersistenceDomainKind.MappedFile };

    private static long MaxSealed => (long)HeapLayout.SealedValueMask;

    private static void Patch(string path, int offset, ulong word)
    {
        using var stream = new FileStream(path, FileMode.Open, FileAccess.ReadWrite, FileShare.None);
        stream.Position = offset;
        stream.Write(BitConverter.GetBytes(word));
        stream.Flush(true);
    }

    /// <summary>A buffered heap file with one synced key, whose clock words are then moved to <paramref name="clock"/> (frontier two below; saved state dropped).</summary>
    private static void CreateWithClock(string path, long clock)
    {
        using (var heap = BufferedDurableHeap.Create(path, new HeapFileOptions { Size = 8L << 20, Domain = PersistenceDomainKind.MappedFile }, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan }))
        {
            new PersistentByteMap<long>(heap, 7).Set(-1, new byte[] { 42 });
            heap.Sync();
        }

        Patch(path, HeapLayout.DurableFrontierOffset, HeapLayout.Seal(clock - 2, HeapLayout.DurableFrontierOffset));
        Patch(path, HeapLayout.EpochClockOffset, HeapLayout.Seal(clock, HeapLayout.EpochClockOffset));
        Patch(path, HeapLayout.SealedFrontierOffset, HeapLayout.Seal(clock - 2, HeapLayout.SealedFrontierOffset));
        Patch(path, HeapLayout.SavedStateOffset, 0);
    }

    /// <summary>Whether the reopened file holds exactly <paramref name="expected"/> (and the key written at creation).</summary>
    private static string? Holds(PersistentByteMap<long> map, Dictionary<long, byte> expected)
    {
        if (map.Get(-1) is not [42])
        {
            return "the key written at creation is lost";
        }

        foreach ((long key, byte value) in expected)
        {
            if (map.Get(key) is not [var got] || got != value)
            {
                return $"acknowledged key {key} is lost or wrong";
            }
        }

        return null;
    }

    /// <summary>
    /// Versions driven by Sync (one per call) from 200 below the last writable one (the control: from 200 below the
    /// largest sealed value, with the limit ignored, as before): writes must stop with the version-space refusal, Sync
    /// and Dispose must succeed, and the file must reopen, twice, with every acknowledged write (before the fix: the
    /// clock reached 2^42 - 1, the heap failed, and no open could begin a version again).
    /// </summary>
    private static string? VersionLimit(string path, bool control)
    {
        long limit = control ? MaxSealed : HeapLayout.LastWritableVersion;
        CreateWithClock(path, limit - 200);
        var options = new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, Faults = control ? DurabilityFaults.AdvancePastTheVersionSpace : DurabilityFaults.None };
        var acknowledged = new Dictionary<long, byte>();
        string? refusal = null;
        string disposed = "not disposed";
        var heap = BufferedDurableHeap.Open(path, Mapped, options);
        try
        {
            var map = new PersistentByteMap<long>(heap, 7);
            var written = new Dictionary<long, byte>();
            for (int i = 0; i < 1000 && refusal is null; i++)
            {
                byte value = (byte)i;
                string set = ArgumentsChild.Outcome(() => map.Set(i % 50, new[] { value }));
                if (set != "ok")
                {
                    refusal = set;
                    break;
                }

                written[i % 50] = value;
                string sync = ArgumentsChild.Outcome(() => heap.Sync(TimeSpan.FromSeconds(30)));
                if (sync != "ok")
                {
                    refusal = sync;
                    break;
                }

                acknowledged = new Dictionary<long, byte>(written);
            }

            Console.WriteLine($"writes stopped at clock {heap.Heap.File.EpochClock}, frontier {heap.DurableFrontier}: {refusal}");
            if (refusal is null || !refusal.StartsWith("InvalidOperationException: The heap's version space is used up", StringComparison.Ordinal))
            {
                return $"the writes did not stop with the version-space refusal: {refusal}";
            }

            if (ArgumentsChild.Outcome(() => heap.Sync(TimeSpan.FromSeconds(30))) is var sync2 && sync2 != "ok")
            {
                return $"Sync after the refusal: {sync2}";
            }

            if (ArgumentsChild.Outcome(() => heap.AdvanceVersion(TimeSpan.FromSeconds(30))) is var advance && !advance.Contains("version space is used up", StringComparison.Ordinal))
            {
                return $"AdvanceVersion after the refusal: {advance}";
            }

            if (Holds(map, acknowledged) is { } lost)
            {
                return $"before the reopen: {lost}";
            }
        }
        finally
        {
            // (The control's heap failed: its Dispose throws. Reported below, after any earlier failure.)
            disposed = ArgumentsChild.Outcome(heap.Dispose);
        }

        if (disposed != "ok")
        {
            return $"Dispose: {disposed}";
        }

        for (int reopen = 1; reopen <= 2; reopen++)
        {
            string? broken = null;
            string open = ArgumentsChild.Outcome(() =>
            {
                using var reopened = BufferedDurableHeap.Open(path, Mapped, new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromMilliseconds(1), Faults = options.Faults });
                var reopenedMap = new PersistentByteMap<long>(reopened, 7);
                broken = Holds(reopenedMap, acknowledged);
                string write = ArgumentsChild.Outcome(() => reopenedMap.Set(1, new byte[] { 1 }));
                Console.WriteLine($"reopen {reopen}: clock {reopened.Heap.File.EpochClock}; a write: {write}");
                broken ??= write.Contains("version space is used up", StringComparison.Ordinal) ? null : $"a write after reopen {reopen}: {write}";
            });
            if (open != "ok")
            {
                return $"reopen {reopen}: {open}";
            }

            if (broken is not null)
            {
                return broken;
            }
        }

        Console.WriteLine($"{acknowledged.Count} acknowledged keys kept through two reopens");
        return null;
    }

    /// <summary>
    /// The last writable version L reached with a replaced payload still waiting for reclamation (a review's case):
    /// Dispose, whose save of the allocator state runs cycles until everything is reclaimed, must run no transition past
    /// L, so the clock it leaves is L + 2 (persisted with frontier L) and each reopen begins exactly one version higher.
    /// (Without the cycle's stop at the limit, the background advancer, back-pressure and Dispose would use up the
    /// opens' versions.)
    /// </summary>
    private static string? DisposeAtLimit(string path)
    {
        long last = HeapLayout.LastWritableVersion;
        CreateWithClock(path, last - 2);
        var heap = BufferedDurableHeap.Open(path, Mapped, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
        var map = new PersistentByteMap<long>(heap, 7);
        map.Set(1, new byte[] { 1 }); // in L - 1
        heap.Sync();
        map.Set(1, new byte[] { 2 }); // in L: retires L - 1's payload, reclaimed only once a version after L + 1 ends
        heap.Sync();
        Console.WriteLine($"after Sync: current L + {heap.CurrentVersion - last}, frontier L + {heap.DurableFrontier - last}");
        heap.Dispose();
        for (int reopen = 1; reopen <= 2; reopen++)
        {
            using var reopened = BufferedDurableHeap.Open(path, Mapped, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
            long start = reopened.Heap.File.EpochClock;
            Console.WriteLine($"reopen {reopen} begins at L + {start - last}");
            if (start != last + 2 + reopen)
            {
                return $"reopen {reopen} begins at L + {start - last}, not L + {2 + reopen}: transitions ran past the last writable version";
            }

            if (Holds(new PersistentByteMap<long>(reopened, 7), new Dictionary<long, byte> { [1] = 2 }) is { } lost)
            {
                return lost;
            }
        }

        return null;
    }

    /// <summary>
    /// A clock one below the largest sealed value opens (its first version is the largest) and refuses writes; a clock
    /// at it is refused with <see cref="HeapFileError.VersionSpaceExhausted"/> (it threw ArgumentOutOfRangeException).
    /// </summary>
    private static string? ClockAtMax(string path)
    {
        CreateWithClock(path, MaxSealed - 1);
        string? broken = null;
        string open = ArgumentsChild.Outcome(() =>
        {
            using var heap = BufferedDurableHeap.Open(path, Mapped, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
            var map = new PersistentByteMap<long>(heap, 7);
            broken = Holds(map, new Dictionary<long, byte>());
            string write = ArgumentsChild.Outcome(() => map.Set(1, new byte[] { 1 }));
            broken ??= write.Contains("version space is used up", StringComparison.Ordinal) ? null : $"a write: {write}";
        });
        Console.WriteLine($"clock 2^42 - 2: open {open}");
        if (open != "ok" || broken is not null)
        {
            return broken ?? $"the open at 2^42 - 2: {open}";
        }

        string atMax = ArgumentsChild.Outcome(() => BufferedDurableHeap.Open(path, Mapped, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan }).Dispose());
        Console.WriteLine($"clock 2^42 - 1: open {atMax}");
        return atMax.StartsWith("HeapFileException", StringComparison.Ordinal) && atMax.Contains("versions are used up", StringComparison.Ordinal) ? null : $"the open at 2^42 - 1: {atMax}";
    }

    /// <summary>
    /// A raw heap of 32,869 segments whose first segment holds a (validly checked) large-block descriptor of 32,769
    /// segments, over a header whose size word is 2^31 (the control: 2^31 - 65,536): the open reports the block as
    /// damage (HeapFileException Corrupt) for both (it threw ArgumentOutOfRangeException: the size, read as an int, was
    /// negative, and passed a check made unsigned against a span of 2^31 bytes and more).
    /// </summary>
    private static string? LargeSizeWord(string path, bool control)
    {
        const long Span = 32769;
        long size = ((Span + 100) * HeapLayout.SegmentSize) + HeapLayout.MaxSweepLogBytes;
        long dataStart;
        using (var heap = PersistentHeap.Create(path, new HeapFileOptions { Size = size, MaxSize = size, Domain = PersistenceDomainKind.MappedFile }))
        {
            dataStart = heap.File.DataStart;
        }

        ulong descriptor;
        using (var stream = new FileStream(path, FileMode.Open, FileAccess.Read, FileShare.ReadWrite))
        {
            byte[] word = new byte[8];
            stream.Position = HeapLayout.SuperblockSize;
            stream.ReadExactly(word);
            descriptor = BitConverter.ToUInt64(word);
        }

        Patch(path, HeapLayout.SuperblockSize, HeapLayout.Descriptor(HeapLayout.NextGeneration(descriptor), HeapLayout.RoleLargeStart, Span, 0));
        ulong shape = control ? HeapLayout.Shape(int.MaxValue - HeapLayout.SegmentSize, 5) : (1UL << 31) | (5UL << 32);
        // Sealed, kind Alloc, an arbitrary check: the size is looked at before the check.
        ulong commit = HeapLayout.CommitTag | (HeapLayout.StateSealed << 52) | (1UL << 48) | (7UL << 32) | 0x1234_5678UL;
        Patch(path, (int)dataStart, 1);
        Patch(path, (int)dataStart + 8, 7);
        Patch(path, (int)dataStart + 16, shape);
        Patch(path, (int)dataStart + 24, commit);
        string open = ArgumentsChild.Outcome(() => PersistentHeap.Open(path, Mapped).Dispose());
        Console.WriteLine($"open: {open}");
        return open.StartsWith("HeapFileException", StringComparison.Ordinal) && open.Contains("fail their checks", StringComparison.Ordinal) ? null : $"the open did not report the damaged block: {open}";
    }

    /// <summary>
    /// A cleanly closed heap of 2.15 GiB whose saved-state words (checked by their hash, not sealed) name 2^28 + 8 words
    /// inside the heap: the saved state is rejected and the heap opens by a full scan (the hash's span of more than
    /// 2^31 bytes threw OverflowException out of the open).
    /// </summary>
    private static string? SavedStateWords(string path)
    {
        long size = (32769L + 100) * HeapLayout.SegmentSize;
        long dataStart;
        using (var heap = PersistentHeap.Create(path, new HeapFileOptions { Size = size, MaxSize = size, Domain = PersistenceDomainKind.MappedFile }))
        {
            dataStart = heap.File.DataStart;
            heap.Persist(heap.Allocate(100, 1));
        }

        Patch(path, HeapLayout.SavedStateOffset, (ulong)dataStart);
        Patch(path, HeapLayout.SavedStateWordsOffset, (1UL << 28) + 8);
        Patch(path, HeapLayout.SavedStateCheckOffset, 12345);
        string? rejection = null;
        string open = ArgumentsChild.Outcome(() =>
        {
            using PersistentHeap heap = PersistentHeap.Open(path, Mapped);
            rejection = heap.SavedStateRejection;
        });
        Console.WriteLine($"open: {open}; saved state rejected: {rejection}");
        return open == "ok" && rejection is not null ? null : $"the open: {open}";
    }
}
