using System;
using System.IO;
using System.Runtime.InteropServices;
using BenchmarkDotNet.Attributes;
using Epvs.Persistence;

namespace Epvs.Persistence.Benchmarks;

/// <summary>
/// One operation = allocate a block for a 1 KiB payload, write the 1 KiB, make it durable, free it (so the heap does
/// not fill). Side by side per domain, against NativeMemory.Alloc + write + free in DRAM (the baseline, no durability).
/// The mapped file has a row per write-back: a shared mapping written back with msync, and a private one (Linux only)
/// copied into the file with pwrite + fdatasync, the one <see cref="MappedFileWriteBack.Auto"/> picks on Linux for a
/// heap that fits in a quarter of memory.
/// The libpmem domain is forced onto an ordinary file with PMEM_IS_PMEM_FORCE=1 (set on every job by
/// <see cref="PersistenceSuite"/>), so it measures the CLWB/CLFLUSHOPT + SFENCE path on DRAM-backed page cache, not real
/// persistent memory.
/// </summary>
[MemoryDiagnoser]
public unsafe class AllocateWritePersistBenchmarks
{
    private const int PayloadSize = 1024;
    private readonly byte[] _source = new byte[PayloadSize];
    private string _directory = string.Empty;
    private SimulatedPersistenceDomain? _simulatedDomain;
    private HeapFile? _simulatedFile;
    private PersistentHeap? _simulated;
    private PersistentHeap? _mappedFile;
    private PersistentHeap? _privateMappedFile;
    private PersistentHeap? _pmem;

    [GlobalSetup]
    public void Setup()
    {
        new Random(1).NextBytes(_source);
        _directory = Path.Combine(Environment.GetEnvironmentVariable("EPVS_BENCH_DIR") ?? Path.GetTempPath(), "epvs-bench-" + Guid.NewGuid().ToString("N"));
        Directory.CreateDirectory(_directory);
        _simulatedDomain = new SimulatedPersistenceDomain(16L << 20);
        _simulatedFile = HeapFile.Create(_simulatedDomain);
        _simulated = new PersistentHeap(_simulatedFile);
        _mappedFile = PersistentHeap.Create(Path.Combine(_directory, "msync.heap"), new HeapFileOptions { Size = 16L << 20, Domain = PersistenceDomainKind.MappedFile, MappedFileWriteBack = MappedFileWriteBack.SharedMapping });
        _privateMappedFile = PersistentHeap.Create(Path.Combine(_directory, "pwrite.heap"), new HeapFileOptions { Size = 16L << 20, Domain = PersistenceDomainKind.MappedFile, MappedFileWriteBack = MappedFileWriteBack.PrivateMapping });
        _pmem = PersistentHeap.Create(Path.Combine(_directory, "pmem.heap"), new HeapFileOptions { Size = 16L << 20, Domain = PersistenceDomainKind.Pmem });
        if (!_pmem.File.Domain.IsPersistentMemory)
        {
            throw new InvalidOperationException("libpmem did not take the flush path: run with PMEM_IS_PMEM_FORCE=1 (the bdn command sets it on every job).");
        }
    }

    [GlobalCleanup]
    public void Cleanup()
    {
        _simulated?.Dispose();
        _simulatedFile?.Dispose();
        _simulatedDomain?.Dispose();
        _mappedFile?.Dispose();
        _privateMappedFile?.Dispose();
        _pmem?.Dispose();
        Directory.Delete(_directory, recursive: true);
    }

    [Benchmark(Baseline = true, Description = "DRAM NativeMemory.Alloc+write+free")]
    public nint Dram()
    {
        void* block = NativeMemory.Alloc(PayloadSize);
        _source.AsSpan().CopyTo(new Span<byte>(block, PayloadSize));
        nint result = (nint)block;
        NativeMemory.Free(block);
        return result;
    }

    [Benchmark(Description = "Simulated domain")]
    public long Simulated() => AllocateWritePersist(_simulated!);

    [Benchmark(Description = "Mapped file (msync)")]
    public long MappedFile() => AllocateWritePersist(_mappedFile!);

    [Benchmark(Description = "Mapped file (private, pwrite + fdatasync)")]
    public long MappedFilePrivate() => AllocateWritePersist(_privateMappedFile!);

    [Benchmark(Description = "libpmem (forced pmem)")]
    public long Pmem() => AllocateWritePersist(_pmem!);

    private long AllocateWritePersist(PersistentHeap heap)
    {
        PayloadRef block = heap.Allocate(PayloadSize, typeId: 1);
        _source.AsSpan().CopyTo(heap.GetPayload(block));
        heap.Persist(block);
        heap.Free(block);
        return block.Offset;
    }
}
