using System;
using System.Collections.Generic;
using System.Globalization;
using System.IO;
using System.Linq;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// The libpmem domain for real (libpmem1 must be installed: .ci/run installs it; these tests fail, never skip, without
/// it) and the fallback when libpmem cannot be loaded. The libpmem runs happen in a child process so that
/// PMEM_IS_PMEM_FORCE is in the native environment libpmem reads (see <see cref="TestProgram"/>).
/// </summary>
public sealed class PmemPersistenceDomainTests : IDisposable
{
    private readonly TempDirectory _directory = new();
    private readonly ITestOutputHelper _output;

    public PmemPersistenceDomainTests(ITestOutputHelper output) => _output = output;

    public void Dispose() => _directory.Dispose();

    [Fact]
    public void PmemDomain_ForcedPmemOnOrdinaryFile_UsesCacheFlushPathAndDataSurvives()
    {
        string path = _directory.File("forced.heap");
        Dictionary<string, long> counts = RunChild(path, force: "1", out List<(long Offset, long Uid, int Size)> blocks);
        Assert.Equal(1, counts["is_pmem"]);
        Assert.True(counts["flush"] + counts["persist"] > 0, "the flush path was used");
        Assert.True(counts["drain"] + counts["persist"] > 0, "the drain path was used");
        Assert.Equal(0, counts["msync"]);
        VerifyInThisProcess(path, blocks);
    }

    [Fact]
    public void PmemDomain_OrdinaryFileNotForced_FallsBackToPmemMsync()
    {
        string path = _directory.File("plain.heap");
        Dictionary<string, long> counts = RunChild(path, force: "0", out List<(long Offset, long Uid, int Size)> blocks);
        Assert.Equal(0, counts["is_pmem"]);
        Assert.True(counts["msync"] > 0, "pmem_msync was used");
        Assert.Equal(0, counts["flush"] + counts["drain"] + counts["persist"]);
        VerifyInThisProcess(path, blocks);
    }

    [Fact]
    public void Open_LibpmemCannotBeLoaded_FallsBackToMappedFileDomain()
    {
        string path = _directory.File("fallback.heap");
        var options = new HeapFileOptions { Size = 2L << 20, PmemLibraryName = "libpmem-not-installed-for-test.so.1" };
        long uid;
        PayloadRef block;
        using (PersistentHeap heap = PersistentHeap.Create(path, options))
        {
            Assert.Equal(PersistenceDomainKind.MappedFile, heap.File.Domain.Kind);
            block = heap.Allocate(1000, 1);
            uid = heap.GetHeader(block).Uid;
            Stamp.Write(heap.GetPayload(block), uid);
            heap.Persist(block);
            Assert.True(((MappedFilePersistenceDomain)heap.File.Domain).WriteBackCalls > 0);
        }

        using PersistentHeap reopened = PersistentHeap.Open(path, options);
        Assert.Equal(PersistenceDomainKind.MappedFile, reopened.File.Domain.Kind);
        Assert.True(Stamp.Matches(reopened.GetPayload(block), uid));
    }

    /// <summary>
    /// The msync fallback is fail-stop, as the mapped-file domain is: Linux reports a page's failed write-back once per
    /// open file, to whichever msync checks first (here the clock's, in the transition's critical section), and marks the
    /// page clean. A later msync of that page then succeeds without writing it, so a Sync that returned after the failure
    /// would claim durable a version whose page never reached the file. The broken control forgets the failure, in the
    /// domain and in the heap (which records a fault of the transition's critical section as the advancer's: either one
    /// keeps the retried Sync from returning).
    /// </summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void PmemMsync_AFailedMsync_NoLaterSyncReturnsAsIfDurable(bool control)
    {
        const int Eio = 5;
        string path = _directory.File($"msync-fails-{control}.heap");
        var fileOptions = new HeapFileOptions { Size = 2L << 20, Domain = PersistenceDomainKind.Pmem };
        var options = new BufferedDurableHeapOptions { AdvancePeriod = System.Threading.Timeout.InfiniteTimeSpan, Faults = control ? DurabilityFaults.ForgetTransitionFaults : DurabilityFaults.None };
        BufferedDurableHeap heap = BufferedDurableHeap.Create(path, fileOptions, options);
        var domain = Assert.IsType<PmemPersistenceDomain>(heap.Heap.File.Domain);
        Assert.SkipWhen(domain.IsPersistentMemory, "libpmem maps this file as persistent memory (PMEM_IS_PMEM_FORCE?): no msync to fail");
        domain.NoFailStopForTesting = control;
        var map = new PersistentHashMap<long, long>(heap, typeId: 1);
        map.Set(1, 1);

        // The page holding key 1's payload fails its write-back in the kernel; the next msync (the clock's) reports it.
        int failures = 1;
        domain.MsyncCallForTesting = () =>
        {
            if (System.Threading.Interlocked.Exchange(ref failures, 0) == 0)
            {
                return 0;
            }

            System.Runtime.InteropServices.Marshal.SetLastPInvokeError(Eio);
            return -1;
        };

        Exception? first = Record.Exception(heap.Sync);
        Exception? second = Record.Exception(heap.Sync);
        long frontier = heap.DurableFrontier;
        Exception? dispose = Record.Exception(heap.Dispose);
        _output.WriteLine($"control={control}: first Sync {first?.GetType().Name}, second Sync {second?.GetType().Name ?? "returned"} (frontier {frontier}), Dispose {dispose?.GetType().Name ?? "clean"}");
        Assert.NotNull(first);
        if (control)
        {
            // The control: the retried Sync returns, claiming durable the version whose page failed.
            Assert.Null(second);
            return;
        }

        Assert.NotNull(second);
        Assert.Equal(0, frontier);
        Assert.IsType<InvalidOperationException>(dispose);
        using HeapFile reopened = HeapFile.Open(path, new HeapFileOptions { Domain = PersistenceDomainKind.MappedFile });
        Assert.False(reopened.WasCleanShutdown);
    }

    private Dictionary<string, long> RunChild(string path, string force, out List<(long Offset, long Uid, int Size)> blocks)
    {
        (int exitCode, string output) = TestProgram.RunChild(new Dictionary<string, string> { ["PMEM_IS_PMEM_FORCE"] = force }, PmemChild.Role, path);
        _output.WriteLine(output.Split('\n')[0]);
        Assert.True(exitCode == 0, $"child exited with {exitCode} (is libpmem1 installed? .ci/run installs it):\n{output}");

        string[] lines = output.Split('\n', StringSplitOptions.RemoveEmptyEntries | StringSplitOptions.TrimEntries);
        Dictionary<string, long> counts = lines.First(l => l.StartsWith("is_pmem=", StringComparison.Ordinal))
            .Split(' ')
            .Select(pair => pair.Split('='))
            .ToDictionary(kv => kv[0], kv => kv[1] switch { "True" => 1L, "False" => 0L, string n => long.Parse(n, CultureInfo.InvariantCulture) });
        blocks = lines.Where(l => l.StartsWith("block ", StringComparison.Ordinal))
            .Select(l => l.Split(' '))
            .Select(p => (long.Parse(p[1], CultureInfo.InvariantCulture), long.Parse(p[2], CultureInfo.InvariantCulture), int.Parse(p[3], CultureInfo.InvariantCulture)))
            .ToList();
        Assert.Equal(200, blocks.Count);
        return counts;
    }

    private static void VerifyInThisProcess(string path, List<(long Offset, long Uid, int Size)> blocks)
    {
        using PersistentHeap heap = PersistentHeap.Open(path, new HeapFileOptions { Domain = PersistenceDomainKind.MappedFile });
        Assert.True(heap.File.WasCleanShutdown);
        Assert.Equal(blocks.Count, heap.RecoveryStatistics.LiveBlocks);
        foreach ((long offset, long uid, int size) in blocks)
        {
            var block = new PayloadRef(offset);
            PayloadHeader header = heap.GetHeader(block);
            Assert.Equal((uid, size, 7), (header.Uid, header.Size, header.TypeId));
            Assert.True(Stamp.Matches(heap.GetPayload(block), uid), $"payload of {block}");
        }
    }
}
