using System;
using System.Diagnostics;
using System.Runtime.CompilerServices;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// The hash map's lock-free reads: a key's slot is updated in place (no allocation per update), so its value is
/// guarded by a sequence lock, and a read that races with an update must never return a mix of two values; the index
/// grows by copying its slots and leaving the old ones readable, so a read that races with a growth must still find
/// every present key, and an update that races with it must not be lost.
/// </summary>
public sealed class HashMapReadTests
{
    private const int GrowthPresent = 4096;
    private static readonly TimeSpan Duration = TimeSpan.FromSeconds(1);
    private readonly ITestOutputHelper _output;

    public HashMapReadTests(ITestOutputHelper output) => _output = output;

    [Fact]
    public void Map_ReadsRacingUpdatesOfAWideValue_NeverReturnATornValue() =>
        // Control: reads that skip the sequence check must be caught returning torn values.
        CheckWithControl("reads", "torn", faults => RaceReadsWithUpdates(faults, faults == DurabilityFaults.None ? Duration : 3 * Duration), DurabilityFaults.TornIndexReads);

    [Fact]
    public void Map_ReadsWhileTheIndexGrows_AlwaysFindPresentKeys() =>
        // Control: growth that empties the old slots it copies (under readers of the old table) must be caught losing keys.
        CheckWithControl("reads", "present keys missed", RaceReadsWithGrowth, DurabilityFaults.ClearOldSlotsOnGrow);

    [Fact]
    public void Map_UpdatesWhileTheIndexGrows_AreNeverLost() =>
        // Control: growth that copies slots without locking them must be caught losing updates.
        CheckWithControl("updates", "lost", RaceUpdatesWithGrowth, DurabilityFaults.GrowWithoutSlotLocks);

    /// <summary>
    /// Runs <paramref name="race"/> as built (enough operations, no failure), then with <paramref name="control"/>,
    /// which must show failures; a control that shows none makes the run inconclusive (skipped), never passed.
    /// </summary>
    private void CheckWithControl(string operations, string failures, Func<DurabilityFaults, (long Operations, long Failures)> race, DurabilityFaults control)
    {
        (long done, long failed) = race(DurabilityFaults.None);
        _output.WriteLine($"as built: {done:N0} {operations}, {failed:N0} {failures}");
        Assert.True(done > 1000, $"too few {operations} to judge ({done})");
        Assert.Equal(0, failed);

        (long controlDone, long controlFailed) = race(control);
        _output.WriteLine($"control ({control}): {controlDone:N0} {operations}, {controlFailed:N0} {failures}");
        Assert.SkipWhen(controlFailed == 0, $"inconclusive: the control {control} showed no {failures} this run (the threads did not overlap enough)");
    }

    /// <summary>
    /// One thread updates 4,096 present keys with increasing values, reading each one first, while another inserts keys
    /// (several doublings of the table): a value that is not the key's previous write, or a final value that is not its
    /// last write, is a lost update.
    /// </summary>
    private static (long Updates, long Lost) RaceUpdatesWithGrowth(DurabilityFaults faults)
    {
        var last = new long[GrowthPresent];
        long updates = 0, lost = 0;
        RaceWithGrowth(faults, k => 0, (map, stopped) =>
        {
            for (long round = 1; !stopped(); round++)
            {
                for (int k = 0; k < GrowthPresent; k++)
                {
                    // The previous round's write must still be there: an update that went to a slot after a growth
                    // had copied it is gone from the grown table.
                    if (!map.TryGetValue(k, out long before) || before != last[k])
                    {
                        lost++;
                    }

                    map.Set(k, round);
                    last[k] = round;
                    updates++;
                }
            }

            for (int k = 0; k < GrowthPresent; k++)
            {
                if (!map.TryGetValue(k, out long final) || final != last[k])
                {
                    lost++;
                }
            }
        });

        return (updates, lost);
    }

    /// <summary>One thread reads the 4,096 present keys round and round while another grows the index: each must be found with its value.</summary>
    private static (long Reads, long Missed) RaceReadsWithGrowth(DurabilityFaults faults)
    {
        long reads = 0, missed = 0;
        RaceWithGrowth(faults, k => k * 10, (map, stopped) =>
        {
            for (long k = 0; !stopped(); k = (k + 1) % GrowthPresent)
            {
                reads++;
                if (!map.TryGetValue(k, out long value) || value != k * 10)
                {
                    missed++;
                }
            }
        });

        return (reads, missed);
    }

    /// <summary>
    /// A transient map of <see cref="GrowthPresent"/> keys (values from <paramref name="valueOf"/>); worker 0 inserts
    /// 2^18 more keys (several doublings of the index) and then signals; worker 1 runs <paramref name="racer"/> with
    /// the map and a "has the inserter finished" probe.
    /// </summary>
    private static void RaceWithGrowth(DurabilityFaults faults, Func<long, long> valueOf, Action<PersistentHashMap<long, long>, Func<bool>> racer)
    {
        const int Inserted = 1 << 18;
        using var dir = new TempDirectory();
        using BufferedDurableHeap heap = BufferedDurableHeap.Create(
            dir.File("map.heap"),
            new HeapFileOptions { Size = 128L << 20, Domain = PersistenceDomainKind.MappedFile },
            new BufferedDurableHeapOptions { Mode = DurabilityMode.Transient, AdvancePeriod = Timeout.InfiniteTimeSpan, Faults = faults });
        var map = new PersistentHashMap<long, long>(heap, typeId: 1);
        for (long k = 0; k < GrowthPresent; k++)
        {
            map.Set(k, valueOf(k));
        }

        int stop = 0;
        Workers.Run(2, index =>
        {
            if (index == 0)
            {
                for (long k = GrowthPresent; k < GrowthPresent + Inserted; k++)
                {
                    map.Set(k, valueOf(k));
                }

                // Volatile.Write: release; pairs with the racer's Volatile.Read.
                Volatile.Write(ref stop, 1);
                return;
            }

            // Volatile.Read: acquire; pairs with the inserter's Volatile.Write.
            racer(map, () => Volatile.Read(ref stop) != 0);
        });
    }

    private static (long Reads, long Torn) RaceReadsWithUpdates(DurabilityFaults faults, TimeSpan duration)
    {
        using var dir = new TempDirectory();
        using BufferedDurableHeap heap = BufferedDurableHeap.Create(
            dir.File("map.heap"),
            new HeapFileOptions { Size = 16L << 20, Domain = PersistenceDomainKind.MappedFile },
            new BufferedDurableHeapOptions { Mode = DurabilityMode.Transient, AdvancePeriod = Timeout.InfiniteTimeSpan, Faults = faults });
        var map = new PersistentHashMap<int, Wide>(heap, typeId: 1);
        map.Set(0, Wide.Of(0));
        int stop = 0;
        long reads = 0, torn = 0;
        Workers.Run(2, index =>
        {
            var watch = Stopwatch.StartNew();
            if (index == 0)
            {
                for (long i = 1; watch.Elapsed < duration; i++)
                {
                    map.Set(0, Wide.Of(i));
                }

                // Volatile.Write: release; pairs with the reader's Volatile.Read.
                Volatile.Write(ref stop, 1);
                return;
            }

            // Volatile.Read: acquire; pairs with the writer's Volatile.Write (the reader also stops on its own clock).
            while (Volatile.Read(ref stop) == 0 && watch.Elapsed < duration + TimeSpan.FromSeconds(1))
            {
                for (int i = 0; i < 64; i++)
                {
                    Assert.True(map.TryGetValue(0, out Wide value));
                    reads++;
                    if (!value.IsUniform)
                    {
                        torn++;
                    }
                }
            }
        });

        return (reads, torn);
    }

    /// <summary>A 256-byte value whose words are all equal when read whole; copied with several loads, so it can tear.</summary>
    [InlineArray(32)]
    internal struct Wide
    {
        private long _word;

        internal static Wide Of(long value)
        {
            var wide = default(Wide);
            ((Span<long>)wide).Fill(value);
            return wide;
        }

        internal readonly bool IsUniform
        {
            get
            {
                ReadOnlySpan<long> words = this;
                foreach (long word in words)
                {
                    if (word != words[0])
                    {
                        return false;
                    }
                }

                return true;
            }
        }
    }
}
