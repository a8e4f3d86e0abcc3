using System;
using System.Collections.Generic;
using System.IO;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// A superblock older than the blocks (its page lost a write, or an old copy of it was put back): recovery took the old
/// clock and frontier at their word, dropped every block tagged above them as "beyond the frontier" and freed them
/// durably — data that <see cref="BufferedDurableHeap.Sync()"/> had acknowledged, lost without a word (250 of 300 keys in
/// the review's probe), and lost for good even once the right superblock came back. Every tag on the file is written
/// after the clock that covers it is persisted, so an intact block tagged above the clock is damage: it is now reported
/// before anything is written. The control trusts the clock.
/// </summary>
public sealed class StaleSuperblockTests
{
    private const int TypeId = 1;
    private static readonly HeapFileOptions Options = new() { Size = 4L << 20, Domain = PersistenceDomainKind.MappedFile };
    private static readonly BufferedDurableHeapOptions NoAdvancer = new() { AdvancePeriod = Timeout.InfiniteTimeSpan };

    /// <summary>
    /// A heap written in six synced rounds; returns the file after the first (<paramref name="early"/>) and after the last,
    /// and the map's contents at the last Sync.
    /// </summary>
    private static byte[] SixRounds(string path, out byte[] early, out Dictionary<long, long> acknowledged)
    {
        using BufferedDurableHeap heap = BufferedDurableHeap.Create(path, Options, NoAdvancer);
        var map = new PersistentHashMap<long, long>(heap, TypeId);
        early = Array.Empty<byte>();
        for (int round = 0; round < 6; round++)
        {
            for (long k = 0; k < 50; k++)
            {
                map.Set((round * 100) + k, k);
            }

            heap.Sync();
            if (round == 0)
            {
                early = CorruptionFuzz.ReadPastTheLock(path);
            }
        }

        acknowledged = map.ToDictionary();
        return CorruptionFuzz.ReadPastTheLock(path);
    }

    /// <summary><paramref name="newer"/> with its first page (the superblock) taken from <paramref name="older"/>.</summary>
    private static byte[] WithOldSuperblock(byte[] newer, byte[] older)
    {
        byte[] copy = (byte[])newer.Clone();
        Array.Copy(older, 0, copy, 0, 4096);
        return copy;
    }

    [Fact]
    public void AnOldSuperblockOverNewerBlocks_IsReportedBeforeAnythingIsWritten()
    {
        using var dir = new TempDirectory();
        byte[] latest = SixRounds(dir.File("live.heap"), out byte[] early, out Dictionary<long, long> acknowledged);
        string stale = dir.File("stale.heap");
        byte[] damaged = WithOldSuperblock(latest, early);
        File.WriteAllBytes(stale, damaged);

        HeapFileException refused = Assert.Throws<HeapFileException>(() => BufferedDurableHeap.Open(stale, null, NoAdvancer).Dispose());
        Assert.Equal(HeapFileError.Corrupt, refused.Error);
        Assert.Contains("the superblock is older than the blocks", refused.Message, StringComparison.Ordinal);
        Assert.Equal(damaged, File.ReadAllBytes(stale));

        // Nothing was lost: with the superblock put back, every acknowledged key is there.
        File.WriteAllBytes(stale, WithOldSuperblock(damaged, latest));
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(stale, null, NoAdvancer);
        Assert.Equal(acknowledged, new PersistentHashMap<long, long>(heap, TypeId).ToDictionary());
    }

    [Fact]
    public void TrustingTheClock_IsCaughtLosingAcknowledgedKeys()
    {
        using var dir = new TempDirectory();
        byte[] latest = SixRounds(dir.File("live.heap"), out byte[] early, out Dictionary<long, long> acknowledged);
        string stale = dir.File("stale.heap");
        File.WriteAllBytes(stale, WithOldSuperblock(latest, early));

        using BufferedDurableHeap heap = BufferedDurableHeap.Open(stale, null, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, Faults = DurabilityFaults.TrustTheClockOverTheBlocks });
        long recovered = new PersistentHashMap<long, long>(heap, TypeId).Count;
        Assert.True(recovered < acknowledged.Count, $"the control recovered {recovered} of {acknowledged.Count} keys");
        Assert.Empty(heap.Recovery.DamagedBlocks);
    }

    [Fact]
    public void Salvaging_ListsTheBlocksAboveTheClock()
    {
        using var dir = new TempDirectory();
        byte[] latest = SixRounds(dir.File("live.heap"), out byte[] early, out _);
        string stale = dir.File("stale.heap");
        File.WriteAllBytes(stale, WithOldSuperblock(latest, early));

        using BufferedDurableHeap heap = BufferedDurableHeap.Open(stale, null, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, SalvageDamagedBlocks = true });
        Assert.NotEmpty(heap.Recovery.DamagedBlocks);
        Assert.Equal(50, new PersistentHashMap<long, long>(heap, TypeId).Count);
    }

    /// <summary>
    /// The check's legitimate case: a state machine run on the heap's public scheme (misuse the heap reports, advising a
    /// reopen) advances the version past the persisted clock. Operations went on writing in those versions until the
    /// heap's next cycle failed on the transition, and a crash image could hold their blocks tagged above the clock (the
    /// simulated domain lets unflushed lines reach the media, as persistent memory and a shared mapping do): the reopen
    /// the heap advised was refused as a stale superblock. A writing operation is now refused in such a version (reads go
    /// on), so every crash image reopens; the control lets them write, and has images refused.
    /// </summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void NoOperationWritesInAForeignVersion_SoEveryCrashImageReopens(bool control)
    {
        using var domain = new SimulatedPersistenceDomain(1 << 20);
        using HeapFile file = HeapFile.Create(domain);
        var options = new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, Faults = control ? DurabilityFaults.BeginAboveTheClock : DurabilityFaults.None };
        BufferedDurableHeap heap = BufferedDurableHeap.Open(file, options);
        var map = new PersistentHashMap<long, long>(heap, TypeId);
        map.Set(1, 10);
        heap.Sync();
        heap.VersionScheme.AdvanceVersionWithCriticalSection((_, _) => { }, spin: true);
        heap.VersionScheme.AdvanceVersionWithCriticalSection((_, _) => { }, spin: true);
        for (long k = 100; k < 200; k++)
        {
            Exception? refused = Record.Exception(() => map.Set(k, k));
            if (!control)
            {
                Assert.Contains("by a state machine the heap did not run", Assert.IsType<InvalidOperationException>(refused).Message, StringComparison.Ordinal);
            }
        }

        Assert.True(map.TryGetValue(1, out long kept) && kept == 10, "reads stopped");
        int refusedImages = 0;
        for (int seed = 0; seed < 40; seed++)
        {
            using var image = SimulatedPersistenceDomain.FromImage(domain.Crash(seed));
            using HeapFile reopened = HeapFile.Open(image);
            try
            {
                using BufferedDurableHeap recovered = BufferedDurableHeap.Open(reopened, NoAdvancer);
                Assert.True(new PersistentHashMap<long, long>(recovered, TypeId).TryGetValue(1, out long value) && value == 10);
            }
            catch (HeapFileException e) when (e.Error == HeapFileError.Corrupt)
            {
                refusedImages++;
            }
        }

        Record.Exception(heap.Dispose); // the heap failed on the foreign transitions
        if (control)
        {
            Assert.True(refusedImages > 0, "the control's crash images all reopened");
        }
        else
        {
            Assert.Equal(0, refusedImages);
        }
    }
}
