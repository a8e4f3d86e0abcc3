using System;
using System.IO;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// A probe: the heap file deleted, or replaced by a rename over it (a backup restore, a deploy script), while a heap has it
/// open. Every later Sync and Dispose returned as if the writes were durable, into an inode that no longer has a name:
/// nothing acknowledged after the deletion could ever be reopened. Each durable frontier now checks that the file still
/// has a name (Linux): the cycle fails, and Sync and Dispose report it.
/// </summary>
public sealed class FileLostItsNameTests
{
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void AHeapFileDeletedOrReplacedWhileOpen_FailsSyncAndDispose_InsteadOfAcknowledgingUnreachableWrites(bool replaced)
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "statx (Linux)");
        using var dir = new TempDirectory();
        string path = dir.File("a.heap");
        var heap = BufferedDurableHeap.Create(path, new HeapFileOptions { Size = 4L << 20, Domain = PersistenceDomainKind.MappedFile }, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
        var map = new PersistentHashMap<long, long>(heap, typeId: 1);
        map.Set(1, 1);
        heap.Sync();
        if (replaced)
        {
            File.WriteAllBytes(path + ".new", new byte[4096]);
            File.Move(path + ".new", path, overwrite: true);
        }
        else
        {
            File.Delete(path);
        }

        map.Set(2, 2);
        Exception sync = Assert.ThrowsAny<Exception>(() => heap.Sync());
        Assert.Contains("deleted or replaced", sync.ToString(), StringComparison.Ordinal);
        Exception dispose = Assert.ThrowsAny<Exception>(heap.Dispose);
        Assert.Contains("deleted or replaced", dispose.ToString(), StringComparison.Ordinal);
    }

    /// <summary>A file renamed (not deleted) while open keeps its name, under another path: nothing is refused.</summary>
    [Fact]
    public void AHeapFileRenamedWhileOpen_GoesOnAndReopensUnderItsNewName()
    {
        using var dir = new TempDirectory();
        string path = dir.File("a.heap");
        var options = new HeapFileOptions { Size = 4L << 20, Domain = PersistenceDomainKind.MappedFile };
        using (var heap = BufferedDurableHeap.Create(path, options, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan }))
        {
            var map = new PersistentHashMap<long, long>(heap, typeId: 1);
            map.Set(1, 1);
            heap.Sync();
            File.Move(path, path + ".moved");
            map.Set(2, 2);
            heap.Sync();
        }

        using BufferedDurableHeap reopened = BufferedDurableHeap.Open(path + ".moved", options);
        Assert.Equal(2, new PersistentHashMap<long, long>(reopened, typeId: 1).Count);
    }
}
