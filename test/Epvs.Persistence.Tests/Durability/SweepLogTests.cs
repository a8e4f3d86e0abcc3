using System;
using System.Collections.Generic;
using System.Runtime.CompilerServices;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// The sweep log (format 10): a sweep makes its frees durable in the log, not in the freed blocks, so after a crash the
/// only thing that keeps a freed block's old payload from coming back is the log's entry (or, once the entry is retired,
/// the free written into the block). Each guarantee is checked on the crash images of a simulated persistence domain,
/// with a broken control the check catches.
/// </summary>
public sealed unsafe class SweepLogTests
{
    private const int VictimType = 31;
    private const int ChurnType = 32;
    private const int Victims = 64;
    private const long Capacity = 8 << 20;
    private static readonly TimeSpan Wait = TimeSpan.FromSeconds(30);

    /// <summary>A value of a size class of its own (well above the victims' 16-byte entries).</summary>
    [InlineArray(40)]
    private struct Fat
    {
        private long _element;
    }

    [Fact]
    public void DeletedKeys_StayDeletedAfterACrash_ThoughTheirOldCopiesAreFreeOnlyInTheLog()
    {
        int back = VictimsBackAfterACrash(HeapFaults.None, turnsWanted: 0, out int images, out SweepLogCounters counters);
        Assert.True(counters.Entries >= Victims, $"only {counters.Entries} entries logged: the scenario did not free the victims' old copies through the log");
        Assert.True(images >= 8, $"only {images} crash images");
        Assert.Equal(0, back);
    }

    [Fact]
    public void Control_RecoveryIgnoringTheLog_BringsDeletedKeysBack()
    {
        int back = VictimsBackAfterACrash(HeapFaults.IgnoreSweepLogAtRecovery, turnsWanted: 0, out int images, out _);
        Assert.SkipWhen(back == 0, $"inconclusive: none of {images} crash images of the broken control brought a deleted key back");
    }

    [Fact]
    public void DeletedKeys_StayDeletedAfterACrash_WhenTheLogHasTurnedPastTheirEntries()
    {
        int back = VictimsBackAfterACrash(HeapFaults.None, turnsWanted: 2, out int images, out SweepLogCounters counters);
        Assert.True(counters.Turns >= 2, $"the log turned {counters.Turns} times");
        Assert.True(counters.HeadersWrittenBack >= Victims, $"a turn wrote back {counters.HeadersWrittenBack} headers: the victims' blocks were not among them");
        Assert.Equal(0, back);
    }

    [Fact]
    public void Control_ATurnRetiringEntriesWithoutWritingTheirBlocksBack_BringsDeletedKeysBack()
    {
        int back = VictimsBackAfterACrash(HeapFaults.None, turnsWanted: 2, out int images, out _, retireWithoutWritingBack: true);
        Assert.SkipWhen(back == 0, $"inconclusive: none of {images} crash images of the broken control brought a deleted key back");
    }

    [Fact]
    public void DeletedKeys_StayDeleted_WhenACrashFollowsAFastReopen()
    {
        int back = VictimsBackAfterAFastReopenAndACrash(HeapFaults.None, out int images);
        Assert.True(images >= 8, $"only {images} crash images");
        Assert.Equal(0, back);
    }

    [Fact]
    public void Control_AFastReopenVoidingTheLog_BringsDeletedKeysBackAfterACrash()
    {
        int back = VictimsBackAfterAFastReopenAndACrash(HeapFaults.FastReopenVoidsTheSweepLog, out int images);
        Assert.SkipWhen(back == 0, $"inconclusive: none of {images} crash images of the broken control brought a deleted key back");
    }

    [Fact]
    public void ADamagedBatchFollowedByAValidOne_IsReportedAsCorrupt_AndNothingIsWritten()
    {
        byte[] image = ImageWithTwoBatches(out long logStart);
        // The first batch's first entry (the batch starts after the half's lap word, its header word first).
        image[logStart + 16] ^= 0x04;
        AssertRefusedUnchanged(image, "sweep log's batch");
    }

    [Fact]
    public void ADamagedLapWord_IsReportedAsCorrupt_AndNothingIsWritten()
    {
        byte[] image = ImageWithTwoBatches(out long logStart);
        image[logStart + 3] ^= 0x01;
        AssertRefusedUnchanged(image, "sweep log's lap word");
    }

    [Fact]
    public void ADamagedBatch_WithSalvage_IsSkippedAndReported_AndEveryKeyKeepsItsLatestValue()
    {
        byte[] image = ImageWithTwoBatches(out long logStart);
        image[logStart + 16] ^= 0x04;
        AssertSalvagedThroughTheLog(image, logStart + sizeof(ulong), rounds: 3);
    }

    [Fact]
    public void ADamagedLapWord_WithSalvage_SkipsItsHalf_AndTheNextOpenWritesItAnew()
    {
        byte[] image = ImageWithTwoBatches(out long logStart);
        image[logStart + 3] ^= 0x01;
        AssertSalvagedThroughTheLog(image, logStart, rounds: 3);
    }

    [Fact]
    public void ADamagedBatch_WithSalvage_StillAppliesTheFreesOfTheValidBatchesAfterIt()
    {
        // The log's first batch lists the churn's old copies; the victims' old copies, deleted after, are listed in
        // batches after it. Only those later batches keep the victims deleted (the control shows they would come back).
        using var domain = new SimulatedPersistenceDomain(Capacity);
        var crashes = new List<byte[]>();
        long logStart;
        using (HeapFile file = HeapFile.Create(domain))
        {
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, Options(HeapFaults.None));
            ChurnTwice(heap);

            long churnEntries = heap.Heap.SweepLogForTesting!.EntriesAppended;
            WriteThenDelete(heap, new PersistentHashMap<long, long>(heap, VictimType));
            SweepLog log = heap.Heap.SweepLogForTesting!;
            Assert.True(churnEntries >= 256 && log.EntriesAppended > churnEntries && log.Turns == 0, $"{churnEntries} churn entries, {log.EntriesAppended} in all, {log.Turns} turns");
            logStart = HeapLayout.SweepLogStart(file.MaxSegments);
            for (int seed = 0; seed < 10; seed++)
            {
                crashes.Add(domain.Crash(seed));
            }
        }

        int backWithoutTheLog = 0, backSalvaged = 0;
        foreach (byte[] image in crashes)
        {
            backWithoutTheLog += VictimsIn(image, HeapFaults.IgnoreSweepLogAtRecovery);
            image[logStart + 16] ^= 0x04;
            backSalvaged += VictimsIn(image, HeapFaults.None, expectedLogDamage: logStart + sizeof(ulong));
        }

        Assert.True(backWithoutTheLog > 0, "inconclusive: without the log no deleted key came back in these images");
        Assert.Equal(0, backSalvaged);
    }

    /// <summary>
    /// After a clean shutdown (through a domain that, like a private mapping, makes durable only what was written back,
    /// so the victims' frees are durable in the log only): damage to the log's first batch (a valid one follows it) or
    /// to its last batch (which, without the ends the saved state holds, reads as the end of the log and was taken for
    /// it silently) is refused, at every open; opened with salvage at once, the heap reopens fast, frees what the saved state says is free, keeps every
    /// deleted key deleted, also after a crash right after that open, and the next open finds no damage.
    /// </summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void ADamagedLog_AfterACleanShutdown_IsRefused_AndSalvagedExactlyFromTheSavedState(bool lastBatch)
    {
        using var domain = new SimulatedPersistenceDomain(Capacity) { WritesBackByCopyForTesting = true };
        using (HeapFile file = HeapFile.Create(domain))
        {
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, Options(HeapFaults.None));
            ChurnTwice(heap);

            WriteThenDelete(heap, new PersistentHashMap<long, long>(heap, VictimType));
        }

        byte[] image = domain.Crash(seed: 0);
        long damagedBatch;
        using (var copy = SimulatedPersistenceDomain.FromImage(image, Capacity))
        using (HeapFile file = HeapFile.Open(copy))
        {
            SweepLog.Contents log = SweepLog.Read(file);
            int current = log.Laps[1] > log.Laps[0] ? 1 : 0;
            long logStart = HeapLayout.SweepLogStart(file.MaxSegments) + (current * ((file.DataStart - HeapLayout.SweepLogStart(file.MaxSegments)) / 2));
            Assert.True(log.Listed[current].Count > Victims && log.Ends[current] > logStart + 64, $"{log.Listed[current].Count} entries listed");

            // The first batch's first entry, or the last batch's check word (the last batch then ends the half's scan).
            long at = lastBatch ? log.Ends[current] - sizeof(ulong) : logStart + 16;
            image[at] ^= 0x04;
            file.ForgoCleanShutdown();
            using var damaged = SimulatedPersistenceDomain.FromImage(image, Capacity);
            using HeapFile damagedFile = HeapFile.Open(damaged);
            damagedBatch = lastBatch ? SweepLog.Read(damagedFile, salvage: true).Ends[current] : logStart + sizeof(ulong);
            damagedFile.ForgoCleanShutdown();
        }

        // Refused without salvage, at every open: a refused open leaves the file marked as not closed cleanly, but the
        // saved state, which still tells where the log ended. A salvage then lists the damage, from a full scan.
        using (var refused = SimulatedPersistenceDomain.FromImage(image, Capacity))
        {
            for (int attempt = 0; attempt < 2; attempt++)
            {
                using HeapFile file = HeapFile.Open(refused);
                HeapFileException e = Assert.Throws<HeapFileException>(() => BufferedDurableHeap.Open(file, Options(HeapFaults.None)).Dispose());
                Assert.Equal(HeapFileError.Corrupt, e.Error);
                Assert.Contains("sweep log", e.Message, StringComparison.Ordinal);
            }

            using HeapFile salvaged = HeapFile.Open(refused);
            BufferedDurableHeapOptions salvage = Options(HeapFaults.None);
            salvage.SalvageDamagedBlocks = true;
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(salvaged, salvage);
            Assert.False(heap.Recovery.FastReopen, heap.Recovery.ToString());
            Assert.Equal([damagedBatch], heap.Recovery.DamagedSweepLogOffsets);
            salvaged.ForgoCleanShutdown();
        }

        // Opened with salvage at once, on another copy.
        using var reopened = SimulatedPersistenceDomain.FromImage(image, Capacity);

        byte[] crashedAfterSalvage;
        using (HeapFile file = HeapFile.Open(reopened))
        {
            BufferedDurableHeapOptions options = Options(HeapFaults.None);
            options.SalvageDamagedBlocks = true;
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, options);
            Assert.True(heap.Recovery.FastReopen, heap.Recovery.ToString());
            Assert.Equal([damagedBatch], heap.Recovery.DamagedSweepLogOffsets);
            Assert.Empty(heap.Recovery.DamagedBlocks);
            Assert.Equal(0, VictimsBackIn(heap));
            crashedAfterSalvage = reopened.Crash(seed: 1);
        }

        Assert.Equal(0, VictimsIn(crashedAfterSalvage, HeapFaults.None));
        using (HeapFile file = HeapFile.Open(reopened))
        {
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, Options(HeapFaults.None));
            Assert.Empty(heap.Recovery.DamagedSweepLogOffsets);
            Assert.Equal(0, VictimsBackIn(heap));
        }
    }

    /// <summary>
    /// After a crash (no saved state): damage to the last batch of the log, which reads as the end of its batches as a
    /// torn append does, is told from it by the cycles' marks: refused in every crash image, and nothing written;
    /// salvaged, it is reported; the next open finds no damage.
    /// </summary>
    [Fact]
    public void ADamagedLastBatch_AfterACrash_IsRefusedByTheMarks_AndSalvagedReported()
    {
        List<byte[]> images = CrashImagesWithTheirLastBatchDamaged(HeapFaults.None, out long damagedBatch);
        foreach (byte[] image in images)
        {
            AssertRefusedUnchanged(image, "an advance of the heap found them durable up to");
        }

        using var domain = SimulatedPersistenceDomain.FromImage(images[0], Capacity);
        using (HeapFile file = HeapFile.Open(domain))
        {
            BufferedDurableHeapOptions options = Options(HeapFaults.None);
            options.SalvageDamagedBlocks = true;
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, options);
            Assert.Equal([damagedBatch], heap.Recovery.DamagedSweepLogOffsets);
            Assert.True(heap.Recovery.SalvagedThrough > 0, heap.Recovery.ToString());

            // Every key never deleted keeps its value; a deleted one whose free the damage lost may come back (reported).
            VictimsBackIn(heap);
        }

        using (HeapFile file = HeapFile.Open(domain))
        {
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, Options(HeapFaults.None));
            Assert.Empty(heap.Recovery.DamagedSweepLogOffsets);
            file.ForgoCleanShutdown();
        }
    }

    /// <summary>
    /// After a turn, the half the log turned from keeps its entries (until the log turns back to it), and its batches
    /// stopped growing at the turn: the marks hold its lap and end too, so damage to its last batch is refused as well.
    /// </summary>
    [Fact]
    public void ADamagedLastBatchOfTheHalfTheLogTurnedFrom_AfterACrash_IsRefusedByTheMarks()
    {
        List<byte[]> images = CrashImagesWithTheirLastBatchDamaged(HeapFaults.None, out long damagedBatch, afterATurn: true);
        foreach (byte[] image in images)
        {
            AssertRefusedUnchanged(image, "an advance of the heap found them durable up to");
        }

        Assert.Equal([damagedBatch], VictimsSalvaged(images[0]).DamagedSweepLogOffsets);
    }

    /// <summary>
    /// A lap word is durable before a mark names its lap: one that holds a lower lap than a mark of the current epoch
    /// went back (a turn's write of it was lost), and the batches of its half that were appended under the new lap no
    /// longer read. Refused; salvaged, the half is skipped whole and reported.
    /// </summary>
    [Fact]
    public void ALapWordBehindItsMark_AfterACrash_IsRefused_AndSalvagedReported()
    {
        List<byte[]> images = CrashImagesWithTheirLastBatchDamaged(HeapFaults.None, out long lapOffset, afterATurn: true, rewindTheLap: true);
        foreach (byte[] image in images)
        {
            AssertRefusedUnchanged(image, "but an advance of the heap found lap");
        }

        Assert.Equal([lapOffset], VictimsSalvaged(images[0]).DamagedSweepLogOffsets);
    }

    [Fact]
    public void Control_WithoutMarks_ALapWordBehindItsTurn_IsTakenSilently()
    {
        List<byte[]> images = CrashImagesWithTheirLastBatchDamaged(HeapFaults.SweepLogWithoutMarks, out _, afterATurn: true, rewindTheLap: true);
        try
        {
            VictimsIn(images[0], HeapFaults.None);
        }
        catch (HeapFileException e) when (e.Error == HeapFileError.Corrupt)
        {
            Assert.Skip($"inconclusive: the broken control's image was refused all the same: {e.Message}");
        }
    }

    /// <summary>
    /// A power failure at each crash point from the victims' deletes through the sweeps that log their frees and the
    /// advances that mark them (the mark records' write-backs and fences among them; 2 seeds each): no image is refused,
    /// no deleted key comes back once a mark covers the batch of their frees, and the marks reach the log's end in some
    /// images but not in all (so the window
    /// covers the appends and the marks, and the check ran on marked logs).
    /// </summary>
    [Fact]
    public void ACrashAnywhereInTheSweepsAndTheAdvancesThatMarkThem_IsNeverTakenForDamage()
    {
        using var domain = new SimulatedPersistenceDomain(Capacity);
        long maxSegments, dataStart, epoch;
        using (HeapFile file = HeapFile.Create(domain))
        {
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, Options(HeapFaults.None));
            ChurnTwice(heap);
            var map = new PersistentHashMap<long, long>(heap, VictimType);
            for (long k = 0; k < 2 * Victims; k++)
            {
                map.Set(k, k * 3);
            }

            heap.AdvanceVersion(Wait);
            heap.AdvanceVersion(Wait);
            for (long p = domain.CrashPointCount; p < domain.CrashPointCount + 160; p++)
            {
                for (int seed = 0; seed < 2; seed++)
                {
                    domain.ArmCrash(p, (int)(p * 2) + seed);
                }
            }

            for (long k = 0; k < 2 * Victims; k += 2)
            {
                Assert.True(map.Remove(k));
            }

            Reclaim(heap);
            heap.AdvanceVersion(Wait);
            (maxSegments, dataStart, epoch) = (file.MaxSegments, file.DataStart, file.SweepLogEpoch);
            file.ForgoCleanShutdown();
        }

        int marked = 0, backWhereMarked = 0;
        var refused = new List<string>();
        foreach (SimulatedCrash crash in domain.CapturedCrashes)
        {
            bool reachesTheEnd;
            fixed (byte* p = crash.Image)
            {
                SweepLog.Contents log = SweepLog.Read(p, maxSegments, dataStart, epoch, path: null);
                int current = log.Laps[1] > log.Laps[0] ? 1 : 0;
                reachesTheEnd = log.Listed[current].Count > 256 && SweepLog.ReadMarks(p, maxSegments, dataStart, epoch).Exists(m => m.Half == current && m.End == log.Ends[current]);
            }

            try
            {
                // Every key never deleted must be there (VictimsIn asserts it). A crash before the deletes were durable
                // keeps the victims; once a mark covers their frees' batch, the deletes are durable.
                int back = VictimsIn(crash.Image, HeapFaults.None);
                marked += reachesTheEnd ? 1 : 0;
                backWhereMarked += reachesTheEnd ? back : 0;
            }
            catch (HeapFileException e) when (e.Error == HeapFileError.Corrupt)
            {
                refused.Add($"point {crash.Point} seed {crash.Seed}: {e.Message}");
            }
        }

        Assert.True(domain.CapturedCrashes.Count >= 60, $"only {domain.CapturedCrashes.Count} crash images");
        Assert.Empty(refused);
        Assert.Equal(0, backWhereMarked);
        Assert.True(marked > 0 && marked < domain.CapturedCrashes.Count, $"in {marked} of {domain.CapturedCrashes.Count} images a mark reached the log's end (some must, and some must crash before it)");
    }

    [Fact]
    public void Control_WithoutMarks_ADamagedLastBatchAfterACrash_IsTakenSilently_AndDeletedKeysComeBack()
    {
        List<byte[]> images = CrashImagesWithTheirLastBatchDamaged(HeapFaults.SweepLogWithoutMarks, out _);
        int back = 0;
        foreach (byte[] image in images)
        {
            try
            {
                back += VictimsIn(image, HeapFaults.None);
            }
            catch (HeapFileException e) when (e.Error == HeapFileError.Corrupt)
            {
                Assert.Skip($"inconclusive: a damaged image of the broken control was refused all the same: {e.Message}");
            }
        }

        Assert.SkipWhen(back == 0, $"inconclusive: the broken control's {images.Count} damaged images opened silently, but no deleted key came back");
    }

    /// <summary>
    /// A recovery scan empties the log (a new epoch) and begins again at the start of each half, under the same laps: a
    /// crash before the new session's first mark leaves the last session's marks, which say the halves reached further.
    /// They name the old epoch, so they say nothing of the new log: the crash reads as a crash.
    /// </summary>
    [Fact]
    public void TheMarksOfALogARecoveryScanEmptied_SayNothingOfTheNewLog()
    {
        Assert.Equal(0, VictimsAfterAScanAndACrash(HeapFaults.None, out bool marksReachedFurther));
        Assert.True(marksReachedFurther, "the old session's marks did not reach further than the new log: the scenario tests nothing");
    }

    [Fact]
    public void Control_MarksOfAnyEpoch_MakeAPlainCrashAfterARecoveryScanReadAsDamage()
    {
        try
        {
            VictimsAfterAScanAndACrash(HeapFaults.SweepLogMarksOfAnyEpoch, out _);
        }
        catch (HeapFileException e) when (e.Error == HeapFileError.Corrupt && e.Message.Contains("an advance of the heap found them durable up to", StringComparison.Ordinal))
        {
            return;
        }

        Assert.Skip("inconclusive: the broken control's crash image opened");
    }

    /// <summary>
    /// The churn and the victims' deletes (their old copies' frees in the log's last batch), one more advance so that a
    /// cycle marks where the log ends, and 10 crash images of the heap, still open, written with
    /// <paramref name="faults"/>; in each the check word of the log's last batch is flipped. With
    /// <paramref name="afterATurn"/>, another map's keys are replaced until the log has turned once, and the last batch
    /// of the half it turned from is flipped instead.
    /// </summary>
    private static List<byte[]> CrashImagesWithTheirLastBatchDamaged(HeapFaults faults, out long damagedBatch, bool afterATurn = false, bool rewindTheLap = false)
    {
        using var domain = new SimulatedPersistenceDomain(Capacity);
        using HeapFile file = HeapFile.Create(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, Options(faults));
        ChurnTwice(heap);
        WriteThenDelete(heap, new PersistentHashMap<long, long>(heap, VictimType));
        SweepLog sweepLog = heap.Heap.SweepLogForTesting!;
        var churn = new PersistentHashMap<long, Fat>(heap, ChurnType + 1);
        for (int round = 0; afterATurn && sweepLog.Turns == 0 && round < 96; round++)
        {
            for (long k = 0; k < 1024; k++)
            {
                Fat value = default;
                value[0] = k + round;
                churn.Set(k, value);
            }

            Reclaim(heap);
        }

        heap.AdvanceVersion(Wait);
        Assert.Equal(afterATurn ? 1 : 0, sweepLog.Turns);
        var images = new List<byte[]>();
        damagedBatch = -1;
        for (int seed = 0; seed < 10; seed++)
        {
            byte[] image = domain.Crash(seed);
            fixed (byte* p = image)
            {
                SweepLog.Contents log = SweepLog.Read(p, file.MaxSegments, file.DataStart, file.SweepLogEpoch, path: null);
                int damagedHalf = (log.Laps[1] > log.Laps[0] ? 1 : 0) ^ (afterATurn ? 1 : 0);
                List<(int Half, long Lap, long End)> marks = SweepLog.ReadMarks(p, file.MaxSegments, file.DataStart, file.SweepLogEpoch);
                bool marked = marks.Exists(m => m.Half == damagedHalf && m.Lap == log.Laps[damagedHalf] && m.End == log.Ends[damagedHalf]);
                Assert.True(marked == (faults == HeapFaults.None), $"marks {string.Join(", ", marks)}, the log's half {damagedHalf} (lap {log.Laps[damagedHalf]}) ends at {log.Ends[damagedHalf]}");
                if (rewindTheLap)
                {
                    // The half the log turned to gets back the lap it had before the turn (halves' laps go up by 2).
                    int turnedTo = 1 - damagedHalf;
                    long lapOffset = HeapLayout.SweepLogStart(file.MaxSegments) + (turnedTo * ((file.DataStart - HeapLayout.SweepLogStart(file.MaxSegments)) / 2));
                    *(ulong*)(p + lapOffset) = HeapLayout.Seal(log.Laps[turnedTo] - 2, (int)lapOffset);
                    damagedBatch = lapOffset;
                    images.Add(image);
                    continue;
                }

                image[log.Ends[damagedHalf] - sizeof(ulong)] ^= 0x04;
                damagedBatch = SweepLog.Read(p, file.MaxSegments, file.DataStart, file.SweepLogEpoch, path: null).Ends[damagedHalf];
                long entries = (uint)*(ulong*)(p + damagedBatch);
                Assert.True(damagedBatch < log.Ends[damagedHalf] && entries > 0 && log.Listed[damagedHalf].Count > Victims, $"the damaged batch at {damagedBatch} of {entries} entries, {log.Listed[damagedHalf].Count} entries listed");
            }

            images.Add(image);
        }

        file.ForgoCleanShutdown();
        return images;
    }

    /// <summary>Opens <paramref name="image"/> with salvage (every key never deleted must keep its value) and returns its report.</summary>
    private static DurableRecoveryReport VictimsSalvaged(byte[] image)
    {
        using var domain = SimulatedPersistenceDomain.FromImage(image, Capacity);
        using HeapFile file = HeapFile.Open(domain);
        BufferedDurableHeapOptions options = Options(HeapFaults.None);
        options.SalvageDamagedBlocks = true;
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, options);
        VictimsBackIn(heap);
        file.ForgoCleanShutdown();
        return heap.Recovery;
    }

    /// <summary>
    /// The victims deleted and reclaimed, a crash; the image reopened (a recovery scan: the log emptied, a new epoch) and,
    /// with nothing swept, a crash right after; that image reopened with <paramref name="recoveryFaults"/>. Returns how
    /// many deleted keys it holds; <paramref name="marksReachedFurther"/>: whether a mark of the first session's, its
    /// epoch ignored, says a half reached further than the new log.
    /// </summary>
    private static int VictimsAfterAScanAndACrash(HeapFaults recoveryFaults, out bool marksReachedFurther)
    {
        byte[] crashed;
        using (var domain = new SimulatedPersistenceDomain(Capacity))
        using (HeapFile file = HeapFile.Create(domain))
        {
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, Options(HeapFaults.None));
            ChurnTwice(heap);
            WriteThenDelete(heap, new PersistentHashMap<long, long>(heap, VictimType));
            heap.AdvanceVersion(Wait);
            crashed = domain.Crash(seed: 0);
            file.ForgoCleanShutdown();
        }

        using var reopened = SimulatedPersistenceDomain.FromImage(crashed, Capacity);
        byte[] again;
        using (HeapFile file = HeapFile.Open(reopened))
        {
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, Options(HeapFaults.None));
            Assert.False(heap.Recovery.FastReopen);
            again = reopened.Crash(seed: 1);
            fixed (byte* p = again)
            {
                SweepLog.Contents log = SweepLog.Read(p, file.MaxSegments, file.DataStart, file.SweepLogEpoch, path: null);
                marksReachedFurther = SweepLog.ReadMarks(p, file.MaxSegments, file.DataStart, file.SweepLogEpoch, anyEpoch: true)
                    .Exists(m => m.Lap == log.Laps[m.Half] && m.End > log.Ends[m.Half]);
            }

            file.ForgoCleanShutdown();
        }

        return VictimsIn(again, recoveryFaults);
    }

    [Fact]
    public void ARecoveryScan_StartsANewLogEpoch()
    {
        using var domain = new SimulatedPersistenceDomain(Capacity);
        long epoch;
        byte[] crashed;
        using (HeapFile file = HeapFile.Create(domain))
        {
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, Options(HeapFaults.None));
            epoch = file.SweepLogEpoch;
            var map = new PersistentHashMap<long, long>(heap, VictimType);
            WriteThenDelete(heap, map);
            Assert.True(heap.Heap.SweepLogForTesting!.EntriesAppended >= Victims);
            crashed = domain.Crash(seed: 0);
        }

        // A crash, so a recovery scan: it frees what the log listed, then starts a new epoch.
        using var reopened = SimulatedPersistenceDomain.FromImage(crashed, Capacity);
        using HeapFile again = HeapFile.Open(reopened);
        using BufferedDurableHeap heap2 = BufferedDurableHeap.Open(again, Options(HeapFaults.None));
        Assert.Equal(epoch + 1, again.SweepLogEpoch);
        Assert.Equal(Victims, new PersistentHashMap<long, long>(heap2, VictimType).Count);
    }

    [Fact]
    public void ACrashInTheAppendsAfterATurn_NeverReadsAsDamage_NorBringsADeletedKeyBack()
    {
        List<string> refused = ImagesAroundTurns(lapFencedWithNextBatch: false, out int images, out int back);
        Assert.True(images >= 48, $"only {images} crash images");
        Assert.Empty(refused);
        Assert.Equal(0, back);
    }

    [Fact]
    public void Control_ALapWordFencedOnlyWithTheNextBatch_MakesAPlainCrashReadAsDamage()
    {
        List<string> refused = ImagesAroundTurns(lapFencedWithNextBatch: true, out int images, out _);
        Assert.SkipWhen(refused.Count == 0, $"inconclusive: none of {images} crash images of the broken control was refused");
    }

    [Fact]
    public void AHeapCreatedOverAnotherHeapsBytes_NeverTakesThatHeapsLogForItsOwn()
    {
        Assert.Equal(0, LiveKeysLostOverAnOldHeapsLog(reuseTheOldEpoch: false));
    }

    [Fact]
    public void Control_AHeapCreatedOverAnotherHeapsBytesWithItsEpoch_LosesLiveKeys()
    {
        // What a fixed first epoch did (every heap started at the same one): the old heap's batches check out.
        int lost = LiveKeysLostOverAnOldHeapsLog(reuseTheOldEpoch: true);
        Assert.SkipWhen(lost == 0, "inconclusive: the old heap's log freed no live block of the new one");
    }

    /// <summary>
    /// The victims deleted and reclaimed, then another map's keys replaced until the log has turned six times; from the
    /// second turn on, three turns each arm a power failure at the next 6 crash points (6 seeds each: the appends of
    /// the new lap over the half's old batches). Returns the images refused, and how many deleted keys came back.
    /// </summary>
    private static List<string> ImagesAroundTurns(bool lapFencedWithNextBatch, out int images, out int back)
    {
        using var domain = new SimulatedPersistenceDomain(Capacity);
        using (HeapFile file = HeapFile.Create(domain))
        {
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, Options(HeapFaults.None));
            SweepLog log = heap.Heap.SweepLogForTesting!;
            log.LapFencedWithNextBatchForTesting = lapFencedWithNextBatch;
            int armed = 0;
            log.AfterTurnForTesting = () =>
            {
                if (log.Turns >= 2 && armed < 3)
                {
                    armed++;
                    for (long p = domain.CrashPointCount; p < domain.CrashPointCount + 6; p++)
                    {
                        for (int seed = 0; seed < 6; seed++)
                        {
                            domain.ArmCrash(p, (int)(p * 8) + seed);
                        }
                    }
                }
            };

            WriteThenDelete(heap, new PersistentHashMap<long, long>(heap, VictimType));
            var churn = new PersistentHashMap<long, Fat>(heap, ChurnType);
            for (int round = 0; round < 96 && log.Turns < 6; round++)
            {
                for (long k = 0; k < 1024; k++)
                {
                    Fat value = default;
                    value[0] = k + round;
                    churn.Set(k, value);
                }

                Reclaim(heap);
            }

            Assert.True(armed == 3, $"the log turned {log.Turns} times: too few to arm the crashes");
        }

        images = domain.CapturedCrashes.Count;
        back = 0;
        var refused = new List<string>();
        foreach (SimulatedCrash crash in domain.CapturedCrashes)
        {
            try
            {
                back += VictimsIn(crash.Image, HeapFaults.None);
            }
            catch (HeapFileException e) when (e.Error == HeapFileError.Corrupt)
            {
                refused.Add($"point {crash.Point} seed {crash.Seed}: {e.Message}");
            }
        }

        return refused;
    }

    /// <summary>
    /// A heap's victims deleted and reclaimed (its log holding their old copies); a new heap created over the same
    /// bytes (with <paramref name="reuseTheOldEpoch"/>, its log epoch set so that its first open takes the old heap's)
    /// writes the same keys, makes them durable, and crashes. Returns how many of its keys recovery lost.
    /// </summary>
    private static int LiveKeysLostOverAnOldHeapsLog(bool reuseTheOldEpoch)
    {
        using var domain = new SimulatedPersistenceDomain(Capacity);
        long oldEpoch;
        using (HeapFile file = HeapFile.Create(domain))
        {
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, Options(HeapFaults.None));
            WriteThenDelete(heap, new PersistentHashMap<long, long>(heap, VictimType));
            oldEpoch = file.SweepLogEpoch;
        }

        byte[] crashed;
        using (HeapFile file = HeapFile.Create(domain))
        {
            if (reuseTheOldEpoch)
            {
                file.SweepLogEpoch = oldEpoch - 1;
            }

            using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, Options(HeapFaults.None));
            var map = new PersistentHashMap<long, long>(heap, VictimType);
            for (long k = 0; k < 2 * Victims; k++)
            {
                map.Set(k, k * 3);
            }

            heap.AdvanceVersion(Wait);
            heap.AdvanceVersion(Wait);
            crashed = domain.Crash(seed: 1);
        }

        using var image = SimulatedPersistenceDomain.FromImage(crashed, Capacity);
        using HeapFile reopened = HeapFile.Open(image);
        using BufferedDurableHeap recovered = BufferedDurableHeap.Open(reopened, Options(HeapFaults.None));
        var recoveredMap = new PersistentHashMap<long, long>(recovered, VictimType);
        int lost = 0;
        for (long k = 0; k < 2 * Victims; k++)
        {
            lost += recoveredMap.TryGetValue(k, out long value) && value == k * 3 ? 0 : 1;
        }

        return lost;
    }

    /// <summary>
    /// Sixty-four keys written, made durable, deleted, and reclaimed (their old copies freed by sweeps, through the
    /// log; the anti-payloads freed eagerly after that); then, with <paramref name="turnsWanted"/>, another map's keys
    /// replaced until the log has turned that many times (their blocks of another size class, so the victims' blocks
    /// stay free in their pool). Crash images of the heap, still open, are reopened with <paramref name="recoveryFaults"/>.
    /// </summary>
    /// <returns>How many deleted keys came back, over all the images.</returns>
    private static int VictimsBackAfterACrash(HeapFaults recoveryFaults, int turnsWanted, out int images, out SweepLogCounters counters, bool retireWithoutWritingBack = false)
    {
        using var domain = new SimulatedPersistenceDomain(Capacity);
        var crashes = new List<byte[]>();
        using (HeapFile file = HeapFile.Create(domain))
        {
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, Options(HeapFaults.None));
            SweepLog log = heap.Heap.SweepLogForTesting!;
            log.RetireWithoutWritingBackForTesting = retireWithoutWritingBack;
            var victims = new PersistentHashMap<long, long>(heap, VictimType);
            WriteThenDelete(heap, victims);
            if (turnsWanted > 0)
            {
                var churn = new PersistentHashMap<long, Fat>(heap, ChurnType);
                long turnsBefore = log.Turns;
                for (int round = 0; round < 64 && log.Turns - turnsBefore < turnsWanted; round++)
                {
                    for (long k = 0; k < 1024; k++)
                    {
                        Fat value = default;
                        value[0] = k + round;
                        churn.Set(k, value);
                    }

                    Reclaim(heap);
                }
            }

            counters = new SweepLogCounters(log.EntriesAppended, log.Turns, log.HeadersWrittenBack);
            for (int seed = 0; seed < 10; seed++)
            {
                crashes.Add(domain.Crash(seed));
            }
        }

        images = crashes.Count;
        int back = 0;
        foreach (byte[] image in crashes)
        {
            back += VictimsIn(image, recoveryFaults);
        }

        return back;
    }

    /// <summary>
    /// The victims deleted and reclaimed, then a clean shutdown (through a domain that, like a private mapping, makes
    /// durable only what was written back, so the victims' frees are durable in the log only); a fast reopen with
    /// <paramref name="faults"/> and a crash right after it. Returns how many deleted keys came back.
    /// </summary>
    private static int VictimsBackAfterAFastReopenAndACrash(HeapFaults faults, out int images)
    {
        using var domain = new SimulatedPersistenceDomain(Capacity) { WritesBackByCopyForTesting = true };
        using (HeapFile file = HeapFile.Create(domain))
        {
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, Options(HeapFaults.None));
            WriteThenDelete(heap, new PersistentHashMap<long, long>(heap, VictimType));
        }

        // The clean shutdown's durable image (seeds differ in what else of the working image reaches it).
        images = 0;
        int back = 0;
        for (int seed = 0; seed < 10; seed++)
        {
            using var closed = SimulatedPersistenceDomain.FromImage(domain.Crash(seed), Capacity);
            byte[] crashed;
            using (HeapFile file = HeapFile.Open(closed))
            {
                using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, Options(faults));
                Assert.True(heap.Heap.OpenedFromSavedState, $"seed {seed}: the reopen rescanned (the scenario needs the saved state)");
                Assert.True(heap.Heap.SweepLogForTesting!.Listed >= (faults == HeapFaults.None ? Victims : 0), "the reopen did not go on with the log");
                crashed = closed.Crash(seed + 100);
            }

            back += VictimsIn(crashed, HeapFaults.None);
            images++;
        }

        return back;
    }

    /// <summary>
    /// Writes 2 × <see cref="Victims"/> keys, makes them durable, deletes the even ones (the victims) and reclaims: the
    /// odd ones stay live in the same segments, so no segment is emptied and given back (which would void the victims'
    /// old copies with the segment's generation, log or not).
    /// </summary>
    private static void WriteThenDelete(BufferedDurableHeap heap, PersistentHashMap<long, long> map)
    {
        for (long k = 0; k < 2 * Victims; k++)
        {
            map.Set(k, k * 3);
        }

        heap.AdvanceVersion(Wait);
        heap.AdvanceVersion(Wait);
        for (long k = 0; k < 2 * Victims; k += 2)
        {
            Assert.True(map.Remove(k));
        }

        Reclaim(heap);
    }

    /// <summary>Advances until what was retired is reclaimed, and sweeps every parked free.</summary>
    private static void Reclaim(BufferedDurableHeap heap)
    {
        for (int i = 0; i < 4; i++)
        {
            heap.AdvanceVersion(Wait);
        }

        heap.Heap.FlushPendingFrees();
        heap.AdvanceVersion(Wait);
    }

    /// <summary>
    /// Opens a crash image and counts the deleted keys it holds; every key not deleted must be there, with its value.
    /// With <paramref name="expectedLogDamage"/>, the image's log is damaged there: it opens with salvage, which must
    /// report that place and nothing else.
    /// </summary>
    private static int VictimsIn(byte[] image, HeapFaults recoveryFaults, long expectedLogDamage = -1)
    {
        using var domain = SimulatedPersistenceDomain.FromImage(image, Capacity);
        using HeapFile file = HeapFile.Open(domain);
        BufferedDurableHeapOptions options = Options(recoveryFaults);
        options.SalvageDamagedBlocks = expectedLogDamage >= 0;
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, options);
        if (expectedLogDamage >= 0)
        {
            Assert.Equal([expectedLogDamage], heap.Recovery.DamagedSweepLogOffsets);
        }

        // Nothing reopens this copy: a clean shutdown would persist the whole heap into it for nothing.
        file.ForgoCleanShutdown();
        return VictimsBackIn(heap);
    }

    /// <summary>How many deleted victims <paramref name="heap"/> holds; every victim not deleted must be there, with its value.</summary>
    private static int VictimsBackIn(BufferedDurableHeap heap)
    {
        var map = new PersistentHashMap<long, long>(heap, VictimType);
        int back = 0;
        for (long k = 0; k < 2 * Victims; k++)
        {
            bool found = map.TryGetValue(k, out long value);
            if (k % 2 == 0)
            {
                back += found ? 1 : 0;
            }
            else
            {
                Assert.True(found && value == k * 3, $"key {k}, never deleted, is {(found ? $"{value}" : "missing")} after the crash");
            }
        }

        return back;
    }

    [Fact]
    public void ReusesTornOverBlocksFreedInTheLog_AreFreedAtRecovery_NotReportedAsDamage()
    {
        List<string> damaged = DamagedImagesOfReusesOverLoggedFrees(HeapFaults.None, out int images);
        Assert.True(images > 10, $"only {images} crash images");
        Assert.Empty(damaged);
    }

    [Fact]
    public void Control_RecoveryIgnoringTheLog_TakesReusesTornOverLoggedFreesForDamage()
    {
        List<string> damaged = DamagedImagesOfReusesOverLoggedFrees(HeapFaults.IgnoreSweepLogAtRecovery, out int images);
        Assert.SkipWhen(damaged.Count == 0, $"inconclusive: none of {images} crash images of the broken control showed damage");
    }

    /// <summary>
    /// 2,048 keys written, made durable, replaced, and reclaimed (their first copies swept: free in the log only, their
    /// blocks in the pool); then 2,048 new keys, which take those blocks, with a power failure armed at every crash point
    /// of the next advance (4 seeds each: each image lets any subset of the reuses' words reach the file). Reopens each
    /// image with <paramref name="recoveryFaults"/>; returns one line per image refused as damaged.
    /// </summary>
    private static List<string> DamagedImagesOfReusesOverLoggedFrees(HeapFaults recoveryFaults, out int images)
    {
        const int Keys = 2048;
        using var domain = new SimulatedPersistenceDomain(Capacity);
        using (HeapFile file = HeapFile.Create(domain))
        {
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, Options(HeapFaults.None));
            var map = new PersistentHashMap<long, long>(heap, VictimType);
            for (int round = 0; round < 2; round++)
            {
                for (long k = 0; k < Keys; k++)
                {
                    map.Set(k, k + round);
                }

                heap.AdvanceVersion(Wait);
            }

            Reclaim(heap);
            Assert.True(heap.Heap.SweepLogForTesting!.EntriesAppended >= Keys, $"only {heap.Heap.SweepLogForTesting.EntriesAppended} entries logged");
            for (long k = Keys; k < 2 * Keys; k++)
            {
                map.Set(k, k);
            }

            for (long p = domain.CrashPointCount; p < domain.CrashPointCount + 64; p++)
            {
                for (int seed = 0; seed < 4; seed++)
                {
                    domain.ArmCrash(p, (int)(p * 4) + seed);
                }
            }

            heap.AdvanceVersion(Wait);
            heap.AdvanceVersion(Wait);
        }

        images = domain.CapturedCrashes.Count;
        var damaged = new List<string>();
        foreach (SimulatedCrash crash in domain.CapturedCrashes)
        {
            try
            {
                using var image = SimulatedPersistenceDomain.FromImage(crash.Image, Capacity);
                using HeapFile file = HeapFile.Open(image);
                using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, Options(recoveryFaults));

                // Nothing reopens this copy: a clean shutdown would persist the whole heap into it for nothing.
                file.ForgoCleanShutdown();
            }
            catch (HeapFileException e) when (e.Error == HeapFileError.Corrupt)
            {
                damaged.Add($"point {crash.Point} seed {crash.Seed}: {e.Message}");
            }
        }

        return damaged;
    }

    /// <summary>A crash image whose log holds at least two batches in its first half; the log's file offset.</summary>
    private static byte[] ImageWithTwoBatches(out long logStart)
    {
        using var domain = new SimulatedPersistenceDomain(Capacity);
        using HeapFile file = HeapFile.Create(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, Options(HeapFaults.None));
        WriteRounds(heap, 3);
        SweepLog log = heap.Heap.SweepLogForTesting!;
        Assert.True(log.EntriesAppended >= 2 * Victims && log.Turns == 0, $"{log.EntriesAppended} entries, {log.Turns} turns");
        logStart = HeapLayout.SweepLogStart(file.MaxSegments);
        return domain.Crash(seed: 0);
    }

    /// <summary>Sets 256 keys of another map (another size class) twice, reclaiming after each: the log's first batches list their old copies.</summary>
    private static void ChurnTwice(BufferedDurableHeap heap)
    {
        var churn = new PersistentHashMap<long, Fat>(heap, ChurnType);
        for (int round = 0; round < 2; round++)
        {
            for (long k = 0; k < 256; k++)
            {
                Fat value = default;
                value[0] = k + round;
                churn.Set(k, value);
            }

            Reclaim(heap);
        }
    }

    /// <summary>Sets every victim to k + round for each round, reclaiming after each (the old copies' frees go to the log).</summary>
    private static void WriteRounds(BufferedDurableHeap heap, int rounds)
    {
        var map = new PersistentHashMap<long, long>(heap, VictimType);
        for (int round = 0; round < rounds; round++)
        {
            for (long k = 0; k < Victims; k++)
            {
                map.Set(k, k + round);
            }

            Reclaim(heap);
        }
    }

    /// <summary>
    /// Opens <paramref name="image"/>, whose log is damaged at <paramref name="damagedAt"/>, with salvage: the report
    /// lists the damage and the salvage, and every victim holds its last value (an old copy whose free the damage lost
    /// loses to the newer copy of its uid). Then the heap reopens without salvage, the log begun anew. Returns the
    /// salvaging open's report.
    /// </summary>
    private static DurableRecoveryReport AssertSalvagedThroughTheLog(byte[] image, long damagedAt, int rounds)
    {
        using var domain = SimulatedPersistenceDomain.FromImage(image, Capacity);
        DurableRecoveryReport report;
        using (HeapFile file = HeapFile.Open(domain))
        {
            BufferedDurableHeapOptions options = Options(HeapFaults.None);
            options.SalvageDamagedBlocks = true;
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, options);
            report = heap.Recovery;
            Assert.Equal([damagedAt], report.DamagedSweepLogOffsets);
            Assert.Empty(report.DamagedBlocks);
            Assert.True(report.SalvagedThrough > 0, report.ToString());
            AssertVictims(new PersistentHashMap<long, long>(heap, VictimType), rounds - 1);
        }

        using (HeapFile file = HeapFile.Open(domain))
        {
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, Options(HeapFaults.None));
            Assert.Empty(heap.Recovery.DamagedSweepLogOffsets);
            AssertVictims(new PersistentHashMap<long, long>(heap, VictimType), rounds - 1);
        }

        return report;
    }

    private static void AssertVictims(PersistentHashMap<long, long> map, int lastRound)
    {
        Assert.Equal(Victims, map.Count);
        for (long k = 0; k < Victims; k++)
        {
            Assert.True(map.TryGetValue(k, out long value), $"key {k} lost");
            Assert.Equal(k + lastRound, value);
        }
    }

    private static void AssertRefusedUnchanged(byte[] image, string what)
    {
        using var domain = SimulatedPersistenceDomain.FromImage(image, Capacity);
        using (HeapFile file = HeapFile.Open(domain))
        {
            HeapFileException e = Assert.Throws<HeapFileException>(() => BufferedDurableHeap.Open(file, Options(HeapFaults.None)).Dispose());
            Assert.Equal(HeapFileError.Corrupt, e.Error);
            Assert.Contains(what, e.Message, StringComparison.Ordinal);
        }

        byte[] after = domain.Crash(seed: 0);
        long dataStart = BitConverter.ToInt64(image, HeapLayout.DataStartOffset);
        Assert.True(image.AsSpan((int)HeapLayout.SuperblockSize, (int)dataStart - HeapLayout.SuperblockSize).SequenceEqual(after.AsSpan((int)HeapLayout.SuperblockSize, (int)dataStart - HeapLayout.SuperblockSize)), "a refused recovery changed the table or the log");
        Assert.True(image.AsSpan((int)dataStart).SequenceEqual(after.AsSpan((int)dataStart)), "a refused recovery changed a block");
    }

    private static BufferedDurableHeapOptions Options(HeapFaults faults) =>
        new() { AdvancePeriod = Timeout.InfiniteTimeSpan, HeapFaults = faults };

    private readonly record struct SweepLogCounters(long Entries, long Turns, long HeadersWrittenBack);
}
