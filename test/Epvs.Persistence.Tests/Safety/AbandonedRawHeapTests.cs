using System;
using System.IO;
using System.Linq;
using System.Runtime.CompilerServices;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>A raw heap abandoned without Dispose, in every domain: once collected, its file reopens in the process.</summary>
public sealed class AbandonedRawHeapTests
{
    private readonly ITestOutputHelper _output;

    public AbandonedRawHeapTests(ITestOutputHelper output) => _output = output;

    /// <summary>
    /// A heap file abandoned without Dispose: once collected, its mapping is unmapped (SafeMappingHandle's finalizer) and
    /// its descriptor, with the exclusive lock, closed (the mapped-file domain's finalizer gives back its reference on the
    /// file's handle), so the process can open the file again. A probe on an outdated clone reported the mapped-file
    /// domain keeping them; kept as a regression test of every domain.
    /// </summary>
    [Theory]
    [InlineData(PersistenceDomainKind.Pmem, null)]
    [InlineData(PersistenceDomainKind.MappedFile, MappedFileWriteBack.PrivateMapping)]
    [InlineData(PersistenceDomainKind.MappedFile, MappedFileWriteBack.SharedMapping)]
    [InlineData(PersistenceDomainKind.Auto, null)]
    public void AbandonedHeapFile_AfterCollection_ReleasesLockAndDescriptor(PersistenceDomainKind kind, MappedFileWriteBack? writeBack)
    {
        using var dir = new TempDirectory();
        string path = dir.File("abandoned.heap");
        var options = new HeapFileOptions { Size = 1L << 20, Domain = kind, MappedFileWriteBack = writeBack ?? MappedFileWriteBack.Auto };
        string chosen = CreateAndAbandon(path, options);
        for (int i = 0; i < 3; i++)
        {
            GC.Collect();
            GC.WaitForPendingFinalizers();
        }

        int descriptors = Directory.EnumerateFiles("/proc/self/fd").Count(fd => Resolve(fd)?.StartsWith(dir.Path, StringComparison.Ordinal) == true);
        int mappings = File.ReadLines("/proc/self/maps").Count(l => l.Contains(dir.Path, StringComparison.Ordinal));
        _output.WriteLine($"{kind}/{writeBack} -> {chosen}: descriptors {descriptors}, mappings {mappings}");
        Exception? reopen = Record.Exception(() =>
        {
            using PersistentHeap heap = PersistentHeap.Open(path, options);
        });
        Assert.Null(reopen);
        Assert.Equal(0, mappings);
        Assert.Equal(0, descriptors);
    }

    [MethodImpl(MethodImplOptions.NoInlining)]
    private static string CreateAndAbandon(string path, HeapFileOptions options)
    {
        PersistentHeap heap;
        try
        {
            heap = PersistentHeap.Create(path, options);
        }
        catch (HeapFileException e) when (e.Error == HeapFileError.DomainUnavailable)
        {
            Assert.Skip($"the domain is not available here: {e.Message}");
            throw;
        }

        PayloadRef block = heap.Allocate(100, 3);
        heap.GetPayload(block).Fill(7);
        heap.Persist(block);
        return $"{heap.File.Domain.Kind}/{heap.File.MappedFileWriteBack}";
    }

    private static string? Resolve(string link)
    {
        try
        {
            return new FileInfo(link).LinkTarget;
        }
        catch (IOException)
        {
            return null;
        }
    }

    /// <summary>
    /// A probe's finding: a library named as libpmem that loads but is not libpmem (it lacks an export) stayed mapped for
    /// the process's life. It is unloaded again.
    /// </summary>
    [Fact]
    public void ALibraryThatIsNotLibpmem_IsUnloadedAfterTheRefusal()
    {
        Assert.SkipUnless(OperatingSystem.IsLinux() && File.Exists("/usr/lib/x86_64-linux-gnu/libz.so.1"), "needs Linux x64 with libz.so.1");
        static bool Mapped() => File.ReadLines("/proc/self/maps").Any(l => l.Contains("libz.so.1", StringComparison.Ordinal));
        Assert.SkipWhen(Mapped(), "libz.so.1 is already loaded in this process");
        Assert.False(PmemLibrary.TryLoad("libz.so.1", out string? failure));
        Assert.Contains("does not export", failure, StringComparison.Ordinal);
        Assert.False(Mapped(), "libz.so.1 stayed mapped after its refusal");
    }
}
