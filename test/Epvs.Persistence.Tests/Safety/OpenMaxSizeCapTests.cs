using System;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// A review of the open's HeapFileOptions.MaxSize cap (it caps the domain's capacity): the heap-full error explained a
/// capped heap by the causes it knew before the cap existed, and growth under the cap fell back to one span at a time.
/// </summary>
public sealed class OpenMaxSizeCapTests
{
    private const int Segment = 64 * 1024;

    /// <summary>Creates a raw heap of 1 MiB that may grow to <paramref name="maxSize"/>; returns its size in bytes.</summary>
    private static long CreateOneMegabyteHeap(string path, long maxSize)
    {
        PersistentHeap.Create(path, new HeapFileOptions { Size = 1L << 20, MaxSize = maxSize, Domain = PersistenceDomainKind.MappedFile }).Dispose();
        using HeapFile probe = HeapFile.Open(path, new HeapFileOptions { Domain = PersistenceDomainKind.MappedFile });
        return probe.Size;
    }

    /// <summary>MaxSize on open equal to the heap's size (or below one more segment): the error blames the domain
    /// ("cannot grow ... the libpmem domain never grows ...; open it with PersistenceDomainKind.MappedFile") although the
    /// heap is open with MappedFile and the open's own MaxSize is the reason.</summary>
    [Theory]
    [InlineData(0)]
    [InlineData(Segment / 2)]
    public void HeapFull_AtTheOpensMaxSize_NamesTheOpensMaxSize(int beyond)
    {
        using var dir = new TempDirectory();
        string path = dir.File("capped.heap");
        long size = CreateOneMegabyteHeap(path, maxSize: 64L << 20);

        using PersistentHeap heap = PersistentHeap.Open(path, new HeapFileOptions { MaxSize = size + beyond, Domain = PersistenceDomainKind.MappedFile });
        InsufficientMemoryException? full = null;
        for (int i = 0; i < 10_000 && full is null; i++)
        {
            full = Record.Exception(() => heap.Allocate(4000, 1)) as InsufficientMemoryException;
        }

        Assert.NotNull(full);
        Assert.Equal(size, heap.File.Size); // the cap held
        Assert.DoesNotContain("libpmem", full.Message, StringComparison.Ordinal);
        Assert.DoesNotContain("open it with PersistenceDomainKind.MappedFile", full.Message, StringComparison.Ordinal);
        Assert.Contains("MaxSize", full.Message, StringComparison.Ordinal);
    }

    /// <summary>MaxSize on open leaves room for a segment or two, not for a large payload: the error says the file system
    /// may be out of space or the file size limit reached, neither of which holds.</summary>
    [Fact]
    public void HeapFull_ForALargePayloadPastTheOpensMaxSize_NamesTheOpensMaxSize()
    {
        using var dir = new TempDirectory();
        string path = dir.File("capped-large.heap");
        long size = CreateOneMegabyteHeap(path, maxSize: 64L << 20);

        using PersistentHeap heap = PersistentHeap.Open(path, new HeapFileOptions { MaxSize = size + (2L * Segment), Domain = PersistenceDomainKind.MappedFile });
        InsufficientMemoryException full = Assert.Throws<InsufficientMemoryException>(() => heap.Allocate(4 << 20, 1));
        Assert.DoesNotContain("file system may be out of space", full.Message, StringComparison.Ordinal);
        Assert.Contains("MaxSize", full.Message, StringComparison.Ordinal);
    }

    /// <summary>Growth under a cap: TryGrowLocked doubles up to the recorded maximum, which passes the cap, so every
    /// growth falls back to the one span it needs (a posix_fallocate and two persists per segment) instead of doubling
    /// up to the cap.</summary>
    [Fact]
    public void Growth_UnderTheOpensMaxSize_StillGrowsGeometrically()
    {
        using var dir = new TempDirectory();
        string path = dir.File("capped-growth.heap");
        long size = CreateOneMegabyteHeap(path, maxSize: 256L << 20);

        // Room for 1.5 times the heap: doubling passes the cap.
        using PersistentHeap heap = PersistentHeap.Open(path, new HeapFileOptions { MaxSize = size + (size / 2), Domain = PersistenceDomainKind.MappedFile });
        int growths = 0;
        long last = heap.File.Size;
        for (int i = 0; i < 100_000; i++)
        {
            if (Record.Exception(() => heap.Allocate(4000, 1)) is InsufficientMemoryException)
            {
                break;
            }

            if (heap.File.Size != last)
            {
                growths++;
                last = heap.File.Size;
            }
        }

        Assert.True(growths <= 2, $"{growths} growths to reach the cap ({last} bytes)");
    }
}
