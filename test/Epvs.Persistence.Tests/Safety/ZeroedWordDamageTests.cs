using System;
using System.Collections.Generic;
using System.IO;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// Damage that is not a bit flip: a zeroed or state-flipped commit word, a zeroed segment descriptor, a file truncated
/// into its data region and extended again, a zeroed page or range. Each used to open silently with entries missing
/// (zero meant "unused" or "free", and a free word carried no check); every one must be reported as damage — the open
/// throws <see cref="HeapFileException"/> with <see cref="HeapFileError.Corrupt"/>, listing the damaged blocks when
/// the damage is in blocks, and changes nothing past the superblock — both after a clean close (the saved state's fast
/// reopen, whose fallback is the full scan) and with the clean-shutdown word as an open leaves it (after a crash: the
/// full scan only).
/// </summary>
public sealed class ZeroedWordDamageTests
{
    private const int TypeId = 1;
    private static readonly HeapFileOptions FileOptions = new() { Size = 4L << 20, Domain = PersistenceDomainKind.MappedFile };
    private static readonly BufferedDurableHeapOptions Options = new() { AdvancePeriod = Timeout.InfiniteTimeSpan };

    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void ZeroedCommitWordOfALiveBlock_IsReportedAsDamage_NotAMissingEntry(bool crashed)
    {
        using var dir = new TempDirectory();
        string path = CreateMap(dir, 2000);
        byte[] bytes = File.ReadAllBytes(path);
        long victim = LiveBlocks(bytes)[0];
        Array.Clear(bytes, (int)victim + HeapLayout.CommitOffset, sizeof(ulong));

        HeapFileException e = AssertReported(path, bytes, crashed, 2000);
        Assert.Contains(victim, e.DamagedBlocks);
    }

    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void CommitStateFlippedFromAllocatedToFree_IsReportedAsDamage_NotAMissingEntry(bool crashed)
    {
        using var dir = new TempDirectory();
        string path = CreateMap(dir, 2000);
        byte[] bytes = File.ReadAllBytes(path);
        long victim = LiveBlocks(bytes)[100];

        // The state nibble is the high half of byte 30 (commit bits 52..55): 2 is free.
        int at = (int)victim + HeapLayout.CommitOffset + 6;
        bytes[at] = (byte)((bytes[at] & 0x0F) | 0x20);

        HeapFileException e = AssertReported(path, bytes, crashed, 2000);
        Assert.Contains(victim, e.DamagedBlocks);
    }

    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void ZeroedSegmentDescriptor_IsReportedAsDamage_NotAFreeSegment(bool crashed)
    {
        using var dir = new TempDirectory();
        string path = CreateMap(dir, 2000);
        byte[] bytes = File.ReadAllBytes(path);
        Assert.Equal(HeapLayout.RoleSmall, HeapLayout.DescriptorRole(BitConverter.ToUInt64(bytes, HeapLayout.SuperblockSize)));
        Array.Clear(bytes, HeapLayout.SuperblockSize, sizeof(ulong));

        HeapFileException e = AssertReported(path, bytes, crashed, 2000);
        Assert.Contains("segment 0", e.Message, StringComparison.Ordinal);
    }

    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void ZeroedFirstSegmentTablePage_IsReportedAsDamage_NotAnEmptyHeap(bool crashed)
    {
        using var dir = new TempDirectory();
        string path = CreateMap(dir, 2000);
        byte[] bytes = File.ReadAllBytes(path);
        Array.Clear(bytes, HeapLayout.SuperblockSize, 4096);

        AssertReported(path, bytes, crashed, 2000);
    }

    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void TruncatedIntoTheDataRegionAndExtendedWithZeros_IsReportedAsDamage(bool crashed)
    {
        using var dir = new TempDirectory();
        string path = CreateMap(dir, 5000);
        byte[] bytes = File.ReadAllBytes(path);
        long dataStart = BitConverter.ToInt64(bytes, HeapLayout.DataStartOffset);

        // What truncating the file to this length (a page boundary inside segment 3) and extending it back to its
        // length leaves: zeros from there on.
        long cut = dataStart + (3L * HeapLayout.SegmentSize) + 4096;
        Assert.Contains(LiveBlocks(bytes), b => b >= cut);
        Array.Clear(bytes, (int)cut, bytes.Length - (int)cut);

        HeapFileException e = AssertReported(path, bytes, crashed, 5000);
        Assert.NotEmpty(e.DamagedBlocks);
    }

    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void ZeroedPageInsideASegment_IsReportedAsDamage(bool crashed)
    {
        using var dir = new TempDirectory();
        string path = CreateMap(dir, 2000);
        byte[] bytes = File.ReadAllBytes(path);
        List<long> live = LiveBlocks(bytes);
        long victim = live[live.Count / 2];
        long page = victim & ~4095L;
        Array.Clear(bytes, (int)page, 4096);

        HeapFileException e = AssertReported(path, bytes, crashed, 2000);
        Assert.Contains(victim, e.DamagedBlocks);
        // The blocks the page overlaps: those in it, and one that begins before it (48-byte blocks straddle pages).
        Assert.All(e.DamagedBlocks, b => Assert.InRange(b, page - SizeClasses.BlockSizes[SizeClasses.ForPayload(16)] + 1, page + 4095));
    }

    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void ZeroedDataRegion_IsReportedAsDamage_NotAnEmptyHeap(bool crashed)
    {
        using var dir = new TempDirectory();
        string path = CreateMap(dir, 2000);
        byte[] bytes = File.ReadAllBytes(path);
        int dataStart = (int)BitConverter.ToInt64(bytes, HeapLayout.DataStartOffset);
        Array.Clear(bytes, dataStart, bytes.Length - dataStart);

        HeapFileException e = AssertReported(path, bytes, crashed, 2000);
        Assert.NotEmpty(e.DamagedBlocks);
    }

    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void ZeroedCommitWordOfALargeBlock_IsReportedAsDamage(bool crashed)
    {
        using var dir = new TempDirectory();
        string path = dir.File("large.heap");
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, FileOptions, Options))
        {
            var map = new PersistentByteMap<long>(heap, TypeId);
            map.Set(1, new byte[100_000]);
            map.Set(2, new byte[16]);
        }

        byte[] bytes = File.ReadAllBytes(path);
        long victim = LargeBlocks(bytes)[0];
        Array.Clear(bytes, (int)victim + HeapLayout.CommitOffset, sizeof(ulong));

        WriteDamaged(path, bytes, crashed);
        HeapFileException e = OpenExpectingDamage(path, heap => $"{new PersistentByteMap<long>(heap, TypeId).Count} of 2 entries");
        Assert.Contains(victim, e.DamagedBlocks);
    }

    [Fact]
    public void ZeroedCommitWord_Salvaged_DropsExactlyThatBlockAndListsIt()
    {
        using var dir = new TempDirectory();
        string path = CreateMap(dir, 2000);
        byte[] bytes = File.ReadAllBytes(path);
        long victim = LiveBlocks(bytes)[0];
        Array.Clear(bytes, (int)victim + HeapLayout.CommitOffset, sizeof(ulong));
        WriteDamaged(path, bytes, crashed: true);

        var salvage = new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, SalvageDamagedBlocks = true };
        using (BufferedDurableHeap heap = BufferedDurableHeap.Open(path, FileOptions, salvage))
        {
            Assert.Equal(new[] { victim }, heap.Recovery.DamagedBlocks);
            Assert.Equal(1999, new PersistentHashMap<long, long>(heap, TypeId).Count);
        }

        // The salvage was durable: the next open finds no damage.
        using BufferedDurableHeap again = BufferedDurableHeap.Open(path, FileOptions, Options);
        Assert.Empty(again.Recovery.DamagedBlocks);
        Assert.Equal(1999, new PersistentHashMap<long, long>(again, TypeId).Count);
    }

    /// <summary>A closed buffered heap with a hash map of <paramref name="entries"/> keys (0 to entries - 1).</summary>
    private static string CreateMap(TempDirectory dir, int entries)
    {
        string path = dir.File("damaged.heap");
        using BufferedDurableHeap heap = BufferedDurableHeap.Create(path, FileOptions, Options);
        var map = new PersistentHashMap<long, long>(heap, TypeId);
        for (long k = 0; k < entries; k++)
        {
            map.Set(k, k * 3);
        }

        return path;
    }

    /// <summary>
    /// Writes <paramref name="bytes"/> (the damaged file) to <paramref name="path"/>, with the clean-shutdown word as an
    /// open leaves it when <paramref name="crashed"/> (then the next open never trusts the saved state).
    /// </summary>
    internal static void WriteDamaged(string path, byte[] bytes, bool crashed)
    {
        if (crashed)
        {
            BitConverter.GetBytes(HeapLayout.Seal(0, HeapLayout.CleanShutdownOffset)).CopyTo(bytes, HeapLayout.CleanShutdownOffset);
        }

        File.WriteAllBytes(path, bytes);
    }

    /// <summary>Writes the damaged file, opens it, and asserts that the damage is reported and nothing past the superblock changed.</summary>
    private static HeapFileException AssertReported(string path, byte[] bytes, bool crashed, int entries)
    {
        WriteDamaged(path, bytes, crashed);
        HeapFileException e = OpenExpectingDamage(path, heap => $"{new PersistentHashMap<long, long>(heap, TypeId).Count} of {entries} entries");
        byte[] after = File.ReadAllBytes(path);
        Assert.True(bytes.AsSpan(HeapLayout.SuperblockSize).SequenceEqual(after.AsSpan(HeapLayout.SuperblockSize)), "a refused open changed the file past the superblock");
        return e;
    }

    /// <summary>Opens the damaged file: it must refuse with <see cref="HeapFileError.Corrupt"/>; if it opens, the failure says what it found (<paramref name="describe"/>).</summary>
    private static HeapFileException OpenExpectingDamage(string path, Func<BufferedDurableHeap, string> describe)
    {
        string opened;
        try
        {
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(path, FileOptions, Options);
            opened = $"the damaged file opened with {describe(heap)} and {heap.Recovery.DamagedBlocks.Count} damaged blocks reported: the damage went unnoticed";
        }
        catch (HeapFileException e)
        {
            Assert.Equal(HeapFileError.Corrupt, e.Error);
            return e;
        }

        Assert.Fail(opened);
        return null!;
    }

    /// <summary>The offsets of the blocks in use (allocated or sealed) of the small-block segments, in file order.</summary>
    internal static List<long> LiveBlocks(byte[] bytes)
    {
        // A block whose header is still the one the sweep log lists is free (format 10), whatever it holds.
        SweepLog.LoggedFrees logged = LoggedFrees(bytes);
        var live = new List<long>();
        foreach ((long start, ulong descriptor) in Segments(bytes))
        {
            if (HeapLayout.DescriptorRole(descriptor) != HeapLayout.RoleSmall)
            {
                continue;
            }

            int cls = (int)HeapLayout.DescriptorPayload(descriptor);
            for (int k = 0; k < SizeClasses.BlocksPerSegment[cls]; k++)
            {
                long offset = start + ((long)k * SizeClasses.BlockSizes[cls]);
                ulong commit = BitConverter.ToUInt64(bytes, (int)offset + HeapLayout.CommitOffset);
                if (HeapLayout.InUse(commit) && !logged.IsLogged(offset, commit))
                {
                    live.Add(offset);
                }
            }
        }

        Assert.NotEmpty(live);
        return live;
    }

    /// <summary>The sweep log of a heap file's bytes (its valid batches).</summary>
    internal static unsafe SweepLog.LoggedFrees LoggedFrees(byte[] bytes)
    {
        HeapLayout.TryUnseal(BitConverter.ToUInt64(bytes, HeapLayout.SweepLogEpochOffset), HeapLayout.SweepLogEpochOffset, out long epoch);
        fixed (byte* p = bytes)
        {
            return SweepLog.Read(p, BitConverter.ToInt64(bytes, HeapLayout.MaxSegmentsOffset), BitConverter.ToInt64(bytes, HeapLayout.DataStartOffset), epoch, "image").Frees;
        }
    }

    /// <summary>The offsets of the large blocks in use.</summary>
    private static List<long> LargeBlocks(byte[] bytes)
    {
        var large = new List<long>();
        foreach ((long start, ulong descriptor) in Segments(bytes))
        {
            if (HeapLayout.DescriptorRole(descriptor) == HeapLayout.RoleLargeStart && HeapLayout.InUse(BitConverter.ToUInt64(bytes, (int)start + HeapLayout.CommitOffset)))
            {
                large.Add(start);
            }
        }

        Assert.NotEmpty(large);
        return large;
    }

    private static IEnumerable<(long Start, ulong Descriptor)> Segments(byte[] bytes)
    {
        long dataStart = BitConverter.ToInt64(bytes, HeapLayout.DataStartOffset);
        long heapSize = (long)(BitConverter.ToUInt64(bytes, HeapLayout.HeapSizeOffset) & HeapLayout.SealedValueMask);
        for (long s = 0; s < (heapSize - dataStart) / HeapLayout.SegmentSize; s++)
        {
            yield return (dataStart + (s * HeapLayout.SegmentSize), BitConverter.ToUInt64(bytes, HeapLayout.SuperblockSize + (int)(s * sizeof(ulong))));
        }
    }
}
