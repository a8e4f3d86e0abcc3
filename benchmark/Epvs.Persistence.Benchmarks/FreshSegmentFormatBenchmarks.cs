using System;
using System.IO;
using System.Threading;
using BenchmarkDotNet.Attributes;

namespace Epvs.Persistence.Benchmarks;

/// <summary>
/// One operation = formatting one fresh 64 KiB segment of the smallest class (1,365 blocks of 48 bytes, a long key and
/// value each) the way a buffered heap's stocker does: a stocking of 512 fresh segments (32 MiB) of a heap file just
/// created, through the page cache (a private mapping, the default on Linux), two fences included. With the pages
/// populated first (<c>madvise(MADV_POPULATE_WRITE)</c>, the library) against one page fault per page at the first
/// store (the behaviour before 2026-12-02, <see cref="MappedFilePersistenceDomain.PrefaultDisabledForTesting"/>). Each
/// invocation gets a new heap file (a segment is fresh only once). <see cref="OtherThreadRunning"/>: another thread of the
/// process keeps the other processor busy meanwhile, as the writers do while the stocker formats; a copy-on-write of a
/// page already mapped then flushes that processor's TLB (an interrupt to it), which it does not with the process alone.
/// </summary>
[InvocationCount(1)]
[MemoryDiagnoser]
public class FreshSegmentFormatBenchmarks
{
    private const int Segments = 512;
    private string _directory = string.Empty;
    private PersistentHeap? _heap;
    private Thread? _other;
    private volatile bool _stopOther;

    /// <summary>The other thread's memory, allocated once, before any measured invocation.</summary>
    private readonly long[] _otherMemory = new long[1 << 16];

    [Params(false, true)]
    public bool OtherThreadRunning { get; set; }

    [GlobalSetup]
    public void Setup()
    {
        _directory = Path.Combine(Environment.GetEnvironmentVariable("EPVS_BENCH_DIR") ?? Path.GetTempPath(), "epvs-bench-" + Guid.NewGuid().ToString("N"));
        Directory.CreateDirectory(_directory);
    }

    [GlobalCleanup]
    public void Cleanup() => Directory.Delete(_directory, recursive: true);

    [IterationSetup(Target = nameof(FaultPerPage))]
    public void SetupFaultPerPage() => CreateHeap(prefault: false);

    [IterationSetup(Target = nameof(Prefaulted))]
    public void SetupPrefaulted() => CreateHeap(prefault: true);

    [IterationCleanup]
    public void CleanupHeap()
    {
        _stopOther = true;
        _other?.Join();
        _other = null;
        _heap?.Dispose();
        _heap = null;
        File.Delete(Path.Combine(_directory, "fresh.heap"));
    }

    [Benchmark(Baseline = true, OperationsPerInvoke = Segments, Description = "a page fault per page at the first store (before)")]
    public long FaultPerPage() => Stock();

    [Benchmark(OperationsPerInvoke = Segments, Description = "pages populated first (MADV_POPULATE_WRITE)")]
    public long Prefaulted() => Stock();

    private void CreateHeap(bool prefault)
    {
        _heap = PersistentHeap.Create(Path.Combine(_directory, "fresh.heap"), new HeapFileOptions { Size = 128L << 20, Domain = PersistenceDomainKind.MappedFile, MappedFileWriteBack = MappedFileWriteBack.PrivateMapping });
        if (_heap.File.Domain is not MappedFilePersistenceDomain domain)
        {
            throw new InvalidOperationException("the heap is not on the mapped-file domain");
        }

        domain.PrefaultDisabledForTesting = !prefault;

        // A first allocation of the class (it formats one segment itself) gives the stocking a demand to stock for.
        _heap.Allocate(16, typeId: 1);
        if (OtherThreadRunning)
        {
            _stopOther = false;
            _other = new Thread(Spin) { IsBackground = true, Name = "other" };
            _other.Start();
        }
    }

    /// <summary>Keeps a processor busy with stores to memory of its own until the iteration ends.</summary>
    private void Spin()
    {
        long[] memory = _otherMemory;
        for (long i = 0; !_stopOther; i++)
        {
            memory[i & (memory.Length - 1)] = i;
        }
    }

    private long Stock()
    {
        long before = _heap!.StockFormattedSegments;
        _heap.StockPools((long)Segments * SizeClasses.BlocksPerSegment[0] * SizeClasses.BlockSizes[0], TimeSpan.Zero);
        long formatted = _heap.StockFormattedSegments - before;
        return formatted == Segments ? formatted : throw new InvalidOperationException($"the stocking formatted {formatted} segments, not {Segments}");
    }
}
