using System.IO;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// Creating on a read-only mount, through both creation paths. In the non-parallel collection: the in-place path is
/// chosen through a process-wide test hook (<see cref="HeapFileTestHooks.CreateInPlace"/>), which tests of the unnamed
/// path in other classes would see if they ran meanwhile (an audit's finding: a flake window of a few milliseconds).
/// </summary>
[Collection(nameof(InheritedLockTests))]
public sealed class ReadOnlyMountCreateTests
{
    /// <summary>Creating on a read-only file system says so, whether the file is made unnamed (Linux) or in place: in
    /// place it was reported as a full disk (the create's EROFS taken for a failed preallocation).</summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void Create_OnAReadOnlyMount_ReportsReadOnly(bool inPlace)
    {
        using var dir = new TempDirectory();
        using var view = SmallTmpfs.MountOrSkip(dir, "ro,size=1m");
        HeapFileTestHooks.CreateInPlace = inPlace;
        try
        {
            HeapFileException e = Assert.Throws<HeapFileException>(() => PersistentHeap.Create(view.File("a.heap"), new HeapFileOptions { Size = 1L << 20 }));
            Assert.Equal(HeapFileError.ReadOnly, e.Error);
        }
        finally
        {
            HeapFileTestHooks.CreateInPlace = false;
        }
    }

    /// <summary>
    /// A probe's finding: on a read-only mount with less free space than the heap needs, Create reported
    /// InsufficientSpace (its space check ran before anything looked at the mount); a read-only file system may report
    /// no free space at all.
    /// </summary>
    [Fact]
    public void Create_OnAReadOnlyMountSmallerThanTheHeap_ReportsReadOnly()
    {
        using var dir = new TempDirectory();
        using var view = SmallTmpfs.MountOrSkip(dir, "ro,size=1m");
        HeapFileException e = Assert.Throws<HeapFileException>(() => PersistentHeap.Create(view.File("a.heap"), new HeapFileOptions { Size = 8L << 20 }));
        Assert.Equal(HeapFileError.ReadOnly, e.Error);
    }
}
