using System;
using System.Collections.Generic;
using System.Runtime.InteropServices;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// Issue 10, formatting at the speed of memory: the first store to a page of a preallocated heap file faulted the page
/// into the page cache, where the kernel zero-filled it (an unwritten extent) before mapping it. On a heap file not yet
/// read, that zero-filling was most of a segment's format (a third of the stocker's time under two writers on a growing
/// heap, in a perf profile). Formatting now tells the domain first that the free segments' bytes are not needed
/// (<see cref="PersistenceDomain.PrepareOverwrite"/>), and the mapped-file domain writes zeros over them with
/// <c>pwrite</c>: the pages come from the write path, already in the page cache when the stores reach them.
/// </summary>
public sealed class PrepareOverwriteTests : IDisposable
{
    private const int TypeId = 31;
    private readonly TempDirectory _directory = new();

    public void Dispose() => _directory.Dispose();

    /// <summary>A stocking that formats several segments prepares them in runs of adjacent segments, each whole, once.</summary>
    [Fact]
    public void AStocking_PreparesEachRunOfTheSegmentsItFormats_Once()
    {
        using var domain = new SimulatedPersistenceDomain(16 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
        var map = new PersistentHashMap<long, long>(heap, TypeId);
        for (long k = 0; k < 5_000; k++)
        {
            map.Set(k, k);
        }

        var ranges = new List<(long Offset, long Length)>();
        domain.PrepareOverwriteHookForTesting = (offset, length) => ranges.Add((offset, length));
        long formatted = heap.Heap.StockFormattedSegments;
        heap.Heap.StockPools(0, TimeSpan.Zero);
        long segments = heap.Heap.StockFormattedSegments - formatted;

        Assert.True(segments >= 2, $"{segments} segments formatted: too few to show a run");
        long covered = 0;
        foreach ((long offset, long length) in ranges)
        {
            // Whole segments (their starts all lie on one grid, past the heap's table).
            Assert.Equal(ranges[0].Offset % HeapLayout.SegmentSize, offset % HeapLayout.SegmentSize);
            Assert.Equal(0, length % HeapLayout.SegmentSize);
            covered += length / HeapLayout.SegmentSize;
        }

        // Every formatted segment once; the free segments of a fresh heap are adjacent, so fewer calls than segments.
        Assert.Equal(segments, covered);
        Assert.True(ranges.Count < segments, $"{ranges.Count} calls for {segments} adjacent segments");
    }

    /// <summary>
    /// The zeros may reach the file at any time (the kernel writes dirty pages back when it likes), so a segment's bytes
    /// may only be given up once its durable descriptor is free: a segment that recovery found without a live block,
    /// whose descriptor on the medium still claims it for its old size class, is freed durably first. Checked in the
    /// durable image at the moment of the call.
    /// </summary>
    [Fact]
    public void ASegmentWhoseDurableDescriptorStillClaimsIt_IsFreedDurablyBeforeItsBytesAreGivenUp()
    {
        byte[] image;
        using (var domain = new SimulatedPersistenceDomain(4 << 20))
        {
            using HeapFile file = HeapFile.Create(domain);
            using var heap = new PersistentHeap(file);
            PayloadRef block = heap.Allocate(16, TypeId);
            heap.WriteBackHeader(block);
            domain.Fence();
            heap.Free(block);
            heap.WriteBackHeader(block);
            domain.Fence();

            // As after a crash: the durable image only (no clean shutdown).
            image = domain.GetDurableImage();
        }

        using SimulatedPersistenceDomain recovered = SimulatedPersistenceDomain.FromImage(image);
        using HeapFile reopened = HeapFile.Open(recovered);
        using var recoveredHeap = new PersistentHeap(reopened);
        long dataStart = BitConverter.ToInt64(image, HeapLayout.DataStartOffset);
        long firstSegment = (image.Length - dataStart) / HeapLayout.SegmentSize;
        var claimedAtTheCall = new List<string>();
        recovered.PrepareOverwriteHookForTesting = (offset, length) =>
        {
            byte[] durable = recovered.GetDurableImage();
            for (long segment = (offset - dataStart) / HeapLayout.SegmentSize; segment < (offset + length - dataStart) / HeapLayout.SegmentSize; segment++)
            {
                firstSegment = Math.Min(firstSegment, segment);
                ulong descriptor = BitConverter.ToUInt64(durable, HeapLayout.SuperblockSize + (int)(segment * sizeof(ulong)));
                if (HeapLayout.DescriptorRole(descriptor) != HeapLayout.RoleFree)
                {
                    claimedAtTheCall.Add($"segment {segment}: role {HeapLayout.DescriptorRole(descriptor)}");
                }
            }
        };

        // Another size class: the segment the first block used is the lowest free one, formatted anew.
        recoveredHeap.Allocate(1000, TypeId);

        Assert.Equal(0, firstSegment);
        Assert.Empty(claimedAtTheCall);
    }

    /// <summary>An allocating thread that formats a segment for itself prepares that segment.</summary>
    [Fact]
    public void AnAllocationThatFormatsASegment_PreparesThatSegment()
    {
        using var domain = new SimulatedPersistenceDomain(4 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using var heap = new PersistentHeap(file);
        var ranges = new List<(long Offset, long Length)>();
        domain.PrepareOverwriteHookForTesting = (offset, length) => ranges.Add((offset, length));

        PayloadRef block = heap.Allocate(16, TypeId);

        (long offset, long length) = Assert.Single(ranges);
        Assert.Equal(HeapLayout.SegmentSize, length);
        Assert.InRange(block.Offset, offset, offset + length - 1);
    }

    /// <summary>
    /// What it does through the page cache: the range's pages are in the page cache before any store reaches them
    /// (<c>mincore</c>). The control (the call disabled) leaves them out of it.
    /// </summary>
    [Theory]
    [InlineData(MappedFileWriteBack.PrivateMapping, false)]
    [InlineData(MappedFileWriteBack.PrivateMapping, true)]
    [InlineData(MappedFileWriteBack.SharedMapping, false)]
    [InlineData(MappedFileWriteBack.SharedMapping, true)]
    public void AFreshRange_IsInThePageCacheBeforeTheStores(MappedFileWriteBack writeBack, bool control)
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "mincore and private mappings: Linux only here");
        using HeapFile file = HeapFile.Create(_directory.File("fresh.heap"), new HeapFileOptions { Size = 8L << 20, Domain = PersistenceDomainKind.MappedFile, MappedFileWriteBack = writeBack });
        var domain = (MappedFilePersistenceDomain)file.Domain;

        // A segment's worth the file has just grown by: untouched, and past every readahead so far (the kernel reads
        // ahead of a fault by up to read_ahead_kb, 8 MiB on the development machine: the whole of the file as created).
        long offset = FreshSegment(domain);
        Assert.SkipWhen(ResidentPages(domain, offset) != 0, "inconclusive: the file's fresh pages are in the page cache already (a file system without fallocate, whose preallocation writes them)");
        domain.PrepareOverwriteDisabledForTesting = control;

        domain.PrepareOverwrite(offset, HeapLayout.SegmentSize);

        long pages = HeapLayout.SegmentSize / Environment.SystemPageSize;
        Assert.Equal(control ? 0 : pages, ResidentPages(domain, offset));
    }

    /// <summary>
    /// The range's pages are mapped in the process before the stores reach them (<c>madvise(MADV_POPULATE_WRITE)</c>), so
    /// that the stores take no page fault, one per page: in a private mapping as the process's own copies (anonymous
    /// pages, the copy-on-write done), in a shared one as the file's pages (<c>/proc/self/pagemap</c>). On a virtual
    /// machine, with another thread of the process running, those faults made a fresh segment's format 2.3 times as long
    /// (benchmark/RESULTS.md). The control (the prefault disabled, the zeros still written) leaves them unmapped.
    /// </summary>
    [Theory]
    [InlineData(MappedFileWriteBack.PrivateMapping, false)]
    [InlineData(MappedFileWriteBack.PrivateMapping, true)]
    [InlineData(MappedFileWriteBack.SharedMapping, false)]
    [InlineData(MappedFileWriteBack.SharedMapping, true)]
    public void AFreshRange_IsMappedForTheStoresBeforeThem(MappedFileWriteBack writeBack, bool control)
    {
        Assert.SkipUnless(OperatingSystem.IsLinux() && Environment.OSVersion.Version >= new Version(5, 14), "MADV_POPULATE_WRITE: Linux 5.14 or later");
        using HeapFile file = HeapFile.Create(_directory.File("mapped.heap"), new HeapFileOptions { Size = 8L << 20, Domain = PersistenceDomainKind.MappedFile, MappedFileWriteBack = writeBack });
        var domain = (MappedFilePersistenceDomain)file.Domain;
        long offset = FreshSegment(domain);
        Assert.SkipWhen(MappedPages(domain, offset).Present != 0, "inconclusive: the fresh segment's pages are mapped already");
        domain.PrefaultDisabledForTesting = control;

        domain.PrepareOverwrite(offset, HeapLayout.SegmentSize);

        long pages = HeapLayout.SegmentSize / Environment.SystemPageSize;
        (long present, long own) = MappedPages(domain, offset);
        Assert.Equal(control ? 0 : pages, present);
        Assert.Equal(control || writeBack == MappedFileWriteBack.SharedMapping ? 0 : pages, own);
        Assert.True(domain.GetSpan(offset, HeapLayout.SegmentSize).IndexOfAnyExcept((byte)0) < 0, "the prepared range does not read zeros");
    }

    /// <summary>
    /// A range longer than one prefault call takes (a stocking's run of fresh segments) is mapped whole, its last,
    /// shorter chunk included: the calls are split so that none holds the process's memory map long, not cut short.
    /// </summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void ARangeOfSeveralPrefaultChunks_IsMappedWhole(bool control)
    {
        Assert.SkipUnless(OperatingSystem.IsLinux() && Environment.OSVersion.Version >= new Version(5, 14), "MADV_POPULATE_WRITE: Linux 5.14 or later");
        using HeapFile file = HeapFile.Create(_directory.File("chunks.heap"), new HeapFileOptions { Size = 8L << 20, Domain = PersistenceDomainKind.MappedFile, MappedFileWriteBack = MappedFileWriteBack.PrivateMapping });
        var domain = (MappedFilePersistenceDomain)file.Domain;
        long length = (2 * MappedFilePersistenceDomain.PrefaultChunk) + (3 * HeapLayout.SegmentSize);
        long offset = FreshRange(domain, length);
        Assert.SkipWhen(MappedPages(domain, offset, length).Present != 0, "inconclusive: the fresh range's pages are mapped already");
        domain.PrefaultDisabledForTesting = control;

        domain.PrepareOverwrite(offset, length);

        long pages = length / Environment.SystemPageSize;
        (long present, long own) = MappedPages(domain, offset, length);
        Assert.Equal(control ? 0 : pages, present);
        Assert.Equal(control ? 0 : pages, own);
    }

    /// <summary>
    /// In a private mapping a page already copied keeps its bytes until the caller's own stores; the file holds zeros
    /// (the caller writes the range back whole next).
    /// </summary>
    [Fact]
    public void PrivateMapping_ACopiedPageKeepsItsBytes_TheFileHoldsZeros()
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "private mappings are Linux only");
        using HeapFile file = HeapFile.Create(_directory.File("copied.heap"), new HeapFileOptions { Size = 8L << 20, Domain = PersistenceDomainKind.MappedFile, MappedFileWriteBack = MappedFileWriteBack.PrivateMapping });
        var domain = (MappedFilePersistenceDomain)file.Domain;
        long offset = FreshSegment(domain);
        Span<byte> memory = domain.GetSpan(offset, 4096);
        memory.Fill(0x5A);
        domain.Persist(offset, 4096);
        Assert.Equal(0x5A, FileBytes(domain, offset, 4096)[4095]);

        domain.PrepareOverwrite(offset, HeapLayout.SegmentSize);

        Assert.Equal(new byte[4096], FileBytes(domain, offset, 4096));
        Assert.True(memory.IndexOfAnyExcept((byte)0x5A) < 0, "a copied page changed under its owner");
    }

    /// <summary>
    /// After a failed write-back (fail-stop) nothing is written any more: a segment whose release failed may still be
    /// formatted on the file, where zeros would read as damage.
    /// </summary>
    [Fact]
    public void AfterAFailedWriteBack_NothingIsWritten()
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "private mappings are Linux only");
        HeapFile file = HeapFile.Create(_directory.File("failed.heap"), new HeapFileOptions { Size = 8L << 20, Domain = PersistenceDomainKind.MappedFile, MappedFileWriteBack = MappedFileWriteBack.PrivateMapping });
        try
        {
            var domain = (MappedFilePersistenceDomain)file.Domain;
            long offset = FreshSegment(domain);
            domain.GetSpan(offset, 4096).Fill(0x5A);
            domain.Persist(offset, 4096);
            domain.FailFileCallsForTesting = 5;
            Assert.Throws<System.IO.IOException>(() => domain.Persist(offset, 4096));
            domain.FailFileCallsForTesting = 0;

            domain.PrepareOverwrite(offset, HeapLayout.SegmentSize);

            Assert.True(FileBytes(domain, offset, 4096).AsSpan().IndexOfAnyExcept((byte)0x5A) < 0, "zeros were written after the domain failed");
        }
        finally
        {
            // (Its clean-shutdown store reports the failed domain, and the file is released all the same.)
            Assert.Throws<System.IO.IOException>(file.Dispose);
        }
    }

    /// <summary>Grows the domain by a segment (page-aligned) and returns where that segment starts.</summary>
    private static long FreshSegment(PersistenceDomain domain) => FreshRange(domain, HeapLayout.SegmentSize);

    /// <summary>Grows the domain by <paramref name="length"/> bytes from its first segment boundary at or after its end.</summary>
    private static long FreshRange(PersistenceDomain domain, long length)
    {
        long offset = (domain.Length + HeapLayout.SegmentSize - 1) & ~(long)(HeapLayout.SegmentSize - 1);
        Assert.True(domain.TryGrow(offset + length), "the domain could not grow");
        return offset;
    }

    private static byte[] FileBytes(MappedFilePersistenceDomain domain, long offset, int length)
    {
        byte[] bytes = new byte[length];
        Assert.Equal(length, domain.ReadFile(offset, bytes));
        return bytes;
    }

    /// <summary>How many pages of the segment at <paramref name="offset"/> are resident (mincore).</summary>
    private static unsafe long ResidentPages(PersistenceDomain domain, long offset)
    {
        int pages = HeapLayout.SegmentSize / Environment.SystemPageSize;
        byte* vector = stackalloc byte[pages];
        Assert.Equal(0, Mincore((byte*)domain.BaseAddress + offset, (nuint)HeapLayout.SegmentSize, vector));
        long resident = 0;
        for (int i = 0; i < pages; i++)
        {
            resident += vector[i] & 1;
        }

        return resident;
    }

    /// <summary>
    /// How many pages of the segment at <paramref name="offset"/> are mapped in this process (<c>/proc/self/pagemap</c>:
    /// bit 63, present), and how many of those are its own (bit 61 clear: an anonymous page, a private mapping's copy,
    /// rather than the file's page).
    /// </summary>
    private static unsafe (long Present, long Own) MappedPages(PersistenceDomain domain, long offset, long length = HeapLayout.SegmentSize)
    {
        int pageSize = Environment.SystemPageSize;
        int pages = (int)(length / pageSize);
        byte[] entries = new byte[pages * sizeof(ulong)];
        using (var pagemap = new System.IO.FileStream("/proc/self/pagemap", System.IO.FileMode.Open, System.IO.FileAccess.Read, System.IO.FileShare.ReadWrite, 1, System.IO.FileOptions.None))
        {
            pagemap.Position = (long)((nuint)((byte*)domain.BaseAddress + offset) / (nuint)pageSize) * sizeof(ulong);
            pagemap.ReadExactly(entries);
        }

        long present = 0;
        long own = 0;
        for (int i = 0; i < pages; i++)
        {
            ulong entry = BitConverter.ToUInt64(entries, i * sizeof(ulong));
            if ((entry >> 63) != 0)
            {
                present++;
                own += ((entry >> 61) & 1) == 0 ? 1 : 0;
            }
        }

        return (present, own);
    }

    [DllImport("libc", EntryPoint = "mincore", SetLastError = true)]
    private static extern unsafe int Mincore(void* address, nuint length, byte* vector);
}
