using System;
using System.Diagnostics;
using System.Runtime.CompilerServices;
using System.Threading;
using Xunit;
using Xunit.Abstractions;

namespace Epvs.Persistence.Tests;

/// <summary>
/// The hash map's lock-free reads: a key's node is updated in place (no allocation per update), so its value is
/// guarded by a sequence lock, and a read that races with an update must never return a mix of two values; the index
/// grows by copying its nodes, so a read that races with a growth must still find every present key.
/// </summary>
public sealed class HashMapReadTests
{
    private static readonly TimeSpan Duration = TimeSpan.FromSeconds(1);
    private readonly ITestOutputHelper _output;

    public HashMapReadTests(ITestOutputHelper output) => _output = output;

    [SkippableFact]
    public void Map_ReadsRacingUpdatesOfAWideValue_NeverReturnATornValue()
    {
        (long reads, long torn) = RaceReadsWithUpdates(DurabilityFaults.None, Duration);
        _output.WriteLine($"sequence lock: {reads:N0} reads, {torn:N0} torn");
        Assert.True(reads > 1000, $"too few reads to judge ({reads})");
        Assert.Equal(0, torn);

        // Control: reads that skip the sequence check must be caught returning torn values.
        (long controlReads, long controlTorn) = RaceReadsWithUpdates(DurabilityFaults.TornIndexReads, 3 * Duration);
        _output.WriteLine($"control (no sequence check): {controlReads:N0} reads, {controlTorn:N0} torn");
        Skip.If(controlTorn == 0, "inconclusive: the control saw no torn read this run (the threads did not overlap enough)");
    }

    [SkippableFact]
    public void Map_ReadsWhileTheIndexGrows_AlwaysFindPresentKeys()
    {
        (long reads, long missed) = RaceReadsWithGrowth(DurabilityFaults.None);
        _output.WriteLine($"copying growth: {reads:N0} reads, {missed:N0} present keys missed");
        Assert.True(reads > 1000, $"too few reads to judge ({reads})");
        Assert.Equal(0, missed);

        // Control: growth that moves the nodes (rewriting their links under readers) must be caught losing keys.
        (long controlReads, long controlMissed) = RaceReadsWithGrowth(DurabilityFaults.RelinkOnGrow);
        _output.WriteLine($"control (relinking growth): {controlReads:N0} reads, {controlMissed:N0} present keys missed");
        Skip.If(controlMissed == 0, "inconclusive: the control lost no key this run (no read overlapped a growth)");
    }

    [SkippableFact]
    public void Map_UpdatesWhileTheIndexGrows_AreNeverLost()
    {
        (long updates, long lost) = RaceUpdatesWithGrowth(DurabilityFaults.None);
        _output.WriteLine($"growth under every lock: {updates:N0} updates, {lost:N0} lost");
        Assert.True(updates > 1000, $"too few updates to judge ({updates})");
        Assert.Equal(0, lost);

        // Control: growth that does not exclude the other stripes' writers must be caught losing updates.
        (long controlUpdates, long controlLost) = RaceUpdatesWithGrowth(DurabilityFaults.GrowWithoutWriterLocks);
        _output.WriteLine($"control (growth without the writers' locks): {controlUpdates:N0} updates, {controlLost:N0} lost");
        Skip.If(controlLost == 0, "inconclusive: the control lost no update this run (no update overlapped a growth)");
    }

    /// <summary>
    /// One thread inserts keys (several doublings of the table) while another keeps updating 4,096 present keys with
    /// increasing values, reading each one first: a value that is not the key's previous write, or a final value that
    /// is not its last write, is a lost update.
    /// </summary>
    private static (long Updates, long Lost) RaceUpdatesWithGrowth(DurabilityFaults faults)
    {
        const int Present = 4096;
        const int Inserted = 1 << 18;
        using var dir = new TempDirectory();
        using BufferedDurableHeap heap = BufferedDurableHeap.Create(
            dir.File("map.heap"),
            new HeapFileOptions { Size = 128L << 20, Domain = PersistenceDomainKind.MappedFile },
            new BufferedDurableHeapOptions { Mode = DurabilityMode.Transient, AdvancePeriod = Timeout.InfiniteTimeSpan, Faults = faults });
        var map = new PersistentHashMap<long, long>(heap, typeId: 1);
        var last = new long[Present];
        for (long k = 0; k < Present; k++)
        {
            map.Set(k, 0);
        }

        int stop = 0;
        long updates = 0, lost = 0;
        Workers.Run(2, index =>
        {
            if (index == 0)
            {
                for (long k = Present; k < Present + Inserted; k++)
                {
                    map.Set(k, k);
                }

                // Volatile.Write: release; pairs with the updater's Volatile.Read.
                Volatile.Write(ref stop, 1);
                return;
            }

            // Volatile.Read: acquire; pairs with the inserter's Volatile.Write.
            for (long round = 1; Volatile.Read(ref stop) == 0; round++)
            {
                for (int k = 0; k < Present; k++)
                {
                    // The previous round's write must still be there: an update that went to a node after a growth
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
        });

        for (int k = 0; k < Present; k++)
        {
            if (!map.TryGetValue(k, out long final) || final != last[k])
            {
                lost++;
            }
        }

        return (updates, lost);
    }

    private static (long Reads, long Missed) RaceReadsWithGrowth(DurabilityFaults faults)
    {
        const int Present = 4096;
        const int Inserted = 1 << 18;
        using var dir = new TempDirectory();
        using BufferedDurableHeap heap = BufferedDurableHeap.Create(
            dir.File("map.heap"),
            new HeapFileOptions { Size = 128L << 20, Domain = PersistenceDomainKind.MappedFile },
            new BufferedDurableHeapOptions { Mode = DurabilityMode.Transient, AdvancePeriod = Timeout.InfiniteTimeSpan, Faults = faults });
        var map = new PersistentHashMap<long, long>(heap, typeId: 1);
        for (long k = 0; k < Present; k++)
        {
            map.Set(k, k * 10);
        }

        int stop = 0;
        long reads = 0, missed = 0;
        Workers.Run(2, index =>
        {
            if (index == 0)
            {
                // Several doublings of the table while the reader runs.
                for (long k = Present; k < Present + Inserted; k++)
                {
                    map.Set(k, k * 10);
                }

                // Volatile.Write: release; pairs with the reader's Volatile.Read.
                Volatile.Write(ref stop, 1);
                return;
            }

            // Volatile.Read: acquire; pairs with the writer's Volatile.Write.
            for (long k = 0; Volatile.Read(ref stop) == 0; k = (k + 1) % Present)
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
    private struct Wide
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
