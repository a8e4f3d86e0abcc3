using System;
using System.Buffers.Binary;
using System.IO;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>Layer 2: superblock, lock and the clear, non-destructive rejection of bad input (one test per case).</summary>
public sealed class HeapFileTests : IDisposable
{
    private readonly TempDirectory _directory = new();

    public void Dispose() => _directory.Dispose();

    /// <summary>A FIFO (or another file that cannot be mapped) threw NotSupportedException ("Stream does not support seeking"); now NotAHeapFile, for every open path.</summary>
    [Fact]
    public void Open_APipe_ThrowsNotAHeapFile()
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "mkfifo");
        string path = _directory.File("pipe.heap");
        using (var mkfifo = System.Diagnostics.Process.Start("mkfifo", path))
        {
            mkfifo.WaitForExit();
            Assert.Equal(0, mkfifo.ExitCode);
        }

        Assert.Equal(HeapFileError.NotAHeapFile, Assert.Throws<HeapFileException>(() => HeapFile.Open(path)).Error);
        Assert.Equal(HeapFileError.NotAHeapFile, Assert.Throws<HeapFileException>(() => PersistentHeap.Open(path)).Error);
        Assert.Equal(HeapFileError.NotAHeapFile, Assert.Throws<HeapFileException>(() => BufferedDurableHeap.Open(path)).Error);
    }

    [Fact]
    public void Open_WrongMagic_ThrowsNotAHeapFileAndLeavesFileUntouched()
    {
        string path = CreateHeap();
        Patch(path, 0, 0x0102030405060708);
        HeapFileException error = AssertRejectedUntouched(path, () => HeapFile.Open(path, MappedFile()));
        Assert.Equal(HeapFileError.NotAHeapFile, error.Error);
        Assert.Contains("does not start with the EPVS heap magic", error.Message);
        Assert.Contains(path, error.Message);
    }

    [Fact]
    public void Open_NewerFormatVersion_ThrowsNewerFormatVersionAndLeavesFileUntouched()
    {
        string path = CreateHeap();
        Patch(path, 8, (ulong)HeapFile.FormatVersion + 1);
        HeapFileException error = AssertRejectedUntouched(path, () => HeapFile.Open(path, MappedFile()));
        Assert.Equal(HeapFileError.NewerFormatVersion, error.Error);
        Assert.Contains($"format version {HeapFile.FormatVersion + 1}", error.Message);
        Assert.Contains("newer Epvs.Persistence", error.Message);
    }

    [Fact]
    public void Open_TruncatedFile_ThrowsTruncatedAndLeavesFileUntouched()
    {
        string path = CreateHeap();
        long length = new FileInfo(path).Length;
        using (var stream = new FileStream(path, FileMode.Open))
        {
            stream.SetLength(length - 4096);
        }

        HeapFileException error = AssertRejectedUntouched(path, () => HeapFile.Open(path, MappedFile()));
        Assert.Equal(HeapFileError.Truncated, error.Error);
        Assert.Contains($"records {length} bytes but the file has {length - 4096}", error.Message);
    }

    [Fact]
    public void Open_FileSmallerThanSuperblock_ThrowsSmallerThanSuperblockAndLeavesFileUntouched()
    {
        string path = _directory.File("tiny.heap");
        File.WriteAllBytes(path, new byte[100]);
        HeapFileException error = AssertRejectedUntouched(path, () => HeapFile.Open(path, MappedFile()));
        Assert.Equal(HeapFileError.SmallerThanSuperblock, error.Error);
        Assert.Contains("100 bytes, smaller than the 4096-byte superblock", error.Message);
    }

    [Fact]
    public void Open_SecondOpener_ThrowsAlreadyOpenAndLeavesFileUntouched()
    {
        string path = CreateHeap();
        byte[] before = File.ReadAllBytes(path);
        HeapFileException error;
        using (HeapFile first = HeapFile.Open(path, MappedFile()))
        {
            error = Assert.Throws<HeapFileException>(() => HeapFile.Open(path, MappedFile()));
        }

        // The first opener's clean Dispose restores the clean flag, so any byte changed by the failed second open would show.
        Assert.Equal(HeapFileError.AlreadyOpen, error.Error);
        Assert.Contains("another opener holds its exclusive lock", error.Message);
        Assert.Equal(before, File.ReadAllBytes(path));
    }

    [Fact]
    public void Open_ReadOnlyFile_ThrowsReadOnlyAndLeavesFileUntouched()
    {
        string path = CreateHeap();
        if (OperatingSystem.IsWindows())
        {
            File.SetAttributes(path, FileAttributes.ReadOnly);
        }
        else
        {
            File.SetUnixFileMode(path, UnixFileMode.UserRead | UnixFileMode.GroupRead);
        }

        HeapFileException error = AssertRejectedUntouched(path, () => HeapFile.Open(path, MappedFile()));
        Assert.Equal(HeapFileError.ReadOnly, error.Error);
        Assert.Contains("read-only", error.Message);
    }

    [Fact]
    public void Create_NoSpaceForRequestedSize_ThrowsInsufficientSpaceAndCreatesNothing()
    {
        string path = _directory.File("huge.heap");
        long free = new DriveInfo(_directory.Path).AvailableFreeSpace;
        var options = new HeapFileOptions { Size = free + (1L << 30), MaxSize = free + (1L << 30), Domain = PersistenceDomainKind.MappedFile };
        HeapFileException error = Assert.Throws<HeapFileException>(() => HeapFile.Create(path, options));
        Assert.Equal(HeapFileError.InsufficientSpace, error.Error);
        Assert.Contains("bytes are free on that file system", error.Message);
        Assert.False(File.Exists(path));
    }

    [Fact]
    public void Create_ExistingFile_ThrowsAlreadyExistsAndLeavesFileUntouched()
    {
        string path = _directory.File("existing.bin");
        File.WriteAllBytes(path, [1, 2, 3]);
        HeapFileException error = AssertRejectedUntouched(path, () => HeapFile.Create(path, MappedFile()));
        Assert.Equal(HeapFileError.AlreadyExists, error.Error);
        Assert.Contains("never reformatted", error.Message);
    }

    [Fact]
    public void Open_DamagedGeometry_ThrowsCorruptAndLeavesFileUntouched()
    {
        string path = CreateHeap();
        Patch(path, 32, 12345); // MaxSegments, covered by the geometry check
        HeapFileException error = AssertRejectedUntouched(path, () => HeapFile.Open(path, MappedFile()));
        Assert.Equal(HeapFileError.Corrupt, error.Error);
        Assert.Contains("superblock is damaged", error.Message);
    }

    [Fact]
    public void Open_PmemRequestedButLibraryMissing_ThrowsDomainUnavailableAndLeavesFileUntouched()
    {
        string path = CreateHeap();
        var options = new HeapFileOptions { Domain = PersistenceDomainKind.Pmem, PmemLibraryName = "libpmem-not-installed-for-test.so.1" };
        HeapFileException error = AssertRejectedUntouched(path, () => HeapFile.Open(path, options));
        Assert.Equal(HeapFileError.DomainUnavailable, error.Error);
        Assert.Contains("libpmem-not-installed-for-test.so.1", error.Message);
    }

    [Fact]
    public void Create_ThenReopen_KeepsRootsEpochClockAndCleanFlag()
    {
        string path = _directory.File("roots.heap");
        using (HeapFile file = HeapFile.Create(path, MappedFile()))
        {
            Assert.True(file.WasCleanShutdown);
            file.SetRoot(3, 0x1234);
            file.EpochClock = 77;
            file.DurableFrontier = 75;
        }

        using HeapFile reopened = HeapFile.Open(path, MappedFile());
        Assert.True(reopened.WasCleanShutdown);
        Assert.Equal(0x1234, reopened.GetRoot(3));
        Assert.Equal(77, reopened.EpochClock);
        Assert.Equal(75, reopened.DurableFrontier);
        Assert.Throws<ArgumentOutOfRangeException>(() => reopened.GetRoot(HeapFile.RootSlotCount));
    }

    /// <summary>
    /// The epoch clock and durable frontier decide what recovery keeps (tags up to max(frontier, clock - 2)): a value
    /// set by hand on a file a buffered heap uses, or before one opens it, made recovery keep versions that were never
    /// written back (raised) or drop durable ones (lowered), silently. Only the heap's advancer and recovery write them;
    /// no property of the file is settable from outside the library.
    /// </summary>
    [Fact]
    public void EpochWordsAndEveryOtherProperty_HaveNoPublicSetter()
    {
        foreach (System.Reflection.PropertyInfo property in typeof(HeapFile).GetProperties())
        {
            Assert.True(property.GetSetMethod() is null, $"HeapFile.{property.Name} has a public setter");
        }

        Assert.NotNull(typeof(HeapFile).GetProperty(nameof(HeapFile.EpochClock))!.GetGetMethod());
        Assert.NotNull(typeof(HeapFile).GetProperty(nameof(HeapFile.DurableFrontier))!.GetGetMethod());
    }

    [Fact]
    public void Open_AfterSimulatedCrash_ReportsUncleanShutdownAndKeepsPersistedRoots()
    {
        using var domain = new SimulatedPersistenceDomain(1 << 20);
        byte[] crashed, afterClose;
        using (HeapFile file = HeapFile.Create(domain))
        {
            file.SetRoot(0, 99);
            crashed = domain.Crash(seed: 1);
        }

        afterClose = domain.Crash(seed: 1);
        using (var crashedDomain = SimulatedPersistenceDomain.FromImage(crashed))
        using (HeapFile reopened = HeapFile.Open(crashedDomain))
        {
            Assert.False(reopened.WasCleanShutdown);
            Assert.Equal(99, reopened.GetRoot(0));
        }

        using var closedDomain = SimulatedPersistenceDomain.FromImage(afterClose);
        using HeapFile clean = HeapFile.Open(closedDomain);
        Assert.True(clean.WasCleanShutdown);
    }

    [Fact]
    public void Create_InterruptedAtAnyPoint_IsRejectedOrComplete()
    {
        using var domain = new SimulatedPersistenceDomain(1 << 20);
        for (long point = 0; point < 4; point++)
        {
            for (int seed = 0; seed < 10; seed++)
            {
                domain.ArmCrash(point, seed);
            }
        }

        using (HeapFile.Create(domain))
        {
        }

        int rejected = 0;
        foreach (SimulatedCrash crash in domain.CapturedCrashes)
        {
            using var crashed = SimulatedPersistenceDomain.FromImage(crash.Image);
            try
            {
                using HeapFile file = HeapFile.Open(crashed);
                Assert.True(crash.Point >= 2, $"point {crash.Point} seed {crash.Seed}: a heap opened before its geometry was durable");
                Assert.Equal(14, file.SegmentCount); // (1 MiB - superblock - table - 64 KiB sweep log) / 64 KiB
            }
            catch (HeapFileException e)
            {
                Assert.Equal(HeapFileError.NotAHeapFile, e.Error);
                rejected++;
            }
        }

        Assert.True(rejected > 0);
    }

    private static HeapFileOptions MappedFile() => new() { Size = 1L << 20, Domain = PersistenceDomainKind.MappedFile };

    private static HeapFileException AssertRejectedUntouched(string path, Func<HeapFile> open)
    {
        byte[] before = File.ReadAllBytes(path);
        DateTime written = File.GetLastWriteTimeUtc(path);
        HeapFileException error = Assert.Throws<HeapFileException>(() => open().Dispose());
        Assert.Equal(before, File.ReadAllBytes(path));
        Assert.Equal(written, File.GetLastWriteTimeUtc(path));
        return error;
    }

    private static void Patch(string path, long offset, ulong value)
    {
        using var stream = new FileStream(path, FileMode.Open, FileAccess.ReadWrite);
        byte[] word = new byte[8];
        BinaryPrimitives.WriteUInt64LittleEndian(word, value);
        RandomAccess.Write(stream.SafeFileHandle, word, offset);
    }

    private string CreateHeap()
    {
        string path = _directory.File($"{Guid.NewGuid():N}.heap");
        using (HeapFile.Create(path, MappedFile()))
        {
        }

        return path;
    }
}
