using System;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using System.Threading;
using System.Threading.Tasks;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// The two ways the mapped-file domain reaches the file (<see cref="MappedFileWriteBack"/>): a private mapping written
/// back with pwrite and fdatasync, and a shared one synchronized with msync. Each test reads the file itself, under the
/// mapping, so a write-back that copied the wrong bytes, or none, fails it.
/// </summary>
public sealed class MappedFileWriteBackTests : IDisposable
{
    private const long Page = 4096;
    private const long QuarantineOffset = 8 * Page;
    private readonly TempDirectory _directory = new();

    private readonly List<FileStream> _streams = new();

    public void Dispose()
    {
        foreach (FileStream stream in _streams)
        {
            stream.Dispose();
        }

        _directory.Dispose();
    }

    /// <summary>A new 1 MiB file in the test directory, mapped (its stream disposed with the test class).</summary>
    private MappedFilePersistenceDomain MapOneMiB(string name, bool privateMapping)
    {
        var stream = new FileStream(_directory.File(name), FileMode.CreateNew, FileAccess.ReadWrite);
        _streams.Add(stream);
        stream.SetLength(1L << 20);
        return MappedFilePersistenceDomain.Map(stream, 1L << 20, 1L << 20, privateMapping);
    }

    [Fact]
    public void PrivateMapping_AWrittenBackRangeReachesTheFile_AStoreNotWrittenBackDoesNot()
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "private mappings are Linux only");
        using HeapFile file = HeapFile.Create(_directory.File("private.heap"), Options(MappedFileWriteBack.PrivateMapping));
        var domain = (MappedFilePersistenceDomain)file.Domain;
        Assert.True(domain.IsPrivateMapping);
        (long written, long notWritten) = Fill(domain);

        domain.WriteBack(written, 100);
        domain.Fence();

        Assert.Equal(Pattern(written, 100), FileBytes(domain, written, 100));

        // The control that shows the file is read, not the mapping: the store that was never written back is not there.
        Assert.Equal(new byte[100], FileBytes(domain, notWritten, 100));
    }

    [Fact]
    public void SharedMapping_AStoreIsInThePageCacheAtOnce_AndMsyncIsWhatWritesBack()
    {
        using HeapFile file = HeapFile.Create(_directory.File("shared.heap"), Options(MappedFileWriteBack.SharedMapping));
        var domain = (MappedFilePersistenceDomain)file.Domain;
        Assert.False(domain.IsPrivateMapping);
        Assert.Equal(MappedFileWriteBack.SharedMapping, file.MappedFileWriteBack);
        (long written, long notWritten) = Fill(domain);
        long calls = domain.WriteBackCalls;

        domain.WriteBack(written, 100);
        domain.Fence();

        Assert.Equal(calls + 1, domain.WriteBackCalls);
        Assert.Equal(Pattern(written, 100), FileBytes(domain, written, 100));

        // A shared mapping is the page cache: what a private one keeps to itself is visible here without a write-back.
        Assert.Equal(Pattern(notWritten, 100), FileBytes(domain, notWritten, 100));
    }

    [Theory]
    [InlineData(MappedFileWriteBack.PrivateMapping)]
    [InlineData(MappedFileWriteBack.SharedMapping)]
    public void BufferedHeap_EveryWriteSurvivesACleanReopen(MappedFileWriteBack writeBack)
    {
        Assert.SkipWhen(writeBack == MappedFileWriteBack.PrivateMapping && !OperatingSystem.IsLinux(), "private mappings are Linux only");
        string path = _directory.File("map.heap");
        HeapFileOptions options = Options(writeBack);
        System.Collections.Generic.Dictionary<long, long> expected;
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, options, new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromMilliseconds(1) }))
        {
            Assert.Equal(writeBack == MappedFileWriteBack.PrivateMapping, ((MappedFilePersistenceDomain)heap.Heap.File.Domain).IsPrivateMapping);
            expected = SetAndRemoveAtRandom(new PersistentHashMap<long, long>(heap, 1), seed: 7);
        }

        using BufferedDurableHeap reopened = BufferedDurableHeap.Open(path, options);
        Assert.True(reopened.Heap.File.WasCleanShutdown);
        var recovered = new PersistentHashMap<long, long>(reopened, 1);
        Assert.Equal(expected.OrderBy(e => e.Key), recovered.ToDictionary().OrderBy(e => e.Key));
    }

    [Theory]
    [InlineData(MappedFileWriteBack.PrivateMapping)]
    [InlineData(MappedFileWriteBack.SharedMapping)]
    public void BufferedHeap_AfterSync_TheFileAloneRecoversEverySyncedWrite(MappedFileWriteBack writeBack)
    {
        Assert.SkipWhen(writeBack == MappedFileWriteBack.PrivateMapping && !OperatingSystem.IsLinux(), "private mappings are Linux only");
        // No background advancer: Sync runs the cycles, and nothing runs while the file is read below. (With one, a later
        // cycle could reclaim between the reads of two pages — an old copy read before its free, the anti-payload that
        // cancels it after its own — and the image would be no state the file ever crashed in.)
        using BufferedDurableHeap heap = BufferedDurableHeap.Create(_directory.File("sync.heap"), Options(writeBack), new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
        System.Collections.Generic.Dictionary<long, long> expected = SetAndRemoveAtRandom(new PersistentHashMap<long, long>(heap, 1), seed: 11);

        heap.Sync();

        // The file as the process leaves it if it dies now (no Dispose, no further write-back): what the page cache holds.
        using SimulatedPersistenceDomain crashed = PageCacheImage(heap);
        using BufferedDurableHeap recovered = BufferedDurableHeap.Open(HeapFile.Open(crashed), new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
        Assert.False(recovered.Recovery.WasCleanShutdown);
        Assert.Equal(expected.OrderBy(e => e.Key), new PersistentHashMap<long, long>(recovered, 1).ToDictionary().OrderBy(e => e.Key));
    }

    [Fact]
    public void PrivateMapping_RangesOnOnePageAreOneWriteBack_RangesOnOtherPagesAreNotBridged()
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "private mappings are Linux only");
        using HeapFile file = HeapFile.Create(_directory.File("runs.heap"), Options(MappedFileWriteBack.PrivateMapping));
        var domain = (MappedFilePersistenceDomain)file.Domain;
        (long start, _) = Fill(domain);
        long calls = domain.WriteBackCalls;

        // Two ranges on one page: one pwrite. The next range two pages on: a pwrite of its own (bridging would copy,
        // and dirty, the clean page between them).
        var runs = new WriteBackRuns(domain);
        runs.Add(start, 32);
        runs.Add(start + 1000, 32);
        runs.Add(start + (3 * Page), 32);
        runs.Flush();
        domain.Fence();

        Assert.Equal(calls + 2, domain.WriteBackCalls);
        Assert.Equal(Pattern(start, 1032), FileBytes(domain, start, 1032));
        Assert.Equal(Pattern(start + (3 * Page), 32), FileBytes(domain, start + (3 * Page), 32));
        Assert.Equal(new byte[100], FileBytes(domain, start + Page + 100, 100));
    }

    [Fact]
    public void PrivateMapping_OneWordPerBlockOverThreePages_IsOneWriteBack()
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "private mappings are Linux only");
        using HeapFile file = HeapFile.Create(_directory.File("words.heap"), Options(MappedFileWriteBack.PrivateMapping));
        var domain = (MappedFilePersistenceDomain)file.Domain;
        (long start, _) = Fill(domain);
        long calls = domain.WriteBackCalls;

        // As a version's seals: the commit word of each 64-byte block. A page's last word and the next page's first
        // are 56 bytes apart across the page boundary, and the run takes them in: no page between them is clean.
        const int Blocks = 3 * (int)Page / 64;
        var runs = new WriteBackRuns(domain);
        for (int k = 0; k < Blocks; k++)
        {
            runs.Add(start + (64 * k) + 24, sizeof(ulong));
        }

        // Two pages past the run's last page: a call of its own.
        runs.Add(start + (5 * Page), 8);
        runs.Flush();
        domain.Fence();

        Assert.Equal(calls + 2, domain.WriteBackCalls);
        int length = (64 * (Blocks - 1)) + sizeof(ulong);
        Assert.Equal(Pattern(start + 24, length), FileBytes(domain, start + 24, length));
        Assert.Equal(new byte[100], FileBytes(domain, start + (3 * Page) + 100, 100));
    }

    [Fact]
    public void PrivateMapping_FlushWholePages_WritesBackTheRunUpToItsLastPage_WhichTheNextRangeTakesWithIt()
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "private mappings are Linux only");
        using HeapFile file = HeapFile.Create(_directory.File("whole-pages.heap"), Options(MappedFileWriteBack.PrivateMapping));
        var domain = (MappedFilePersistenceDomain)file.Domain;
        (long start, _) = Fill(domain);
        var copied = new List<(long Offset, long Length)>();
        domain.StartWriteOutForTesting = (offset, length) => copied.Add((offset, length));

        // A run over two and a half pages: its two whole pages are copied now, its last page is kept.
        var runs = new WriteBackRuns(domain);
        runs.Add(start, 1000);
        runs.Add(start + 1000, (2 * Page) + 1000);
        runs.FlushWholePages();
        domain.Fence();
        Assert.Equal([(start, 2 * Page)], copied);
        Assert.Equal(Pattern(start, 2 * (int)Page), FileBytes(domain, start, 2 * (int)Page));
        Assert.Equal(new byte[100], FileBytes(domain, start + (2 * Page), 100));

        // The next range on that page joins the kept part: the page is copied once, with both.
        runs.Add(start + (2 * Page) + 2000, 500);
        runs.Flush();
        domain.Fence();
        Assert.Equal([(start, 2 * Page), (start + (2 * Page), 2500)], copied);
        Assert.Equal(Pattern(start, (2 * (int)Page) + 2500), FileBytes(domain, start, (2 * (int)Page) + 2500));

        // A run that ends on a page boundary is copied whole, and nothing is left to flush.
        runs.Add(start + (4 * Page), Page);
        runs.FlushWholePages();
        runs.Flush();
        Assert.Equal((start + (4 * Page), Page), copied[^1]);
        Assert.Equal(3, copied.Count);
    }

    [Fact]
    public void PrivateMapping_AWriteBackStartsTheWriteOutOfTheRangeItCopied()
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "private mappings are Linux only");
        using var stream = new FileStream(_directory.File("write-out.heap"), FileMode.CreateNew, FileAccess.ReadWrite, FileShare.None);
        using MappedFilePersistenceDomain domain = MapWithPattern(stream);
        var started = new List<(long Offset, long Length)>();
        domain.StartWriteOutForTesting = (offset, length) => started.Add((offset, length));
        long before = domain.WriteOutsStarted;

        domain.WriteBack(QuarantineOffset, 100);

        // The kernel took the request (sync_file_range returned 0): a wrong entry point or argument would not count.
        Assert.Equal([(QuarantineOffset, 100L)], started);
        Assert.Equal(before + 1, domain.WriteOutsStarted);

        // Only a hint: the fence is what makes the range durable; and a copy that failed starts nothing.
        domain.Fence();
        Assert.Equal(Pattern(QuarantineOffset, 100), FileBytes(stream, QuarantineOffset, 100));
        domain.FailFileCallsForTesting = 5;
        Assert.ThrowsAny<IOException>(() => domain.WriteBack(QuarantineOffset, 100));
        Assert.Single(started);
    }

    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void PrivateMapping_AWriteOutThatFails_FailsTheWriteBack_OneNotAvailableIsNoLongerAskedFor(bool control)
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "private mappings are Linux only");
        using var stream = new FileStream(_directory.File(control ? "write-out-failed-control.heap" : "write-out-failed.heap"), FileMode.CreateNew, FileAccess.ReadWrite, FileShare.None);
        using MappedFilePersistenceDomain domain = MapWithPattern(stream);
        int calls = 0;

        // Not available (a sandbox's ENOSYS): the write-back goes on, the fence writes the range, and the domain stops asking.
        domain.SyncFileRangeCallForTesting = () => Fail(ref calls, 38);
        domain.WriteBack(QuarantineOffset, 100);
        domain.WriteBack(QuarantineOffset, 100);
        domain.Fence();
        Assert.Equal(1, calls);
        Assert.Equal(Pattern(QuarantineOffset, 100), FileBytes(stream, QuarantineOffset, 100));

        // A write-out that failed (EIO) on a domain that still asks: the write-back fails, and so does every later one and
        // every fence (fail-stop), since the fence's fdatasync may never see that error. The control ignores the failure
        // (as the first version of this code did): the write-back returns as if the range were on its way to the disk.
        using var stream2 = new FileStream(_directory.File(control ? "write-out-eio-control.heap" : "write-out-eio.heap"), FileMode.CreateNew, FileAccess.ReadWrite, FileShare.None);
        using MappedFilePersistenceDomain failing = MapWithPattern(stream2);
        failing.SyncFileRangeCallForTesting = () => Fail(ref calls, 5);
        failing.IgnoreFileCallErrorsForTesting = control;
        if (control)
        {
            failing.WriteBack(QuarantineOffset, 100);
            failing.Fence();
            Assert.Equal(2, calls);
            return;
        }

        IOException failed = Assert.ThrowsAny<IOException>(() => failing.WriteBack(QuarantineOffset, 100));
        Assert.Contains("sync_file_range", failed.Message);
        Assert.Equal(2, calls);
        Assert.ThrowsAny<IOException>(() => failing.Fence());
        Assert.ThrowsAny<IOException>(() => failing.WriteBack(QuarantineOffset, 100));

        static int Fail(ref int calls, int errno)
        {
            calls++;
            System.Runtime.InteropServices.Marshal.SetLastPInvokeError(errno);
            return -1;
        }
    }

    [Fact]
    public void BufferedHeap_AVersionOfThreeChunks_IsCopiedChunkByChunk_AndIsWholeInTheFileAfterSync()
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "private mappings are Linux only");
        using BufferedDurableHeap heap = BufferedDurableHeap.Create(_directory.File("chunks.heap"), Options(MappedFileWriteBack.PrivateMapping), new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });

        // One version of two and a half chunks of 48-byte blocks, one class: contiguous, so copied in one piece it would
        // be one write-back (its segments' 16-byte tails share pages with their neighbours).
        int count = (2 * BufferedDurableHeap.WriteBackChunk) + (BufferedDurableHeap.WriteBackChunk / 2);
        var blocks = new List<PayloadRef>(count);
        for (int i = 0; i < count; i++)
        {
            using DurableOperation operation = heap.BeginOperation();
            PayloadRef block = operation.Allocate(sizeof(long), typeId: 1);
            BitConverter.TryWriteBytes(operation.GetPayload(block), (i * 3L) + 1);
            blocks.Add(block);
        }

        var domain = (MappedFilePersistenceDomain)heap.Heap.File.Domain;
        var copied = new List<(long Offset, long Length)>();
        domain.StartWriteOutForTesting = (offset, length) => copied.Add((offset, length));
        heap.Sync();
        domain.StartWriteOutForTesting = null;

        // Sealed and copied chunk by chunk: a copy of each chunk's whole pages, and one of the last page kept, inside the
        // version's blocks (the cycle's other write-backs, the superblock's words and the segments it formats, lie
        // outside them). In one piece: the whole pages and the last page, two.
        long first = blocks.Min(b => b.Offset);
        long last = blocks.Max(b => b.Offset) + SizeClasses.BlockSizes[0];
        int inside = copied.Count(r => r.Offset >= (first & ~(Page - 1)) && r.Offset + r.Length <= last + Page);
        Assert.True(inside >= 3, $"{inside} copies inside the version's blocks: {string.Join(", ", copied)}");

        // The file alone, as a crash leaves it now: every block, sealed (recovery checks each block's seal).
        using SimulatedPersistenceDomain crashed = PageCacheImage(heap);
        using BufferedDurableHeap recovered = BufferedDurableHeap.Open(HeapFile.Open(crashed), new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
        Assert.Empty(recovered.Recovery.DamagedBlocks);
        Assert.Equal(0, recovered.Recovery.SealedAtRecovery);
        Dictionary<long, long> values = recovered.TakeRecoveredPayloads(1).ToDictionary(p => p.Block.Offset, p => BitConverter.ToInt64(recovered.Heap.GetPayload(p.Block)));
        Assert.Equal(count, values.Count);
        for (int i = 0; i < count; i++)
        {
            Assert.Equal((i * 3L) + 1, values[blocks[i].Offset]);
        }
    }

    [Theory]
    [InlineData(MappedFileWriteBack.PrivateMapping)]
    [InlineData(MappedFileWriteBack.SharedMapping)]
    public void BufferedHeap_AVersionOfThreeChunksOfBlocksOfManySizes_IsWholeInTheFileAfterSync(MappedFileWriteBack writeBack)
    {
        Assert.SkipWhen(writeBack == MappedFileWriteBack.PrivateMapping && !OperatingSystem.IsLinux(), "private mappings are Linux only");

        // Values of 1 to 700 bytes: blocks of many classes, some over two pages, and chunks that end inside a page (the
        // page kept for the next chunk). (From a review of the chunked write-back.)
        using BufferedDurableHeap heap = BufferedDurableHeap.Create(_directory.File("chunks-mixed.heap"), new HeapFileOptions { Size = 16L << 20, Domain = PersistenceDomainKind.MappedFile, MappedFileWriteBack = writeBack }, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
        var map = new PersistentByteMap<long>(heap, 1);
        int keys = (2 * BufferedDurableHeap.WriteBackChunk) + 1234;
        for (long key = 0; key < keys; key++)
        {
            map.Set(key, MixedValue(key));
        }

        heap.Sync();

        using SimulatedPersistenceDomain crashed = PageCacheImage(heap);
        using BufferedDurableHeap recovered = BufferedDurableHeap.Open(HeapFile.Open(crashed), new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
        Assert.Empty(recovered.Recovery.DamagedBlocks);
        Assert.Equal(0, recovered.Recovery.SealedAtRecovery);
        var back = new PersistentByteMap<long>(recovered, 1);
        Assert.Equal(keys, back.Count);
        for (long key = 0; key < keys; key++)
        {
            Assert.Equal(MixedValue(key), back.Get(key));
        }
    }

    private static byte[] MixedValue(long key)
    {
        byte[] value = new byte[(int)((key * 37) % 700) + 1];
        for (int i = 0; i < value.Length; i++)
        {
            value[i] = (byte)(key + (i * 7));
        }

        return value;
    }

    [Fact]
    public void SharedMapping_RangesAFewPagesApartAreOneMsync()
    {
        using HeapFile file = HeapFile.Create(_directory.File("runs-shared.heap"), Options(MappedFileWriteBack.SharedMapping));
        var domain = (MappedFilePersistenceDomain)file.Domain;
        (long start, _) = Fill(domain);
        long calls = domain.WriteBackCalls;

        var runs = new WriteBackRuns(domain);
        runs.Add(start, 32);
        runs.Add(start + (3 * Page), 32);
        runs.Flush();

        Assert.Equal(calls + 1, domain.WriteBackCalls);
    }

    [Fact]
    public void Auto_PrivateForAHeapThatFitsInAQuarterOfMemory_SharedForOneThatDoesNot()
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "private mappings are Linux only");
        long available = GC.GetGCMemoryInfo().TotalAvailableMemoryBytes;
        Assert.True(MappedFilePersistenceDomain.UsesPrivateMapping(MappedFileWriteBack.Auto, available / 4));
        Assert.False(MappedFilePersistenceDomain.UsesPrivateMapping(MappedFileWriteBack.Auto, (available / 4) + 1));
        Assert.False(MappedFilePersistenceDomain.UsesPrivateMapping(MappedFileWriteBack.SharedMapping, 1L << 20));
        Assert.True(MappedFilePersistenceDomain.UsesPrivateMapping(MappedFileWriteBack.PrivateMapping, long.MaxValue));

        // The default write-back: a small heap (a 32 MiB maximum size) on an ordinary file.
        using HeapFile file = HeapFile.Create(_directory.File("auto.heap"), new HeapFileOptions { Size = 2L << 20, Domain = PersistenceDomainKind.MappedFile });
        Assert.True(((MappedFilePersistenceDomain)file.Domain).IsPrivateMapping);
        Assert.Equal(MappedFileWriteBack.PrivateMapping, file.MappedFileWriteBack);
    }

    [Fact]
    public void AutoDomain_LibpmemOnAnOrdinaryFile_UsesTheMappedFileDomain()
    {
        // The test process does not force libpmem to treat files as pmem (TestProgram runs such cases in a child).
        Assert.SkipWhen(Environment.GetEnvironmentVariable("PMEM_IS_PMEM_FORCE") == "1", "libpmem is forced to treat every file as persistent memory");
        string path = _directory.File("auto-domain.heap");
        using (HeapFile created = HeapFile.Create(path, new HeapFileOptions { Size = 2L << 20 }))
        {
            Assert.Equal(PersistenceDomainKind.MappedFile, created.Domain.Kind);
        }

        using (HeapFile opened = HeapFile.Open(path))
        {
            Assert.Equal(PersistenceDomainKind.MappedFile, opened.Domain.Kind);
        }

        // Asked for by name, libpmem is still used (its msync path on an ordinary file).
        using HeapFile pmem = HeapFile.Open(path, new HeapFileOptions { Domain = PersistenceDomainKind.Pmem });
        Assert.Equal(PersistenceDomainKind.Pmem, pmem.Domain.Kind);
    }

    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void PrivateMapping_QuarantineWhileAWriteBackCopies_WaitsForIt(bool control)
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "private mappings are Linux only");
        using var stream = new FileStream(_directory.File(control ? "quarantine-control.heap" : "quarantine.heap"), FileMode.CreateNew, FileAccess.ReadWrite, FileShare.None);
        MappedFilePersistenceDomain domain = MapWithPattern(stream);
        const long offset = QuarantineOffset;
        using var held = new HeldCall();
        domain.InsideFileCallForTesting = held.Hold;
        domain.SkipFileCallWaitForTesting = control;

        // A straggler is inside its write-back (counted in, about to copy) when the heap is quarantined. The real
        // quarantine waits for it; the control replaces the mapping with zeros under it at once.
        bool quarantinedFirst = QuarantineDuringHeldCall(domain, held, () => domain.WriteBack(offset, 100));
        byte[] inFile = FileBytes(stream, offset, 100);
        if (control)
        {
            Assert.SkipUnless(quarantinedFirst, "inconclusive: the control's quarantine did not finish within 1 s, so the straggler copied before it");
            Assert.Equal(new byte[100], inFile);
            return;
        }

        Assert.False(quarantinedFirst, "the quarantine finished while a write-back was still copying from the mapping");
        Assert.Equal(Pattern(offset, 100), inFile);

        // After the quarantine, a write-back throws instead of copying the anonymous memory into the file.
        Assert.Throws<ObjectDisposedException>(() => domain.WriteBack(offset, 100));
    }

    /// <summary>
    /// Growing extends the file with posix_fallocate on the domain's descriptor: a quarantine while one is in flight must
    /// wait for it before it releases the descriptor (which could otherwise be closed and reused by another file, which
    /// the straggler would then extend). Control: a quarantine that does not wait finishes first.
    /// </summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void QuarantineWhileTheFileGrows_WaitsForTheExtension(bool control)
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "posix_fallocate is the growth path on Linux");
        using var stream = new FileStream(_directory.File($"grow-quarantine-{control}.heap"), FileMode.CreateNew, FileAccess.ReadWrite, FileShare.None);
        stream.SetLength(1L << 20);
        MappedFilePersistenceDomain domain = MappedFilePersistenceDomain.Map(stream, 1L << 20, 4L << 20, privateMapping: true);
        using var held = new HeldCall();
        domain.InsideFileCallForTesting = held.Hold;
        domain.SkipFileCallWaitForTesting = control;

        // A growth is inside its posix_fallocate (counted in, about to extend the file) when the heap is quarantined.
        bool grew = false;
        bool quarantinedFirst = QuarantineDuringHeldCall(domain, held, () => grew = domain.TryGrow(2L << 20));
        if (control)
        {
            Assert.SkipUnless(quarantinedFirst, "inconclusive: the control's quarantine did not finish within 1 s");
            return;
        }

        Assert.False(quarantinedFirst, "the quarantine released the descriptor while a posix_fallocate on it was in flight");
        Assert.True(grew);
        Assert.Equal(2L << 20, new FileInfo(stream.Name).Length);

        // After the quarantine, a growth throws instead of reaching the descriptor.
        Assert.Throws<ObjectDisposedException>(() => domain.TryGrow(3L << 20));
    }

    [Fact]
    public void PrivateMapping_AQuarantineThatGivesUpWaiting_LeavesTheMappingToTheStuckCopy()
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "private mappings are Linux only");
        using var stream = new FileStream(_directory.File("quarantine-stuck.heap"), FileMode.CreateNew, FileAccess.ReadWrite, FileShare.None);
        MappedFilePersistenceDomain domain = MapWithPattern(stream);
        const long offset = QuarantineOffset;
        domain.FileCallWait = TimeSpan.FromMilliseconds(50);
        using var held = new HeldCall();
        domain.InsideFileCallForTesting = held.Hold;

        // A copy stuck in the kernel (here: held) outlasts the quarantine's wait. The quarantine returns without
        // replacing the mapping or releasing the descriptor, so the copy, when it goes on, still copies the data.
        var straggler = new Thread(() => domain.WriteBack(offset, 100));
        straggler.Start();
        held.WaitUntilHeld();
        domain.Quarantine();
        Assert.True(domain.IsDisposed);
        held.Release();
        Assert.True(straggler.Join(TimeSpan.FromSeconds(30)), "the straggler did not finish");
        byte[] inFile = FileBytes(stream, offset, 100);
        Assert.Equal(Pattern(offset, 100), inFile);
    }

    /// <summary>
    /// A review's finding: a Dispose whose public write-back is stuck in the kernel (a failing disk; held here) gives up
    /// after <see cref="MappedFilePersistenceDomain.FileCallWait"/> and leaves the mapping and the descriptor to the stuck
    /// call (Dispose(bool)'s documented choice). The public-call drain first added in front of it waited without a bound,
    /// so the Dispose (and a heap file's Dispose that owns the domain, and a quarantine's release run by a drain) hung for
    /// as long as the call was stuck.
    /// </summary>
    [Fact]
    public void PrivateMapping_ADisposeWhileAPublicWriteBackIsStuck_GivesUpAfterTheFileCallWait()
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "private mappings are Linux only");
        using var stream = new FileStream(_directory.File("dispose-stuck.heap"), FileMode.CreateNew, FileAccess.ReadWrite, FileShare.None);
        MappedFilePersistenceDomain domain = MapWithPattern(stream);
        domain.FileCallWait = TimeSpan.FromMilliseconds(50);
        using var held = new HeldCall();
        domain.InsideFileCallForTesting = held.Hold;
        var straggler = new Thread(() => domain.WriteBack(QuarantineOffset, 100));
        straggler.Start();
        held.WaitUntilHeld();
        var dispose = new Thread(domain.Dispose);
        dispose.Start();
        bool returned = dispose.Join(TimeSpan.FromSeconds(5));
        held.Release();
        Assert.True(straggler.Join(TimeSpan.FromSeconds(30)), "the straggler did not finish");
        Assert.True(dispose.Join(TimeSpan.FromSeconds(30)), "the Dispose never returned");
        Assert.True(returned, "Dispose waited for a stuck public write-back past FileCallWait (50 ms): 5 s and counting");
    }

    [Fact]
    public void PrivateMapping_AWriteBackCheckedBeforeAQuarantine_ThrowsInsteadOfCopyingZeros()
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "private mappings are Linux only");
        using var stream = new FileStream(_directory.File("quarantine-before.heap"), FileMode.CreateNew, FileAccess.ReadWrite, FileShare.None);
        MappedFilePersistenceDomain domain = MapWithPattern(stream);
        const long offset = QuarantineOffset;
        domain.WriteBack(offset, 100);
        domain.Fence();
        using var held = new HeldCall();
        domain.BeforeFileCallForTesting = held.Hold;

        // A straggler passed the range check (the domain was live) and has not reached the file yet when the heap is
        // quarantined: nothing is in flight, so the quarantine replaces the mapping with zeros at once.
        Exception? straggled = null;
        var straggler = new Thread(() => straggled = Record.Exception(() => domain.WriteBack(offset, 100)));
        straggler.Start();
        held.WaitUntilHeld();
        domain.Quarantine();
        held.Release();
        Assert.True(straggler.Join(TimeSpan.FromSeconds(30)), "the straggler did not finish");

        // It must see the quarantine and throw: copying now would write the anonymous memory's zeros over the data.
        Assert.IsType<ObjectDisposedException>(straggled);
        byte[] inFile = FileBytes(stream, offset, 100);
        Assert.Equal(Pattern(offset, 100), inFile);
    }

    [Fact]
    public void PrivateMapping_AReplaceUndoneOnAFullHeap_FreesItsCopyInTheFile()
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "private mappings are Linux only");
        string path = _directory.File("undo.heap");
        using BufferedDurableHeap heap = BufferedDurableHeap.Create(path, new HeapFileOptions { Size = 1L << 20, MaxSize = 1L << 20, Domain = PersistenceDomainKind.MappedFile, MappedFileWriteBack = MappedFileWriteBack.PrivateMapping }, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
        var domain = (MappedFilePersistenceDomain)heap.Heap.File.Domain;
        long copy = -1;

        // As a page run of another write-back does when it covers the copy's page: its allocated header reaches the file.
        heap.AfterReplaceCopiedForTesting = offset =>
        {
            copy = offset;
            domain.WriteBack(offset, HeapLayout.HeaderSize);
            domain.Fence();
        };
        PayloadRef original;
        using (DurableOperation op = heap.BeginOperation())
        {
            // One 100-byte payload, then header-only blocks until the heap is full: the 100-byte class keeps free
            // blocks in its segment, the anti-payload's class has none, and no segment is left but the delete reserve,
            // which deletes of the header-only blocks then take (their anti-payloads) until one finds no block.
            original = op.Allocate(100, 7);
            var fillers = new List<PayloadRef>();
            bool full = false;
            for (int i = 0; i < 1_000_000 && !full; i++)
            {
                try
                {
                    fillers.Add(op.Allocate(0, 8));
                }
                catch (InsufficientMemoryException)
                {
                    full = true;
                }
            }

            Assert.True(full, "the heap never filled up");
            bool reserveTaken = false;
            for (int i = 0; i < fillers.Count && !reserveTaken; i++)
            {
                try
                {
                    op.Delete(fillers[i]);
                }
                catch (InsufficientMemoryException)
                {
                    reserveTaken = true;
                }
            }

            Assert.True(reserveTaken, "the deletes never took the whole delete reserve");

            // A same-version resize: the copy is allocated, then the anti-payload for the original cannot be.
            bool undone = false;
            try
            {
                op.Replace(original, 110);
            }
            catch (InsufficientMemoryException)
            {
                undone = true;
            }

            Assert.True(undone, "the replace did not run out of room for the anti-payload");
        }

        Assert.True(copy >= 0, "the replace never made its copy");
        heap.Sync();

        // The file alone, as a crash would leave it: the copy must be free there, not a second live payload.
        using SimulatedPersistenceDomain crashed = PageCacheImage(heap);
        using BufferedDurableHeap recovered = BufferedDurableHeap.Open(HeapFile.Open(crashed), new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
        IReadOnlyList<RecoveredPayload> live = recovered.TakeRecoveredPayloads(7);
        Assert.Equal(new[] { original.Offset }, live.Select(p => p.Block.Offset));
    }

    /// <summary>
    /// A failing disk: with <paramref name="payloadsOnly"/> false every pwrite and fdatasync fails, so the version
    /// transition's own persist (the epoch clock) fails first; with it true only the payloads' write-back fails, after
    /// the transition. Either way Sync throws, and the domain stays failed even once the disk answers again (the
    /// kernel marks failed pages clean and reports an error once, so nothing written back after it can be trusted):
    /// nothing more becomes durable, Dispose reports it and leaves the shutdown unclean, and a reopen recovers up to the
    /// frontier.
    /// </summary>
    [Theory]
    [InlineData(false, false)]
    [InlineData(true, false)]
    [InlineData(false, true)]
    public void PrivateMapping_WriteBackFails_SyncThrowsAndNothingUnwrittenIsClaimedDurable(bool payloadsOnly, bool control)
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "private mappings are Linux only");
        const int Eio = 5;
        string path = _directory.File($"eio-{payloadsOnly}-{control}.heap");
        long frontier;
        BufferedDurableHeap heap = BufferedDurableHeap.Create(path, Options(MappedFileWriteBack.PrivateMapping), new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
        try
        {
            var map = new PersistentHashMap<long, long>(heap, 1);
            map.Set(1, 10);
            heap.Sync();
            frontier = heap.DurableFrontier;

            // The disk starts failing (EIO on every pwrite and fdatasync). The control ignores the errors, as code that
            // does not check what the calls return would.
            var domain = (MappedFilePersistenceDomain)heap.Heap.File.Domain;
            domain.FailFileCallsForTesting = Eio;
            domain.FailFromOffsetForTesting = payloadsOnly ? heap.Heap.File.DataStart : 0;
            domain.IgnoreFileCallErrorsForTesting = control;
            map.Set(2, 20);
            Exception? failure = Record.Exception(() => heap.Sync());

            // What the file holds now, as a crash would leave it: every write a Sync returned for must be there.
            byte[] image = new byte[domain.Length];
            Assert.Equal(image.Length, domain.ReadFile(0, image));
            using var crashed = SimulatedPersistenceDomain.FromImage(image);
            using (BufferedDurableHeap recovered = BufferedDurableHeap.Open(HeapFile.Open(crashed), new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan }))
            {
                var contents = new PersistentHashMap<long, long>(recovered, 1);
                Assert.True(contents.TryGetValue(1, out long one) && one == 10);
                bool secondInFile = contents.TryGetValue(2, out _);
                if (control)
                {
                    // The control's Sync returned although the write never reached the file: lost silently.
                    Assert.Null(failure);
                    Assert.False(secondInFile);
                    return;
                }

                Assert.True(failure is not null || secondInFile, "Sync returned for a write that is not in the file");

                // The write-back's failure is reported as the disk's own error (as documented). (The transition persists
                // nothing after the first one: the clock rides with the frontier. When it persisted the clock, a disk
                // failing everywhere failed the transition first, reported wrapped.)
                Assert.IsType<IOException>(failure);
                Assert.Contains("Input/output error", failure!.ToString());
                Assert.Equal(frontier, heap.DurableFrontier);
                Assert.Equal(frontier, recovered.Recovery.RecoveredVersion);
            }

            // The disk answers again, but what failed was marked clean by the kernel: no Sync returns any more.
            domain.FailFileCallsForTesting = 0;
            Exception later = Assert.ThrowsAny<Exception>(() => heap.Sync());
            Assert.Contains("Input/output error", later.ToString());
            Assert.Equal(frontier, heap.DurableFrontier);
        }
        finally
        {
            // Dispose reports the failure too (it cannot write the clean-shutdown word) and still releases the file.
            Exception? disposal = Record.Exception(heap.Dispose);
            Assert.True(control || disposal is IOException or InvalidOperationException, $"Dispose after a failed write-back: {disposal}");
        }

        using BufferedDurableHeap reopened = BufferedDurableHeap.Open(path, Options(MappedFileWriteBack.PrivateMapping));
        Assert.False(reopened.Recovery.WasCleanShutdown);
        Assert.Equal(frontier, reopened.Recovery.RecoveredVersion);
        Assert.False(new PersistentHashMap<long, long>(reopened, 1).TryGetValue(2, out _));
    }

    /// <summary>
    /// Once the background advancer has failed (a write-back error) it has stopped: a SyncAsync that registered its wait
    /// afterwards was completed by nobody, so with an infinite SyncTimeout it never completed (and otherwise timed out
    /// with a TimeoutException instead of the advancer's failure). It must fail at once, as Sync does.
    /// </summary>
    [Fact]
    public void SyncAsync_AfterTheBackgroundAdvancerFailed_FailsInsteadOfWaitingForIt()
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "private mappings are Linux only");
        const int Eio = 5;
        BufferedDurableHeap heap = BufferedDurableHeap.Create(
            _directory.File("async-after-fault.heap"),
            Options(MappedFileWriteBack.PrivateMapping),
            new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromMilliseconds(5), SyncTimeout = Timeout.InfiniteTimeSpan });
        Exception? second;
        try
        {
            var map = new PersistentHashMap<long, long>(heap, 1);
            map.Set(1, 10);
            heap.Sync();
            map.Set(2, 20);
            ((MappedFilePersistenceDomain)heap.Heap.File.Domain).FailFileCallsForTesting = Eio;
            second = AfterTheAdvancerFailed(heap);
        }
        finally
        {
            Record.Exception(heap.Dispose);
        }

        Assert.IsType<InvalidOperationException>(second);
        Assert.Contains("Input/output error", second.ToString());
    }

    /// <summary>Lets the background advancer fail and stop, then returns what a SyncAsync after it threw or faulted with.</summary>
    private static Exception? AfterTheAdvancerFailed(BufferedDurableHeap heap)
    {
        // The advancer runs the failing cycle (nobody else runs one) at its next period or when this wait wakes it, and
        // stops; the wait fails with it (or, if the cycle failed before it registered, it is refused).
        Assert.NotNull(SyncAsyncFailure(heap, "the wait registered before the failure never completed"));
        Assert.True(heap.AdvancerForTesting!.Join(TimeSpan.FromSeconds(30)), "the advancer did not stop after its failure");
        return SyncAsyncFailure(heap, "a SyncAsync after the advancer stopped never completed");
    }

    /// <summary>What a SyncAsync threw, or what its task faulted with (bounded wait).</summary>
    private static Exception? SyncAsyncFailure(BufferedDurableHeap heap, string neverCompleted)
    {
        Task? wait = null;
        Exception? thrown = Record.Exception(() => { wait = heap.SyncAsync(); });
        if (thrown is not null)
        {
            return thrown;
        }

        Assert.True(((IAsyncResult)wait!).AsyncWaitHandle.WaitOne(TimeSpan.FromSeconds(30)), neverCompleted);
        return wait!.Exception?.InnerException;
    }

    [Fact]
    public void MappedFileWriteBack_IsNullForOtherDomains()
    {
        using var domain = new SimulatedPersistenceDomain(2L << 20);
        using HeapFile file = HeapFile.Create(domain);
        Assert.Null(file.MappedFileWriteBack);
    }

    /// <summary>
    /// Linux reports a write-back error once per open file description, to whichever msync or fdatasync on it checks
    /// first, even if the failed pages were another call's. Two calls at once, the first one's pages fail (a simulated
    /// kernel stands in for the system call, with the kernel's errseq: the error recorded in the file, reported once to
    /// each description): the call whose pages failed must not return success. A private mapping's second fence goes
    /// through the file's second description meanwhile (and sees the error there too); a shared mapping's waits. The
    /// broken control lets the calls overlap on the first description, and the second one takes the error while the
    /// first returns as if its pages were durable.
    /// </summary>
    [Theory]
    [InlineData(false, false)]
    [InlineData(false, true)]
    [InlineData(true, false)]
    [InlineData(true, true)]
    public void ConcurrentSyncCalls_TheCallWhosePagesFailedNeverReturnsSuccess(bool privateMapping, bool control)
    {
        Assert.SkipWhen(privateMapping && !OperatingSystem.IsLinux(), "private mappings are Linux only");
        Assert.SkipUnless(OperatingSystem.IsLinux() || OperatingSystem.IsMacOS(), "msync is the shared mapping's write-back on Unix only");
        const int Eio = 5;
        MappedFilePersistenceDomain domain = MapOneMiB($"errseq-{privateMapping}-{control}.heap", privateMapping);
        using var firstInside = new ManualResetEventSlim();
        using var secondChecked = new ManualResetEventSlim();
        using var firstReturned = new ManualResetEventSlim();
        int errors = 0;
        int[] seen = new int[2];
        int secondLane = -1;
        int firstThread = 0;
        domain.UngatedSyncForTesting = control;
        domain.SyncCallForTesting = lane =>
        {
            if (Environment.CurrentManagedThreadId == Volatile.Read(ref firstThread))
            {
                // The first call's pages fail while it is in the kernel: the error is recorded in the file.
                Interlocked.Increment(ref errors);
                firstInside.Set();

                // The second call checks first if it can get in now: only if the calls are not serialized on one
                // description. Bounded: under the first description's gate it never gets in while this call is inside;
                // through the second description it always does (then waited for as long as it takes).
                secondChecked.Wait(privateMapping && !control && domain.SyncLanes == 2 ? Workers.JoinTimeout : TimeSpan.FromSeconds(2));
            }

            // Reported once per description: to the first call on it that checks after the error.
            int now = Volatile.Read(ref errors);
            bool failed = Interlocked.Exchange(ref seen[lane], now) != now;
            if (Environment.CurrentManagedThreadId != Volatile.Read(ref firstThread))
            {
                Volatile.Write(ref secondLane, lane);
                secondChecked.Set();
                if (failed)
                {
                    // The second call took the first one's error: it returns (and records it) only once the first
                    // call has returned, the widest form of the race (bounded).
                    firstReturned.Wait(TimeSpan.FromSeconds(2));
                }
            }

            if (failed)
            {
                System.Runtime.InteropServices.Marshal.SetLastPInvokeError(Eio);
                return -1;
            }

            return 0;
        };

        // A private mapping's pages reach the kernel by pwrite; fdatasync is the call that checks. A shared mapping's
        // msync does both.
        void Sync(long offset)
        {
            domain.WriteBack(offset, 100);
            domain.Fence();
        }

        Exception? first = null;
        Exception? second = null;
        var firstCall = new Thread(() =>
        {
            Volatile.Write(ref firstThread, Environment.CurrentManagedThreadId);
            first = Record.Exception(() => Sync(QuarantineOffset));
            firstReturned.Set();
        });
        var secondCall = new Thread(() =>
        {
            Assert.True(firstInside.Wait(TimeSpan.FromSeconds(30)), "the first call never reached the kernel");
            second = Record.Exception(() => Sync(QuarantineOffset + (4 * Page)));
        });
        firstCall.Start();
        secondCall.Start();
        Assert.True(firstCall.Join(TimeSpan.FromSeconds(30)) && secondCall.Join(TimeSpan.FromSeconds(30)), "a call never returned");
        Record.Exception(domain.Dispose);

        if (control)
        {
            Assert.SkipUnless(secondChecked.IsSet, "inconclusive: the control's second call did not reach the kernel while the first was inside");

            // The control: the second call took the error, and the first returned as if its pages were durable.
            Assert.IsType<IOException>(second);
            Assert.Null(first);
            return;
        }

        IOException failure = Assert.IsType<IOException>(first);
        Assert.Contains("Input/output error", failure.Message);

        // The second call reports the error too: through the second description, which saw it (a private mapping), or
        // after the first call, which recorded it, without a call of its own (fail-stop).
        Assert.Contains("Input/output error", Assert.IsType<IOException>(second).Message);
        Assert.Equal(privateMapping && domain.SyncLanes == 2 ? 1 : -1, secondLane);
    }

    /// <summary>
    /// The second open file description's calls are serialized too: with the first description's gate held (a fence
    /// parked in the kernel) and a fence inside the second one whose pages fail, a third fence that waits for the second
    /// description's gate cannot get in and take the error (reported once per description) while the failing call is
    /// inside; every fence reports the failure. The broken control lets the third fence through the second description
    /// ungated: its call checks first and takes the error, and the fence whose pages failed returns success.
    /// </summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void PrivateMapping_TheSecondDescriptionsCallsAreSerializedToo(bool control)
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "private mappings are Linux only");
        const int Eio = 5;
        MappedFilePersistenceDomain domain = MapOneMiB($"second-lane-{control}.heap", privateMapping: true);
        SkipUnlessTwoDescriptions(domain);
        domain.UngatedSecondLaneForTesting = control;
        using var parkedInside = new ManualResetEventSlim();
        using var releaseParked = new ManualResetEventSlim();
        using var failingInside = new ManualResetEventSlim();
        using var thirdWaiting = new ManualResetEventSlim();
        using var thirdChecked = new ManualResetEventSlim();
        using var failingReturned = new ManualResetEventSlim();
        Thread? parked = null;
        Thread? failing = null;
        int errors = 0;
        int[] seen = new int[2];
        int failingLane = -1;
        int thirdLane = -1;
        domain.WaitingForSyncLaneForTesting = lane =>
        {
            Volatile.Write(ref thirdLane, lane);
            thirdWaiting.Set();
        };
        domain.SyncCallForTesting = lane =>
        {
            if (Thread.CurrentThread == parked)
            {
                // In the kernel through the first description, before anything failed: it sees nothing.
                parkedInside.Set();
                releaseParked.Wait(Workers.JoinTimeout);
                return 0;
            }

            if (Thread.CurrentThread == failing)
            {
                // Its pages fail while it is in the kernel (recorded in the file). The third fence checks first if it can
                // get in: only through an ungated description (the control), so only there is it waited for.
                Volatile.Write(ref failingLane, lane);
                Interlocked.Increment(ref errors);
                failingInside.Set();
                thirdWaiting.Wait(Workers.JoinTimeout);
                if (control)
                {
                    thirdChecked.Wait(Workers.JoinTimeout);
                }
            }

            // Reported once per description: to the first call on it that checks after the error.
            int now = Volatile.Read(ref errors);
            bool failed = Interlocked.Exchange(ref seen[lane], now) != now;
            if (Thread.CurrentThread != failing)
            {
                thirdChecked.Set();
                if (failed)
                {
                    // It took the failing fence's error: it returns only once that fence has (bounded).
                    failingReturned.Wait(Workers.JoinTimeout);
                }
            }

            if (failed)
            {
                System.Runtime.InteropServices.Marshal.SetLastPInvokeError(Eio);
                return -1;
            }

            return 0;
        };

        Exception? parkedFailure = null;
        Exception? failingFailure = null;
        Exception? thirdFailure = null;
        parked = new Thread(() => parkedFailure = Record.Exception(domain.Fence)) { IsBackground = true };
        failing = new Thread(() =>
        {
            failingFailure = Record.Exception(domain.Fence);
            failingReturned.Set();
        })
        { IsBackground = true };

        // A fence that finds both gates taken waits for the one its thread's id picks: the second one for an odd id.
        Thread third;
        do
        {
            third = new Thread(() => thirdFailure = Record.Exception(domain.Fence)) { IsBackground = true };
        }
        while ((third.ManagedThreadId & 1) == 0);

        parked.Start();
        Assert.True(parkedInside.Wait(Workers.JoinTimeout), "the parked fence never reached the kernel");
        failing.Start();
        Assert.True(failingInside.Wait(Workers.JoinTimeout), "the failing fence never reached the kernel");
        third.Start();
        Assert.True(thirdWaiting.Wait(Workers.JoinTimeout), "the third fence never came to the gates");

        // The first description's call returns: the fences that succeed may pass its gate now.
        releaseParked.Set();
        Assert.True(parked.Join(Workers.JoinTimeout) && failing.Join(Workers.JoinTimeout) && third.Join(Workers.JoinTimeout), "a fence never returned");
        Record.Exception(domain.Dispose);

        Assert.Equal(1, failingLane);
        Assert.Equal(1, thirdLane);
        if (control)
        {
            // The control: the third fence took the error, and the fence whose pages failed returned as if durable.
            Assert.Contains("Input/output error", Assert.IsType<IOException>(thirdFailure).Message);
            Assert.Null(failingFailure);
            return;
        }

        Assert.Contains("Input/output error", Assert.IsType<IOException>(failingFailure).Message);
        Assert.Contains("Input/output error", Assert.IsType<IOException>(thirdFailure).Message);
        Assert.IsType<IOException>(parkedFailure);
    }

    /// <summary>
    /// Some write-back errors reach only the call that drove the pages' write-out (ext4 gives up on pages whose blocks it
    /// cannot map and returns the error to that call alone, recording nothing in the file). A fence whose own fdatasync
    /// succeeded while a fence through the other open file description was writing its pages out, and failed, must not
    /// return success: it waits for that call and reports its failure. The broken control returns at once, with success.
    /// </summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void PrivateMapping_AFenceThatSucceededReportsTheFailureOfAnOverlappingCall(bool control)
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "private mappings are Linux only");
        const int Eio = 5;
        MappedFilePersistenceDomain domain = MapOneMiB($"overlap-{control}.heap", privateMapping: true);
        SkipUnlessTwoDescriptions(domain);
        domain.SkipOtherLaneWaitForTesting = control;
        using var failingInside = new ManualResetEventSlim();
        using var succeededReturned = new ManualResetEventSlim();
        Thread? failing = null;
        int succeedingLane = -1;
        domain.SyncCallForTesting = lane =>
        {
            if (Thread.CurrentThread == failing)
            {
                // In the kernel, writing out the other fence's pages too: told of their failure once that fence's own
                // call has returned success (bounded).
                failingInside.Set();
                succeededReturned.Wait(Workers.JoinTimeout);
                System.Runtime.InteropServices.Marshal.SetLastPInvokeError(Eio);
                return -1;
            }

            Volatile.Write(ref succeedingLane, lane);
            succeededReturned.Set();
            return 0;
        };

        Exception? failed = null;
        Exception? succeeded = null;
        failing = new Thread(() => failed = Record.Exception(domain.Fence)) { IsBackground = true };
        var succeeding = new Thread(() => succeeded = Record.Exception(() =>
        {
            domain.WriteBack(QuarantineOffset, 100);
            domain.Fence();
        }))
        { IsBackground = true };
        failing.Start();
        Assert.True(failingInside.Wait(Workers.JoinTimeout), "the failing fence never reached the kernel");
        succeeding.Start();
        Assert.True(failing.Join(Workers.JoinTimeout) && succeeding.Join(Workers.JoinTimeout), "a fence never returned");
        Record.Exception(domain.Dispose);

        Assert.Equal(1, succeedingLane);
        Assert.Contains("Input/output error", Assert.IsType<IOException>(failed).Message);
        if (control)
        {
            // The control: the fence whose pages failed under the other call returned as if they were durable.
            Assert.Null(succeeded);
            return;
        }

        Assert.Contains("Input/output error", Assert.IsType<IOException>(succeeded).Message);
    }

    /// <summary>
    /// The kernel reports a write-back error once: the failure is recorded (fail-stop) before anything is allocated to
    /// describe it, so an <see cref="OutOfMemoryException"/> while its message is built (simulated by a hook where the
    /// allocation happens) still leaves every later fence failing, the caller's retry among them. The broken control
    /// allocates first, as before: the failure goes unrecorded and the retried fence returns success over the failed
    /// pages.
    /// </summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void AFailureIsRecordedBeforeItsDescriptionIsAllocated(bool control)
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "private mappings are Linux only");
        const int Eio = 5;
        MappedFilePersistenceDomain domain = MapOneMiB($"undescribed-{control}.heap", privateMapping: true);
        domain.RecordFailureLateForTesting = control;
        int calls = 0;
        domain.SyncCallForTesting = _ =>
        {
            // The first fdatasync is told of the failed pages; the kernel reports it once, so the next one succeeds.
            if (Interlocked.Increment(ref calls) > 1)
            {
                return 0;
            }

            System.Runtime.InteropServices.Marshal.SetLastPInvokeError(Eio);
            return -1;
        };
        domain.DescribingFailureForTesting = () =>
        {
            if (Volatile.Read(ref calls) == 1)
            {
                throw new OutOfMemoryException("simulated: no memory for the failure's message");
            }
        };

        domain.WriteBack(QuarantineOffset, 100);
        Assert.IsType<OutOfMemoryException>(Record.Exception(domain.Fence));
        Exception? retry = Record.Exception(domain.Fence);
        Record.Exception(domain.Dispose);
        if (control)
        {
            // The control: the retry returned as if the failed pages were durable.
            Assert.Equal(2, calls);
            Assert.Null(retry);
            return;
        }

        Assert.Equal(1, calls);
        Assert.Contains("a write-back or fence of the heap file failed", Assert.IsType<IOException>(retry).Message);
    }

    /// <summary>
    /// A write-out that another thread started (<c>sync_file_range</c>, after its write-back's copy) may take a fence's
    /// pages with its own and be the only call told they failed (ext4 gives up on pages whose blocks it cannot map and
    /// drops them, recording nothing in the file), so the fence's own fdatasync finds them clean and succeeds. The fence
    /// must not return success while such a write-out is in flight: it waits for it, and reports its failure. The broken
    /// control returns at once, with success, over pages that never reached the disk.
    /// </summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void PrivateMapping_AFenceThatSucceededReportsTheFailureOfAWriteOutInFlight(bool control)
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "private mappings and sync_file_range are Linux only");
        MappedFilePersistenceDomain domain = MapOneMiB($"write-out-{control}.heap", privateMapping: true);
        domain.SkipWriteOutWaitForTesting = control;
        AssertTheFenceReportsTheWriteOut(control, FenceBesideAFailingWriteOut(domain));
    }

    /// <summary>
    /// A write-out that read the phase before a fence flipped it, and was counted after that fence looked (so that fence
    /// rightly did not wait: its call had not begun), is in the kernel when the next fence's fdatasync returns. It counts
    /// in the phase the next fence makes current, so that fence waits for that phase first, then flips and waits for the
    /// old one: it reports the write-out's failure. The broken control (the first version) waits for the old phase only,
    /// and returns success while the write-out fails under it.
    /// </summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void PrivateMapping_TheNextFenceWaitsForAWriteOutCountedAfterAFlip(bool control)
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "private mappings and sync_file_range are Linux only");
        MappedFilePersistenceDomain domain = MapOneMiB($"stale-phase-{control}.heap", privateMapping: true);
        domain.SkipStalePhaseWaitForTesting = control;

        // The first fence runs while the write-out is parked between its read of the phase and its count: nothing is
        // counted and its call has not begun, so the fence flips the phase and returns.
        AssertTheFenceReportsTheWriteOut(control, FenceBesideAFailingWriteOut(domain, whileTheWriteOutReadsThePhase: domain.Fence));
    }

    /// <summary>
    /// A write-back on another thread whose write-out (a simulated kernel's <c>sync_file_range</c>, with the fence's pages)
    /// fails once a fence waits for it or has returned (the controls), whichever comes first (bounded); a fence made while
    /// it is in the kernel. <paramref name="whileTheWriteOutReadsThePhase"/> runs while the write-out is parked between
    /// its read of the phase and its count.
    /// </summary>
    private static (Exception? WriteBack, Exception? Fence, bool FenceWaited) FenceBesideAFailingWriteOut(MappedFilePersistenceDomain domain, Action? whileTheWriteOutReadsThePhase = null)
    {
        const int Eio = 5;
        using var phaseRead = new ManualResetEventSlim();
        using var count = new ManualResetEventSlim();
        using var writeOutInside = new ManualResetEventSlim();
        using var fenceWaits = new ManualResetEventSlim();
        using var fenceReturned = new ManualResetEventSlim();
        if (whileTheWriteOutReadsThePhase is not null)
        {
            domain.WriteOutPhaseReadForTesting = () =>
            {
                phaseRead.Set();
                count.Wait(Workers.JoinTimeout);
            };
        }

        domain.SyncFileRangeCallForTesting = () =>
        {
            writeOutInside.Set();
            WaitHandle.WaitAny([fenceWaits.WaitHandle, fenceReturned.WaitHandle], Workers.JoinTimeout);
            System.Runtime.InteropServices.Marshal.SetLastPInvokeError(Eio);
            return -1;
        };
        domain.SyncCallForTesting = _ => 0;

        Exception? writeBack = null;
        Exception? fence = null;
        var writer = new Thread(() => writeBack = Record.Exception(() => domain.WriteBack(QuarantineOffset, 100))) { IsBackground = true };
        writer.Start();
        if (whileTheWriteOutReadsThePhase is not null)
        {
            Assert.True(phaseRead.Wait(Workers.JoinTimeout), "the write-out never read the phase");
            whileTheWriteOutReadsThePhase();
            count.Set();
        }

        Assert.True(writeOutInside.Wait(Workers.JoinTimeout), "the write-out never reached the kernel");
        domain.WaitingForWriteOutsForTesting = fenceWaits.Set;
        var fencer = new Thread(() =>
        {
            fence = Record.Exception(domain.Fence);
            fenceReturned.Set();
        })
        { IsBackground = true };
        fencer.Start();
        Assert.True(writer.Join(Workers.JoinTimeout) && fencer.Join(Workers.JoinTimeout), "a call never returned");
        Record.Exception(domain.Dispose);
        return (writeBack, fence, fenceWaits.IsSet);
    }

    private static void AssertTheFenceReportsTheWriteOut(bool control, (Exception? WriteBack, Exception? Fence, bool FenceWaited) outcome)
    {
        Assert.Contains("sync_file_range failed: Input/output error", Assert.IsType<IOException>(outcome.WriteBack).Message);
        if (control)
        {
            // The control: the fence returned as if the pages were durable.
            Assert.False(outcome.FenceWaited);
            Assert.Null(outcome.Fence);
            return;
        }

        Assert.True(outcome.FenceWaited);
        Assert.Contains("Input/output error", Assert.IsType<IOException>(outcome.Fence).Message);
    }

    /// <summary>
    /// A private mapping's fence does not wait for another thread's fence in the kernel to make its own call: it goes
    /// through the file's second open file description, with the real fdatasync (which needs no write access to it),
    /// while the first is still inside; it returns once the first has left (see the test above). The control maps the
    /// file with one description only: the second fence's call waits for the first (it never starts while the first is
    /// inside).
    /// </summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void PrivateMapping_TwoFencesRunTheirCallsAtOnce(bool control)
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "private mappings are Linux only");
        using var stream = new FileStream(_directory.File($"two-lanes-{control}.heap"), FileMode.CreateNew, FileAccess.ReadWrite);
        stream.SetLength(1L << 20);
        MappedFilePersistenceDomain domain = MappedFilePersistenceDomain.Map(stream, 1L << 20, 1L << 20, privateMapping: true, secondDescription: !control);
        if (control)
        {
            Assert.Equal(1, domain.SyncLanes);
        }
        else
        {
            SkipUnlessTwoDescriptions(domain);
        }
        if (!control)
        {
            // The same file, through another open file description (a dup of the descriptor would share the first
            // one's write-back error state): read-only, where the first is read-write.
            int firstFd = (int)stream.SafeFileHandle.DangerousGetHandle();
            int secondFd = domain.SecondDescriptorForTesting!.Value;
            Assert.Equal(File.ResolveLinkTarget($"/proc/self/fd/{firstFd}", false)!.FullName, File.ResolveLinkTarget($"/proc/self/fd/{secondFd}", false)!.FullName);
            Assert.Equal(2, AccessMode(firstFd));
            Assert.Equal(0, AccessMode(secondFd));
        }

        using var firstInside = new ManualResetEventSlim();
        using var secondCalled = new ManualResetEventSlim();
        using var release = new ManualResetEventSlim();
        Thread? first = null;
        int secondLane = -1;
        int secondResult = -1;
        domain.SyncCallForTesting = lane =>
        {
            if (Thread.CurrentThread == first)
            {
                firstInside.Set();
                release.Wait(Workers.JoinTimeout);
                return 0;
            }

            int result = domain.SyncThrough(lane);
            Volatile.Write(ref secondLane, lane);
            Volatile.Write(ref secondResult, result);
            secondCalled.Set();
            return result;
        };

        first = new Thread(domain.Fence) { IsBackground = true };
        Exception? secondFailure = null;
        var second = new Thread(() => secondFailure = Record.Exception(() =>
        {
            domain.WriteBack(QuarantineOffset, 100);
            domain.Fence();
        }))
        { IsBackground = true };
        try
        {
            first.Start();
            Assert.True(firstInside.Wait(Workers.JoinTimeout), "the first fence never reached the kernel");
            second.Start();
            if (control)
            {
                // Behind the only description's gate, which the first fence holds until it is released: never in.
                Assert.False(secondCalled.Wait(TimeSpan.FromMilliseconds(200)), "the control's second fence made its call while the first was in the kernel");
                return;
            }

            Assert.True(secondCalled.Wait(Workers.JoinTimeout), "the second fence's call waited for the first one in the kernel");
            Assert.Equal(1, secondLane);
            Assert.Equal(0, secondResult);
        }
        finally
        {
            release.Set();
            Assert.True(first.Join(Workers.JoinTimeout) && second.Join(Workers.JoinTimeout));
            Record.Exception(domain.Dispose);
        }

        Assert.Null(secondFailure);
    }

    /// <summary>
    /// The second description is opened only on a file system whose fdatasync works on the file whichever description
    /// calls it (the local ones, tmpfs). A network or FUSE file system could sync what its own handle wrote
    /// only, and the read-only description's call would return success over the first one's pages: a fence would report
    /// data durable that is not. Unknown types (0 among them: what a big-endian 8-byte f_type reads as) get one description.
    /// </summary>
    [Theory]
    [InlineData(0xEF53u, true)] // ext4
    [InlineData(0x5846_5342u, true)] // XFS
    [InlineData(0x9123_683Eu, true)] // Btrfs
    [InlineData(0x0102_1994u, true)] // tmpfs
    [InlineData(0x794C_7630u, false)] // overlayfs (its upper layer's file system is not known)
    [InlineData(0x6969u, false)] // NFS
    [InlineData(0xFF53_4D42u, false)] // CIFS
    [InlineData(0xFE53_4D42u, false)] // SMB2
    [InlineData(0x6573_5546u, false)] // FUSE (virtiofs too)
    [InlineData(0x0102_1997u, false)] // 9p
    [InlineData(0x00C3_6400u, false)] // Ceph
    [InlineData(0u, false)]
    public void SecondDescription_OnlyOnFileSystemsThatSyncTheFileThroughAnyDescription(uint fileSystemType, bool expected) =>
        Assert.Equal(expected, MappedFilePersistenceDomain.SyncsTheFileThroughAnyDescription(fileSystemType));

    /// <summary>
    /// The file system type is read from the right field: a file in /dev/shm reads tmpfs's magic number where the mount
    /// table says /dev/shm is tmpfs, and a private mapping in the test directory has two descriptions exactly when its
    /// file system's type (and the mount table's name for it) is one of those listed.
    /// </summary>
    [Fact]
    public void SecondDescription_FollowsTheFileSystemTypeReadFromTheDescriptor()
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "private mappings are Linux only");
        string? shmType = MountedFileSystemType("/dev/shm");
        if (shmType == "tmpfs")
        {
            string path = Path.Combine("/dev/shm", $"epvs-fstype-{Guid.NewGuid():N}");
            try
            {
                using var shm = new FileStream(path, FileMode.CreateNew, FileAccess.ReadWrite);
                Assert.Equal(0x0102_1994u, Interop.Libc.FileSystemType((int)shm.SafeFileHandle.DangerousGetHandle()));
            }
            finally
            {
                File.Delete(path);
            }
        }

        using var stream = new FileStream(_directory.File("fstype.heap"), FileMode.CreateNew, FileAccess.ReadWrite);
        stream.SetLength(1L << 20);
        uint type = Interop.Libc.FileSystemType((int)stream.SafeFileHandle.DangerousGetHandle())!.Value;
        MappedFilePersistenceDomain domain = MappedFilePersistenceDomain.Map(stream, 1L << 20, 1L << 20, privateMapping: true);
        try
        {
            Assert.Equal(MappedFilePersistenceDomain.SyncsTheFileThroughAnyDescription(type) ? 2 : 1, domain.SyncLanes);
            string? directoryType = MountedFileSystemType(Path.GetDirectoryName(stream.Name)!);
            Assert.Equal(directoryType is "ext2" or "ext3" or "ext4" or "xfs" or "btrfs" or "f2fs" or "zfs" or "bcachefs" or "tmpfs", MappedFilePersistenceDomain.SyncsTheFileThroughAnyDescription(type));
        }
        finally
        {
            domain.Dispose();
        }
    }

    /// <summary>The file system type (the mount table's name: ext4, tmpfs, ...) of the innermost mount that holds <paramref name="path"/>, from /proc/self/mountinfo; null if none is found.</summary>
    private static string? MountedFileSystemType(string path)
    {
        string full = Path.GetFullPath(path);
        string? best = null;
        int bestLength = -1;
        foreach (string line in File.ReadAllLines("/proc/self/mountinfo"))
        {
            // "id parent major:minor root mountpoint options [optional fields] - type source superoptions"
            string[] fields = line.Split(' ');
            string mountPoint = fields[4].Replace("\\040", " ", StringComparison.Ordinal);
            int separator = Array.IndexOf(fields, "-");
            bool holds = full == mountPoint || full.StartsWith(mountPoint.TrimEnd('/') + "/", StringComparison.Ordinal);
            if (separator > 0 && holds && mountPoint.Length >= bestLength)
            {
                best = fields[separator + 1];
                bestLength = mountPoint.Length;
            }
        }

        return best;
    }

    /// <summary>
    /// Skips a test of the second open file description where the test directory's file system does not get one (not
    /// on the list of <see cref="MappedFilePersistenceDomain.SyncsTheFileThroughAnyDescription"/>: overlayfs in a
    /// container, NFS), after disposing the domain. <see cref="SecondDescription_FollowsTheFileSystemTypeReadFromTheDescriptor"/>
    /// checks that choice itself on every file system.
    /// </summary>
    private static void SkipUnlessTwoDescriptions(MappedFilePersistenceDomain domain)
    {
        if (domain.SyncLanes != 2)
        {
            domain.Dispose();
            Assert.Skip("the test directory's file system is not one the second open file description is used on");
        }
    }

    /// <summary>The access mode (O_ACCMODE: 0 read-only, 2 read-write) of the open file description behind descriptor <paramref name="fd"/>, from /proc/self/fdinfo.</summary>
    private static int AccessMode(int fd)
    {
        string flags = File.ReadAllLines($"/proc/self/fdinfo/{fd}").Single(line => line.StartsWith("flags:", StringComparison.Ordinal));
        return Convert.ToInt32(flags["flags:".Length..].Trim(), 8) & 3;
    }

    [Fact]
    public void Create_WriteBackNotAnEnumValue_ThrowsAndLeavesNoFile()
    {
        string path = _directory.File("bad.heap");
        ArgumentOutOfRangeException error = Assert.Throws<ArgumentOutOfRangeException>(() => HeapFile.Create(path, Options((MappedFileWriteBack)7)));
        Assert.Contains("MappedFileWriteBack 7", error.Message);
        Assert.False(File.Exists(path));
    }

    /// <summary>Maps a fresh 1 MiB file privately, with the test pattern stored (not written back) at <see cref="QuarantineOffset"/>.</summary>
    private static MappedFilePersistenceDomain MapWithPattern(FileStream stream)
    {
        stream.SetLength(1L << 20);
        MappedFilePersistenceDomain domain = MappedFilePersistenceDomain.Map(stream, 1L << 20, 1L << 20, privateMapping: true);
        Pattern(QuarantineOffset, 100).CopyTo(domain.GetSpan(QuarantineOffset, 100));
        return domain;
    }

    private static byte[] FileBytes(FileStream stream, long offset, int length)
    {
        byte[] bytes = new byte[length];
        Assert.Equal(length, RandomAccess.Read(stream.SafeFileHandle, bytes, offset));
        return bytes;
    }

    /// <summary>
    /// Runs <paramref name="straggle"/> on a thread until it is held inside its file call, quarantines the domain on
    /// another, lets the call go on after the quarantine finished or after 1 s, and waits for both (bounded).
    /// </summary>
    /// <returns>Whether the quarantine finished while the call was still held.</returns>
    private static bool QuarantineDuringHeldCall(MappedFilePersistenceDomain domain, HeldCall held, Action straggle)
    {
        var straggler = new Thread(() => straggle());
        straggler.Start();
        held.WaitUntilHeld();
        var quarantine = new Thread(domain.Quarantine);
        quarantine.Start();
        bool quarantinedFirst = quarantine.Join(TimeSpan.FromSeconds(1));
        held.Release();
        Assert.True(straggler.Join(TimeSpan.FromSeconds(30)) && quarantine.Join(TimeSpan.FromSeconds(30)), "a thread did not finish");
        return quarantinedFirst;
    }

    /// <summary>Holds the thread that runs <see cref="Hold"/> (a domain's test hook) until <see cref="Release"/>; waits are bounded.</summary>
    private sealed class HeldCall : IDisposable
    {
        private readonly ManualResetEventSlim _held = new();
        private readonly ManualResetEventSlim _go = new();

        internal void Hold()
        {
            _held.Set();
            Assert.True(_go.Wait(TimeSpan.FromSeconds(30)), "the test never let the write-back go on");
        }

        internal void WaitUntilHeld() => Assert.True(_held.Wait(TimeSpan.FromSeconds(30)), "the write-back never started");

        internal void Release() => _go.Set();

        public void Dispose()
        {
            _held.Dispose();
            _go.Dispose();
        }
    }

    /// <summary>20,000 sets and removes of 2,000 keys at random; returns what the map should hold.</summary>
    private static System.Collections.Generic.Dictionary<long, long> SetAndRemoveAtRandom(PersistentHashMap<long, long> map, int seed)
    {
        var expected = new System.Collections.Generic.Dictionary<long, long>();
        var random = new Random(seed);
        for (int i = 0; i < 20_000; i++)
        {
            long key = random.Next(2_000);
            if (random.Next(10) == 0)
            {
                map.Remove(key);
                expected.Remove(key);
            }
            else
            {
                map.Set(key, i);
                expected[key] = i;
            }
        }

        return expected;
    }

    /// <summary>The file of <paramref name="heap"/> as a crash leaves it now (no Dispose, no further write-back): what the page cache holds, as a simulated domain to open.</summary>
    private static SimulatedPersistenceDomain PageCacheImage(BufferedDurableHeap heap)
    {
        var domain = (MappedFilePersistenceDomain)heap.Heap.File.Domain;
        byte[] image = new byte[domain.Length];
        Assert.Equal(image.Length, domain.ReadFile(0, image));
        return SimulatedPersistenceDomain.FromImage(image);
    }

    private static HeapFileOptions Options(MappedFileWriteBack writeBack) =>
        new() { Size = 2L << 20, Domain = PersistenceDomainKind.MappedFile, MappedFileWriteBack = writeBack };

    /// <summary>Stores a pattern on two pages of the data area (one page apart), without writing anything back.</summary>
    private static (long Written, long NotWritten) Fill(MappedFilePersistenceDomain domain)
    {
        long start = domain.Length - (8 * Page);
        for (long offset = start; offset < start + (6 * Page); offset += 100)
        {
            Pattern(offset, 100).CopyTo(domain.GetSpan(offset, 100));
        }

        return (start, start + (5 * Page) + 300);
    }

    /// <summary>A byte pattern that depends on the offset, so a range copied to the wrong place does not match.</summary>
    private static byte[] Pattern(long offset, int length) =>
        Enumerable.Range(0, length).Select(i => (byte)(((offset + i) * 31) % 251 + 1)).ToArray();

    private static byte[] FileBytes(MappedFilePersistenceDomain domain, long offset, int length)
    {
        byte[] bytes = new byte[length];
        Assert.Equal(length, domain.ReadFile(offset, bytes));
        return bytes;
    }
}
