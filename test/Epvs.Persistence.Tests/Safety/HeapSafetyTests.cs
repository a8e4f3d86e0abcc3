using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.IO;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// Issue 10, memory safety and consistency: no public call sequence crashes the process, Dispose never unmaps under
/// a call in flight, a sparse file on a full disk is refused at open, and bad opens say what is wrong. The scenarios
/// that crashed the process before their fix run in a child process (<see cref="SafetyChild"/>), so a crash fails the
/// test instead of killing the test host; each race scenario also runs its control (the old behaviour, through a test
/// hook), which must crash — else the run is inconclusive.
/// </summary>
public sealed class HeapSafetyTests
{
    private static readonly Dictionary<string, string> NoEnvironment = new();
    private readonly ITestOutputHelper _output;

    public HeapSafetyTests(ITestOutputHelper output) => _output = output;

    [Fact]
    public void RawHeap_EveryCallAfterDispose_ThrowsObjectDisposedInsteadOfCrashing()
    {
        using var dir = new TempDirectory();
        (int code, string output) = TestProgram.RunChild(NoEnvironment, SafetyChild.Role, "raw-use-after-dispose", dir.File("a.heap"));
        Assert.True(code == SafetyChild.Survived, $"exit {code}: {output}");
    }

    [Fact]
    public void RawHeap_DisposeWhileThreadsAreCalling_NeverCrashes()
    {
        using var dir = new TempDirectory();
        (int code, string output) = TestProgram.RunChild(NoEnvironment, SafetyChild.Role, "raw-dispose-during-calls", dir.File("a.heap"));
        Assert.True(code == SafetyChild.Survived, $"exit {code}: {output}");

        // The control (Dispose without waiting for calls in flight) crashes only if Dispose lands while a worker is inside a call: up to three tries.
        (int controlCode, string controlOutput, _) = SafetyChild.RunControlUntilItDies("raw-dispose-during-calls", dir, _output, children: 3);
        Assert.SkipWhen(controlCode == SafetyChild.Survived, $"inconclusive: the control (unmapping under the callers) did not crash this run: {controlOutput}");
    }

    [Fact]
    public void Structures_OpenedOnADisposedHeap_ThrowObjectDisposedInsteadOfCrashing()
    {
        using var dir = new TempDirectory();
        (int code, string output) = TestProgram.RunChild(NoEnvironment, SafetyChild.Role, "structures-after-dispose", dir.File("a.heap"));
        _output.WriteLine($"exit {code}: {output}");
        Assert.True(code == SafetyChild.Survived, $"exit {code}: {output}");
    }

    /// <summary>
    /// Under a file size limit (RLIMIT_FSIZE), a pwrite, ftruncate or posix_fallocate past it raises SIGXFSZ, which kills
    /// the process: growth stops at the limit (the heap is full), a larger create is refused, and a file larger than the
    /// limit is refused a private mapping (Auto maps it shared). The control ignores the limit and is killed growing.
    /// </summary>
    [Fact]
    public void FileSizeLimit_GrowthCreateAndOpenPastIt_FailCleanlyInsteadOfSigxfsz()
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "RLIMIT_FSIZE and private mappings: Linux");
        using var dir = new TempDirectory();
        string path = dir.File("limited.heap");
        Assert.Equal(SafetyChild.BigFileValues, SafetyChild.FillUntilFull(path + ".big", new HeapFileOptions { Size = 8L << 20, MaxSize = 8L << 20, Domain = PersistenceDomainKind.MappedFile }, SafetyChild.BigFileValues));
        Assert.True(new FileInfo(path + ".big").Length > SafetyChild.FileSizeLimitBytes);

        (int code, string output) = TestProgram.RunChildUnderFileSizeLimit(SafetyChild.FileSizeLimitBytes, SafetyChild.Role, "file-size-limit", path);
        _output.WriteLine($"exit {code}: {output}");
        Assert.True(code == SafetyChild.Survived, $"exit {code}: {output}");

        const int KilledBySigxfsz = 128 + 25;
        (int controlCode, string controlOutput) = TestProgram.RunChildUnderFileSizeLimit(SafetyChild.FileSizeLimitBytes, SafetyChild.Role, "file-size-limit", dir.File("control.heap"), "control");
        _output.WriteLine($"control (the limit ignored): exit {controlCode}: {controlOutput}");
        Assert.True(controlCode == KilledBySigxfsz, $"the control was not killed by SIGXFSZ: exit {controlCode}: {controlOutput}");
    }

    /// <summary>
    /// RLIMIT_FSIZE lowered while the heap is open (setrlimit in the process, or prlimit --pid): growth and write-back
    /// use the limit read when the file was mapped, so the next growth past the new limit raises SIGXFSZ and kills the
    /// process (exit 128 + 25) instead of the heap being full (a probe's finding). Growth now reads the limit afresh.
    /// </summary>
    [Fact]
    public void FileSizeLimit_LoweredAfterOpen_HeapIsFullInsteadOfSigxfsz()
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "RLIMIT_FSIZE and private mappings: Linux");
        using var dir = new TempDirectory();
        (int code, string output) = TestProgram.RunChild(NoEnvironment, SafetyChild.Role, "file-size-limit-lowered-after-open", dir.File("lowered.heap"));
        _output.WriteLine($"exit {code}: {output}");
        Assert.True(code == SafetyChild.Survived, $"exit {code} (153 = SIGXFSZ): {output}");
    }

    /// <summary>
    /// RLIMIT_FSIZE lowered below the heap file's own size while it is open: the next write-back past it would raise
    /// SIGXFSZ. The heap fails instead (fail-stop, Sync reports it), and reopens with what a Sync acknowledged.
    /// </summary>
    [Fact]
    public void FileSizeLimit_LoweredBelowTheFile_FailsTheHeapInsteadOfSigxfsz()
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "RLIMIT_FSIZE and private mappings: Linux");
        using var dir = new TempDirectory();
        (int code, string output) = TestProgram.RunChild(NoEnvironment, SafetyChild.Role, "file-size-limit-lowered-below-file", dir.File("below.heap"));
        _output.WriteLine($"exit {code}: {output}");
        Assert.True(code == SafetyChild.Survived, $"exit {code} (153 = SIGXFSZ): {output}");
    }

    /// <summary>
    /// A 64 MiB heap with the default maximum size (a 1 GiB reservation) could not be opened in a process whose address
    /// space (RLIMIT_AS) has a few hundred MiB left, whatever the caller passed: Open ignored MaxSize, SharedMapping
    /// reserved the same, and the IOException advised lowering MaxSize (a probe's finding). An open's MaxSize now caps its
    /// growth and reservation. The refusal of the whole reservation names the address-space limit, for either mapping
    /// (it advised SharedMapping, which fails the same way there: a later probe's finding).
    /// </summary>
    [Fact]
    public void Open_UnderAnAddressSpaceLimit_HonoursASmallerMaxSize()
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "RLIMIT_AS and mmap reservations: Linux");
        using var dir = new TempDirectory();
        (int code, string output) = TestProgram.RunChild(NoEnvironment, SafetyChild.Role, "open-under-address-space-limit", dir.File("as.heap"));
        _output.WriteLine($"exit {code}: {output}");
        Assert.True(code == SafetyChild.Survived, $"exit {code}: {output}");
    }

    /// <summary>
    /// Out of file descriptors (RLIMIT_NOFILE): a failed open or create reports its own cause, and the file is closed
    /// and unlocked afterwards. Before the fix: AlreadyOpen (open) and InsufficientSpace (create). (With one descriptor
    /// left, the advancer's thread could not start, and the open's cleanup threw InvalidOperationException and left the
    /// file locked; that is tested in process below, since the runtime itself may abort then.)
    /// </summary>
    [Fact]
    public void BufferedHeap_OpenOrCreateOutOfFileDescriptors_ReportsTheCauseAndLeavesTheFileClosed()
    {
        Assert.SkipWhen(OperatingSystem.IsWindows(), "RLIMIT_NOFILE is a Unix limit");
        using var dir = new TempDirectory();
        (int code, string output) = TestProgram.RunChildUnderDescriptorLimit(2000, SafetyChild.Role, "open-out-of-descriptors", dir.File("a.heap"));
        _output.WriteLine($"exit {code}: {output}");
        Assert.True(code == SafetyChild.Survived, $"exit {code}: {output}");
    }

    /// <summary>
    /// The advancer's thread failing to start (the test hook stands for a thread the process cannot create): the open
    /// throws that exception, the allocator is detached, and the file — the heap's own or the caller's — opens again
    /// with every entry. Before the fix the owner's cleanup threw InvalidOperationException (the file "still used by a
    /// heap") in place of the cause and left the file locked (the next open: AlreadyOpen), and a caller's file refused
    /// every later heap.
    /// </summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void BufferedHeap_OpenWhoseAdvancerCannotStart_ThrowsTheCauseAndLeavesTheFileReusable(bool callersFile)
    {
        using var dir = new TempDirectory();
        string path = dir.File("a.heap");
        var fileOptions = new HeapFileOptions { Size = 1L << 20, Domain = PersistenceDomainKind.MappedFile };
        using (BufferedDurableHeap created = BufferedDurableHeap.Create(path, fileOptions))
        {
            var map = new PersistentHashMap<long, long>(created, typeId: 1);
            for (long k = 0; k < 50; k++)
            {
                map.Set(k, k + 1);
            }
        }

        var failing = new BufferedDurableHeapOptions { StartingAdvancerForTesting = () => throw new OutOfMemoryException("simulated: no thread for the advancer") };
        if (callersFile)
        {
            using HeapFile file = HeapFile.Open(path, fileOptions);
            OutOfMemoryException e = Assert.Throws<OutOfMemoryException>(() => BufferedDurableHeap.Open(file, failing));
            Assert.Contains("simulated", e.Message, StringComparison.Ordinal);
            using BufferedDurableHeap again = BufferedDurableHeap.Open(file);
            Assert.Equal(50, new PersistentHashMap<long, long>(again, typeId: 1).Count);
        }
        else
        {
            OutOfMemoryException e = Assert.Throws<OutOfMemoryException>(() => BufferedDurableHeap.Open(path, fileOptions, failing));
            Assert.Contains("simulated", e.Message, StringComparison.Ordinal);
        }

        using BufferedDurableHeap reopened = BufferedDurableHeap.Open(path, fileOptions);
        var reopenedMap = new PersistentHashMap<long, long>(reopened, typeId: 1);
        Assert.Equal(50, reopenedMap.Count);
        Assert.True(reopenedMap.TryGetValue(49, out long value) && value == 50);
    }

    /// <summary>
    /// A StateMachineFaulted handler that disposes the heap when the transition's critical section fails, run on the
    /// advancer's thread inside its cycle, on a Sync caller inside the cycle it runs, or on a thread ending an operation:
    /// its Dispose returns or throws InvalidOperationException at once (it must not wait for the cycle it is called
    /// from), nothing crashes, the heap is then disposable and the file reopens.
    /// </summary>
    [Theory]
    [InlineData("advancer")]
    [InlineData("sync")]
    [InlineData("leave")]
    public void BufferedHeap_DisposeFromAStateMachineFaultedHandler_ThrowsOrWorksWithoutDeadlockOrCrash(string where)
    {
        using var dir = new TempDirectory();
        (int code, string output) = TestProgram.RunChild(NoEnvironment, SafetyChild.Role, "dispose-in-fault-handler-" + where, dir.File("a.heap"));
        _output.WriteLine($"exit {code}: {output}");
        Assert.SkipWhen(code == SafetyChild.Inconclusive, $"inconclusive: {output}");
        Assert.True(code == SafetyChild.Survived, $"exit {code}: {output}");
    }

    [Fact]
    public void BufferedHeap_OnACallersFile_RefusesTheFileAllocatorAndDomainDisposeWhileItRuns()
    {
        using var dir = new TempDirectory();
        (int code, string output) = TestProgram.RunChild(NoEnvironment, SafetyChild.Role, "buffered-file-disposed-first", dir.File("a.heap"));
        Assert.True(code == SafetyChild.Survived, $"exit {code}: {output}");
    }

    [Fact]
    public void Domain_DisposedUnderAHeapFile_IsRefusedOrClosesTheFileFirst()
    {
        using var dir = new TempDirectory();
        (int code, string output) = TestProgram.RunChild(NoEnvironment, SafetyChild.Role, "domain-disposed-under-file", dir.File("a.heap"));
        Assert.True(code == SafetyChild.Survived, $"exit {code}: {output}");
    }

    [Fact]
    public void BufferedHeap_DisposeWhileAThreadIsInsideAnOperation_TimesOutWithoutCrashingAndReleasesTheLock()
    {
        using var dir = new TempDirectory();
        (int code, string output) = TestProgram.RunChild(NoEnvironment, SafetyChild.Role, "durable-dispose-during-operation", dir.File("a.heap"));
        Assert.True(code == SafetyChild.Survived, $"exit {code}: {output}");

        (int controlCode, string controlOutput) = TestProgram.RunChild(NoEnvironment, SafetyChild.Role, "durable-dispose-during-operation", dir.File("b.heap"), "control");
        _output.WriteLine($"control (Dispose unmapping under the operation): exit {controlCode}");
        Assert.SkipWhen(controlCode == SafetyChild.Survived, $"inconclusive: the control did not crash this run: {controlOutput}");
        Assert.NotEqual(SafetyChild.Survived, controlCode);
    }

    [Fact]
    public void BufferedHeap_AllocationsInsideAnOperationThatOutlivesDispose_DoNotCrash()
    {
        using var dir = new TempDirectory();
        (int code, string output) = TestProgram.RunChild(NoEnvironment, SafetyChild.Role, "durable-allocate-after-dispose", dir.File("a.heap"));
        Assert.True(code == SafetyChild.Survived, $"exit {code}: {output}");

        (int controlCode, string controlOutput) = TestProgram.RunChild(NoEnvironment, SafetyChild.Role, "durable-allocate-after-dispose", dir.File("b.heap"), "control");
        _output.WriteLine($"control (Dispose unmapping under the operation's allocations): exit {controlCode}");
        Assert.SkipWhen(controlCode == SafetyChild.Survived, $"inconclusive: the control did not crash this run: {controlOutput}");
        Assert.NotEqual(SafetyChild.Survived, controlCode);
    }

    [Fact]
    public void Open_SparseCopyOnAFullFileSystem_ReportsInsufficientSpaceInsteadOfSigbus()
    {
        using var dir = new TempDirectory();
        string source = dir.File("source.heap");
        using (PersistentHeap heap = PersistentHeap.Create(source, new HeapFileOptions { Size = 8L << 20, Domain = PersistenceDomainKind.MappedFile }))
        {
            heap.GetPayload(heap.Allocate(100, 1)).Fill(3);
        }

        OpenCopiesOnAFullTmpfs(dir, source, "1m", copy => { }, "open-sparse-on-full-disk", "no preallocation at open");
    }

    /// <summary>
    /// A probe (disk faults): the libpmem domain maps the whole file, a grown heap's spare segment beyond its recorded
    /// size too, but the open reserved the heap's part only; with that tail a hole (a sparse copy) on a full file system,
    /// the heap's growth into it ended the process with SIGBUS. The open now reserves all the domain maps and refuses
    /// the file (<see cref="HeapFileError.InsufficientSpace"/>). Control: the heap part only (the old reservation).
    /// </summary>
    [Fact]
    public void Open_PmemDomainOnASparseTailOnAFullFileSystem_ReportsInsufficientSpaceInsteadOfSigbus()
    {
        using var dir = new TempDirectory();
        string source = dir.File("source.heap");
        using (var heap = BufferedDurableHeap.Create(source, new HeapFileOptions { Size = 1L << 20, MaxSize = 64L << 20, Domain = PersistenceDomainKind.MappedFile }))
        {
            new PersistentByteMap<long>(heap, typeId: 1).Set(1, new byte[100]);
        }

        long heapSize;
        using (HeapFile file = HeapFile.Open(source, new HeapFileOptions { Domain = PersistenceDomainKind.MappedFile }))
        {
            heapSize = file.Size;
        }

        Assert.True(new FileInfo(source).Length > heapSize, "the file has no spare segment beyond the heap");
        string heapPart = heapSize.ToString(System.Globalization.CultureInfo.InvariantCulture);
        OpenCopiesOnAFullTmpfs(dir, source, "4m", copy => Assert.True(Run("fallocate", "-o", "0", "-l", heapPart, copy), "the heap part allocated"), "open-pmem-sparse-tail-on-full-disk", "the heap part reserved only");
    }

    /// <summary>
    /// Review: the libpmem domain maps the whole file, but nothing is stored past the heap's recorded maximum, so a file
    /// longer than that (here a heap that can never grow, extended by hand) opens on a full file system with its tail a
    /// hole: the open reserves up to the recorded maximum only (the first version of the fix refused it).
    /// </summary>
    [Fact]
    public void Open_PmemDomainOnASparseTailBeyondTheRecordedMaximum_IsNotRefused()
    {
        using var dir = new TempDirectory();
        using var tmpfs = SmallTmpfs.MountOrSkip(dir, "size=4m");
        string path = tmpfs.File("a.heap");
        long size;
        using (PersistentHeap heap = PersistentHeap.Create(path, new HeapFileOptions { Size = 1L << 20, MaxSize = 1L << 20, Domain = PersistenceDomainKind.MappedFile }))
        {
            size = heap.File.Size;
            heap.GetPayload(heap.Allocate(100, 1)).Fill(3);
        }

        Assert.True(Run("truncate", "-s", "64M", path), "the file extended");
        tmpfs.Fill();
        using (PersistentHeap heap = PersistentHeap.Open(path, new HeapFileOptions { Domain = PersistenceDomainKind.Pmem }))
        {
            Assert.Equal(PersistenceDomainKind.Pmem, heap.File.Domain.Kind);
            Assert.Equal(size, heap.File.Size);
        }
    }

    /// <summary>
    /// Copies <paramref name="source"/> sparsely (twice) onto a tmpfs of <paramref name="size"/>, each copy then prepared,
    /// fills the file system, and runs the child <paramref name="role"/> on one copy (it must survive, reporting the
    /// sparse file) and its control on the other (it must not).
    /// </summary>
    private void OpenCopiesOnAFullTmpfs(TempDirectory dir, string source, string size, Action<string> prepare, string role, string control)
    {
        using var tmpfs = SmallTmpfs.MountOrSkip(dir, "size=" + size);
        foreach (string name in new[] { "a.heap", "b.heap" })
        {
            string copy = tmpfs.File(name);
            Assert.True(Run("cp", "--sparse=always", source, copy), "sparse copy");
            prepare(copy);
        }

        tmpfs.Fill();
        (int code, string output) = TestProgram.RunChild(NoEnvironment, SafetyChild.Role, role, tmpfs.File("a.heap"));
        Assert.True(code == SafetyChild.Survived, $"exit {code}: {output}");
        Assert.Contains("sparse", output, StringComparison.Ordinal);

        (int controlCode, string controlOutput) = TestProgram.RunChild(NoEnvironment, SafetyChild.Role, role, tmpfs.File("b.heap"), "control");
        _output.WriteLine($"control ({control}): exit {controlCode}");
        Assert.SkipWhen(controlCode == SafetyChild.Survived, $"inconclusive: the control did not fail: {controlOutput}");
        Assert.NotEqual(SafetyChild.Survived, controlCode);
    }

    /// <summary>
    /// A probe (disk faults): libpmem loads but <c>pmem_map_file</c> fails (simulated; a file system that refuses its
    /// mapping): <see cref="PersistenceDomainKind.Auto"/> threw libpmem's IOException naming a /proc/self/fd path instead
    /// of falling back to the mapped-file domain, and <see cref="PersistenceDomainKind.Pmem"/> did not report
    /// <see cref="HeapFileError.DomainUnavailable"/>. Child process: the hook is process-wide.
    /// </summary>
    [Fact]
    public void Open_WhenLibpmemRefusesTheMapping_AutoFallsBackAndPmemReportsDomainUnavailable()
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "libpmem (Linux)");
        using var dir = new TempDirectory();
        AssertChildSurvives("pmem-map-refused", dir.File("a.heap"));
    }

    /// <summary>
    /// A probe: ext4 turned read-only after an I/O error still opens the file for writing, and mmap then fails with EROFS,
    /// which Open reported as a plain IOException advising to lower MaxSize (the advice for a commit-limit failure). It is
    /// now <see cref="HeapFileError.ReadOnly"/>, and the advice comes with ENOMEM only (errno simulated, in a child: the
    /// hook is process-wide).
    /// </summary>
    [Fact]
    public void Open_WhenTheMappingFails_ReportsReadOnlyForErofs_AndTheCommitAdviceOnlyForEnomem()
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "mmap errno mapping (Unix)");
        using var dir = new TempDirectory();
        AssertChildSurvives("open-mmap-fails", dir.File("a.heap"));
    }

    /// <summary>
    /// A probe: Create ignored a failed fsync of the new file's directory (unnamed files), and never synced the directory
    /// when creating in place (file systems without unnamed files), so a Create and Sync could be acknowledged while the
    /// file's name was not durable. A failed directory sync now fails Create and removes the file (errno simulated, in a
    /// child: the hook is process-wide).
    /// </summary>
    [Fact]
    public void Create_WhenTheDirectorysFsyncFails_ThrowsAndLeavesNoFile()
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "directory fsync (Linux)");
        using var dir = new TempDirectory();
        AssertChildSurvives("create-directory-sync-fails", dir.File("a.heap"));
    }

    /// <summary>
    /// A review's finding: a failed creation whose file could not be removed either kept the mapping, the descriptor and
    /// the lock for the life of the process, and said the file was removed (in a child: the hooks are process-wide).
    /// </summary>
    [Fact]
    public void Create_WhenItFailsAndItsFileCannotBeRemoved_SaysSoAndReleasesTheFile()
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "directory fsync (Linux)");
        using var dir = new TempDirectory();
        AssertChildSurvives("create-removal-fails", dir.File("a.heap"));
    }

    [Fact]
    public void Open_OnAReadOnlyMount_ReportsReadOnlyNotAlreadyOpen()
    {
        using var dir = new TempDirectory();
        string inner = Path.Combine(dir.Path, "data");
        string view = Path.Combine(dir.Path, "view");
        Directory.CreateDirectory(inner);
        Directory.CreateDirectory(view);
        PersistentHeap.Create(Path.Combine(inner, "a.heap"), new HeapFileOptions { Size = 1L << 20 }).Dispose();
        Assert.SkipUnless(Run("mount", "--bind", "-o", "ro", inner, view), "needs root and mount(8) for a read-only bind mount");
        try
        {
            HeapFileException e = Assert.Throws<HeapFileException>(() => PersistentHeap.Open(Path.Combine(view, "a.heap")));
            Assert.Equal(HeapFileError.ReadOnly, e.Error);
            Assert.Contains("read-only file system", e.Message, StringComparison.Ordinal);
        }
        finally
        {
            Run("umount", view);
        }
    }

    /// <summary>
    /// A heap that may still grow but whose file cannot (its file system is full) fails with the advice for that. Its
    /// last free segment is kept for deletes from then on (a growth leaves a spare segment of file for it: see
    /// GrowthRefusedDeleteTests), so deleting still makes room, and the room takes new values.
    /// </summary>
    [Fact]
    public void HeapFull_OnAFullFileSystem_SaysTheFileCouldNotGrow_AndStillDeletes()
    {
        using var dir = new TempDirectory();
        using var tmpfs = SmallTmpfs.MountOrSkip(dir, "size=2m");
        var options = new HeapFileOptions { Size = 1L << 20, MaxSize = 64L << 20, Domain = PersistenceDomainKind.MappedFile, MappedFileWriteBack = MappedFileWriteBack.SharedMapping };
        using BufferedDurableHeap heap = BufferedDurableHeap.Create(tmpfs.File("a.heap"), options, new BufferedDurableHeapOptions { AdvancePeriod = System.Threading.Timeout.InfiniteTimeSpan });
        var map = new PersistentByteMap<long>(heap, typeId: 1);
        long written = 0;
        InsufficientMemoryException full = Assert.Throws<InsufficientMemoryException>(() =>
        {
            for (; written < 100_000; written++)
            {
                map.Set(written, new byte[1000]);
            }
        });
        Assert.Contains("could not grow", full.Message, StringComparison.Ordinal);
        Assert.Contains("kept for deletes", full.Message, StringComparison.Ordinal);
        heap.Sync();
        for (long key = 0; key < 50; key++)
        {
            Assert.True(map.Remove(key));
        }

        heap.Sync();
        heap.Sync();
        for (long key = 0; key < 20; key++)
        {
            map.Set(written + key, new byte[1000]);
        }
    }

    [Theory]
    [InlineData(0x2000_0000_0000_0000UL)] // offset + words * 8 wraps around to offset: the old check passed, the hash read far outside the mapping
    [InlineData(0x1FFF_FFFF_FFFF_FFFFUL)] // words * 8 wraps negative
    [InlineData(ulong.MaxValue)]
    public void Open_SavedStateLengthThatOverflows_IsRejectedWithoutCrashing(ulong words)
    {
        using var dir = new TempDirectory();
        string path = dir.File("a.heap");
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, new HeapFileOptions { Size = 1L << 20, Domain = PersistenceDomainKind.MappedFile }))
        {
            new PersistentHashMap<long, long>(heap, typeId: 1).Set(1, 2);
        }

        using (FileStream f = new FileStream(path, FileMode.Open, FileAccess.ReadWrite))
        {
            byte[] saved = new byte[8];
            RandomAccess.Read(f.SafeFileHandle, saved, HeapLayout.SavedStateOffset);
            Assert.NotEqual(0L, BitConverter.ToInt64(saved)); // the clean shutdown saved a state
            RandomAccess.Write(f.SafeFileHandle, BitConverter.GetBytes(words), HeapLayout.SavedStateWordsOffset);
        }

        (int code, string output) = TestProgram.RunChild(NoEnvironment, SafetyChild.Role, "open-buffered", path);
        Assert.True(code == SafetyChild.Survived, $"exit {code}: {output}");
        Assert.Contains("opened: fast reopen False", output, StringComparison.Ordinal);
    }

    [Fact]
    public void Open_ADirectory_SaysItIsADirectory()
    {
        using var dir = new TempDirectory();
        HeapFileException e = Assert.Throws<HeapFileException>(() => HeapFile.Open(dir.Path));
        Assert.Contains("is a directory", e.Message, StringComparison.Ordinal);
        e = Assert.Throws<HeapFileException>(() => BufferedDurableHeap.Open(dir.Path));
        Assert.Contains("is a directory", e.Message, StringComparison.Ordinal);
    }

    [Fact]
    public void Open_ARawHeapFileAsABufferedHeap_IsRefusedBeforeAnyWrite()
    {
        using var dir = new TempDirectory();
        string path = dir.File("raw.heap");
        using (PersistentHeap raw = PersistentHeap.Create(path, new HeapFileOptions { Size = 1L << 20 }))
        {
            raw.Persist(raw.Allocate(64, typeId: 1));
        }

        byte[] before = File.ReadAllBytes(path);
        HeapFileException e = Assert.Throws<HeapFileException>(() => BufferedDurableHeap.Open(path));
        Assert.Equal(HeapFileError.WrongHeapKind, e.Error);
        Assert.Equal(before, File.ReadAllBytes(path));

        using (PersistentHeap raw = PersistentHeap.Open(path))
        {
            Assert.Equal(1, raw.RecoveryStatistics.LiveBlocks);
        }
    }

    [Fact]
    public void Open_ABufferedHeapFileAsARawHeap_IsRefusedBeforeAnyWrite()
    {
        using var dir = new TempDirectory();
        string path = dir.File("durable.heap");
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, new HeapFileOptions { Size = 1L << 20 }))
        {
            new PersistentHashMap<long, long>(heap, typeId: 1).Set(1, 2);
        }

        byte[] before = File.ReadAllBytes(path);
        HeapFileException e = Assert.Throws<HeapFileException>(() => PersistentHeap.Open(path));
        Assert.Equal(HeapFileError.WrongHeapKind, e.Error);
        Assert.Equal(before, File.ReadAllBytes(path));
    }

    [Theory]
    [InlineData(1L)]
    [InlineData(3L)]
    [InlineData(6L)]
    [InlineData(8L)]
    [InlineData(10L)]
    public void Open_AnOlderFormatVersion_IsRefusedAsOlderAndUnchanged(long version)
    {
        using var dir = new TempDirectory();
        string path = dir.File($"v{version}.heap");
        PersistentHeap.Create(path, new HeapFileOptions { Size = 1L << 20 }).Dispose();
        using (FileStream f = File.OpenWrite(path))
        {
            RandomAccess.Write(f.SafeFileHandle, BitConverter.GetBytes(version), HeapLayout.FormatVersionOffset);
        }

        byte[] before = File.ReadAllBytes(path);
        HeapFileException e = Assert.Throws<HeapFileException>(() => PersistentHeap.Open(path));
        Assert.Equal(HeapFileError.OlderFormatVersion, e.Error);
        Assert.Equal(before, File.ReadAllBytes(path));
    }

    [Theory]
    [InlineData(-5.0)]
    [InlineData(0.0)]
    public void Create_WithANonPositiveMaxVersionAge_IsRefusedAndLeavesNoFileBehind(double milliseconds)
    {
        AssertRefusedLeavingNoFile(new BufferedDurableHeapOptions { MaxVersionAge = TimeSpan.FromMilliseconds(milliseconds) }, nameof(BufferedDurableHeapOptions.MaxVersionAge));
    }

    [Theory]
    [InlineData(0.0)]
    [InlineData(30.0)]
    public void Create_WithASyncTimeoutNoWaitTakes_IsRefusedAndLeavesNoFileBehind(double days)
    {
        // Thirty days is more than a monitor or task wait takes: the timeout used to pass validation and then throw out
        // of Sync, of BeginOperation's back-pressure and of Dispose, which left the file mapped and locked.
        AssertRefusedLeavingNoFile(new BufferedDurableHeapOptions { SyncTimeout = TimeSpan.FromDays(days) }, nameof(BufferedDurableHeapOptions.SyncTimeout));
    }

    /// <summary>Creating a heap with <paramref name="bad"/> throws for <paramref name="option"/> and leaves no file behind.</summary>
    private static void AssertRefusedLeavingNoFile(BufferedDurableHeapOptions bad, string option)
    {
        using var dir = new TempDirectory();
        string path = dir.File("bad-option.heap");
        ArgumentOutOfRangeException e = Assert.Throws<ArgumentOutOfRangeException>(() => BufferedDurableHeap.Create(path, new HeapFileOptions { Size = 1L << 20 }, bad));
        Assert.Equal(option, e.ParamName);
        Assert.False(File.Exists(path));
    }

    [Theory]
    [InlineData(-5.0)]
    [InlineData(30.0 * 24 * 3600 * 1000)]
    public void SyncAndAdvanceVersion_WithATimeoutNoWaitTakes_ThrowArgumentOutOfRange_AndTheHeapStillCloses(double milliseconds)
    {
        using var dir = new TempDirectory();
        string path = dir.File("sync-timeout.heap");
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, new HeapFileOptions { Size = 1L << 20 }, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan }))
        {
            var map = new PersistentHashMap<long, long>(heap, typeId: 1);
            map.Set(1, 10);
            TimeSpan timeout = TimeSpan.FromMilliseconds(milliseconds);
            Assert.Equal("timeout", Assert.Throws<ArgumentOutOfRangeException>(() => heap.Sync(timeout)).ParamName);
            Assert.Equal("timeout", Assert.Throws<ArgumentOutOfRangeException>(() => heap.AdvanceVersion(timeout)).ParamName);
            heap.Sync(Timeout.InfiniteTimeSpan);
        }

        // Closed cleanly: the file opens again (its lock released) with the synced entry.
        using BufferedDurableHeap reopened = BufferedDurableHeap.Open(path);
        Assert.True(reopened.Recovery.WasCleanShutdown);
        Assert.True(new PersistentHashMap<long, long>(reopened, typeId: 1).TryGetValue(1, out long value) && value == 10);
    }

    [Fact]
    public void Create_WithInvalidDurabilityOptions_LeavesNoFileBehind()
    {
        using var dir = new TempDirectory();
        string path = dir.File("bad.heap");
        var bad = new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromMilliseconds(-5) };
        Assert.Throws<ArgumentOutOfRangeException>(() => BufferedDurableHeap.Create(path, new HeapFileOptions { Size = 1L << 20 }, bad));
        Assert.False(File.Exists(path));

        // A retry with valid options succeeds (it used to find the path taken).
        using BufferedDurableHeap heap = BufferedDurableHeap.Create(path, new HeapFileOptions { Size = 1L << 20 });
    }

    /// <summary>
    /// A probe (soak, options varied between reopens): a period or age above int.MaxValue milliseconds was refused with
    /// "must be positive", and an undefined domain with advice for the simulated one; each message now says what is wrong.
    /// </summary>
    [Fact]
    public void Open_WithAnOutOfRangeOption_SaysWhatIsWrong()
    {
        using var dir = new TempDirectory();
        string path = dir.File("options.heap");
        BufferedDurableHeap.Create(path, new HeapFileOptions { Size = 1L << 20 }).Dispose();
        TimeSpan hundredDays = TimeSpan.FromDays(100);
        foreach (var options in new[] { new BufferedDurableHeapOptions { AdvancePeriod = hundredDays }, new BufferedDurableHeapOptions { MaxVersionAge = hundredDays } })
        {
            var e = Assert.Throws<ArgumentOutOfRangeException>(() => BufferedDurableHeap.Open(path, null, options).Dispose());
            Assert.Contains("at most int.MaxValue milliseconds", e.Message, StringComparison.Ordinal);
        }

        var domain = Assert.Throws<ArgumentOutOfRangeException>(() => BufferedDurableHeap.Open(path, new HeapFileOptions { Domain = (PersistenceDomainKind)77 }).Dispose());
        Assert.Contains("is not a PersistenceDomainKind value", domain.Message, StringComparison.Ordinal);
        var simulated = Assert.Throws<ArgumentOutOfRangeException>(() => BufferedDurableHeap.Open(path, new HeapFileOptions { Domain = PersistenceDomainKind.Simulated }).Dispose());
        Assert.Contains("SimulatedPersistenceDomain", simulated.Message, StringComparison.Ordinal);

        // None of the refusals changed the file: it still reopens fast (its clean-shutdown mark kept).
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(path);
        Assert.True(heap.Recovery.FastReopen, heap.Recovery.FastReopenRejection);
    }

    [Theory]
    [InlineData("superblock")]
    [InlineData("descriptors")]
    [InlineData("blocks")]
    [InlineData("blocks-crashed")]
    public void EverySingleBitFlip_IsRefusedOrRecoveredExactly_NeverSilentlyWrongNorACrash(string region)
    {
        using var dir = new TempDirectory();
        (int code, string output) = TestProgram.RunChild(NoEnvironment, BitFlipSweep.Role, dir.Path, region);
        _output.WriteLine(output);
        Assert.True(code == SafetyChild.Survived, $"exit {code}: {output}");

        using var controlDir = new TempDirectory();
        (int controlCode, string controlOutput) = TestProgram.RunChild(NoEnvironment, BitFlipSweep.Role, controlDir.Path, region, "control");
        _output.WriteLine($"control (seals ignored): exit {controlCode}: {controlOutput}");
        Assert.SkipWhen(controlCode == SafetyChild.Survived, "inconclusive: with the seals ignored no flip was silently wrong, so the sweep proves nothing");
    }

    [Fact]
    public void Seal_EverySingleBitFlipOfASealedWord_FailsItsCheck()
    {
        int[] offsets = { HeapLayout.HeapSizeOffset, HeapLayout.CleanShutdownOffset, HeapLayout.EpochClockOffset, HeapLayout.DurableFrontierOffset, HeapLayout.HeapKindOffset };
        var random = new Random(20261122);
        foreach (int offset in offsets)
        {
            for (int sample = 0; sample < 200; sample++)
            {
                long value = sample < 3 ? sample : random.NextInt64(0, 1L << HeapLayout.SealedValueBits);
                ulong word = HeapLayout.Seal(value, offset);
                Assert.True(HeapLayout.TryUnseal(word, offset, out long back) && back == value);
                for (int bit = 0; bit < 64; bit++)
                {
                    Assert.False(HeapLayout.TryUnseal(word ^ (1UL << bit), offset, out _), $"offset {offset}, value {value}: flipping bit {bit} went unnoticed");
                }
            }
        }

        Assert.Throws<ArgumentOutOfRangeException>(() => HeapLayout.Seal(1L << HeapLayout.SealedValueBits, HeapLayout.EpochClockOffset));
    }

    [Fact]
    public void Descriptor_EverySingleBitFlip_FailsItsCheck()
    {
        var random = new Random(20261123);
        for (long slot = 0; slot < 1 << 16; slot++)
        {
            // Every slot: the zeroed word is damage, never a free segment (format 5 binds the check to the slot).
            Assert.False(HeapLayout.IsValidDescriptor(0, slot), $"a zeroed descriptor in slot {slot} must be damage, not a free segment");
        }

        Assert.False(HeapLayout.IsValidDescriptor(0, (1 << 24) - 1));
        for (int sample = 0; sample < 2000; sample++)
        {
            long slot = sample < 3 ? sample : random.Next(1 << 24);
            Assert.True(HeapLayout.IsValidDescriptor(HeapLayout.InitialDescriptor(slot), slot));
            ulong role = HeapLayout.RoleFree + (ulong)random.Next(4);
            ulong payload = role == HeapLayout.RoleSmall ? (ulong)random.Next(SizeClasses.Count) : (ulong)random.Next(1 << 20);
            ulong descriptor = HeapLayout.Descriptor((uint)random.Next(), role, payload, slot);
            Assert.True(HeapLayout.IsValidDescriptor(descriptor, slot));
            for (int bit = 0; bit < 64; bit++)
            {
                Assert.False(HeapLayout.IsValidDescriptor(descriptor ^ (1UL << bit), slot), $"descriptor 0x{descriptor:X16} in slot {slot}: flipping bit {bit} went unnoticed");
            }
        }
    }

    [Fact]
    public void Descriptor_OfOneSlot_FailsItsCheckInTheOtherSlots()
    {
        // A descriptor copied or swapped into another slot would make recovery read that segment with another block
        // size; with 12 check bits a copy passes in about one slot in 4096, so none of the nearby slots may take it.
        var random = new Random(20261124);
        int accepted = 0;
        for (int sample = 0; sample < 500; sample++)
        {
            long slot = random.Next(1 << 20);
            ulong descriptor = HeapLayout.Descriptor((uint)random.Next(4), HeapLayout.RoleSmall, (ulong)random.Next(SizeClasses.Count), slot);
            for (long other = Math.Max(0, slot - 8); other <= slot + 8; other++)
            {
                if (other != slot && HeapLayout.IsValidDescriptor(descriptor, other))
                {
                    accepted++;
                }
            }
        }

        // 8,000 foreign slots: about 2 are expected to collide by chance; many more would mean the slot is not covered.
        Assert.True(accepted <= 10, $"{accepted} of 8000 foreign slots accepted a descriptor");
    }

    /// <summary>Runs a program to its end (30 s at most); whether it exited 0.</summary>
    /// <summary>Runs the child <paramref name="role"/> on <paramref name="path"/> and asserts it survived (its output in the test's).</summary>
    private void AssertChildSurvives(string role, string path)
    {
        (int code, string output) = TestProgram.RunChild(NoEnvironment, SafetyChild.Role, role, path);
        _output.WriteLine(output);
        Assert.True(code == SafetyChild.Survived, $"exit {code}: {output}");
    }

    internal static bool Run(string file, params string[] args)
    {
        var start = new ProcessStartInfo(file) { RedirectStandardError = true, RedirectStandardOutput = true };
        foreach (string a in args)
        {
            start.ArgumentList.Add(a);
        }

        try
        {
            using Process p = Process.Start(start)!;
            p.StandardOutput.ReadToEnd();
            p.StandardError.ReadToEnd();
            return p.WaitForExit(30_000) && p.ExitCode == 0;
        }
        catch (System.ComponentModel.Win32Exception)
        {
            return false;
        }
    }
}
