using System;
using System.IO;
using System.Runtime.InteropServices;
using System.Threading;

namespace Epvs.Persistence.Tests;

/// <summary>Child-process scenarios for heaps whose growth fails on the medium (the process's file size limit, set here).</summary>
internal static class GrowthRefusalChild
{
    internal const string Role = "growth-refusal";
    internal const long LimitBytes = 4L << 20;

    /// <summary>Scenarios: <c>limit</c> (the heap may grow past the limit), <c>maxsize</c> (MaxSize at the limit: the heap
    /// knows it cannot grow), <c>nevergrew</c> (created at the limit: never grew), <c>rawsticky</c> (a raw heap grows again
    /// once the limit is raised), <c>nospare</c> (as <c>limit</c>, with the broken control: no spare segment is kept).</summary>
    internal static int Run(string scenario, string path)
    {
        try
        {
            return scenario switch
            {
                "limit" => FullThenDelete(path, maxSizeAtLimit: false),
                "maxsize" => FullThenDelete(path, maxSizeAtLimit: true),
                "nospare" => WithoutSpare(() => FullThenDelete(path, maxSizeAtLimit: false)),
                "rawsticky" => RawHeapGrowsAgainOnceTheLimitIsRaised(path),
                "nevergrew" => FullThenDelete(path, maxSizeAtLimit: false, size: LimitBytes),
                _ => throw new ArgumentException($"unknown scenario {scenario}"),
            };
        }
        catch (Exception e)
        {
            Console.Error.WriteLine($"unexpected: {e}");
            return SafetyChild.WrongOutcome;
        }
    }

    private static int WithoutSpare(Func<int> scenario)
    {
        HeapFile.NoGrowthSpareForTesting = true;
        return scenario();
    }

    [DllImport("libc", EntryPoint = "setrlimit", SetLastError = true)]
    private static extern unsafe int SetRlimit(int resource, long* limit);

    private static unsafe void SetFileSizeLimit(long soft)
    {
        long* limit = stackalloc long[2];
        limit[0] = soft;
        limit[1] = -1;
        if (SetRlimit(1, limit) != 0)
        {
            throw new InvalidOperationException($"setrlimit failed: errno {Marshal.GetLastPInvokeError()}");
        }
    }

    /// <summary>
    /// A raw heap (no delete reserve) full because the file size limit refused its growth: once the limit is raised (or
    /// space freed on the file system, as the heap-full message advises) it should grow again without a reopen.
    /// </summary>
    private static int RawHeapGrowsAgainOnceTheLimitIsRaised(string path)
    {
        var options = new HeapFileOptions
        {
            Size = 1L << 20,
            MaxSize = 64L << 20,
            MappedFileWriteBack = MappedFileWriteBack.PrivateMapping,
            Domain = PersistenceDomainKind.MappedFile,
        };
        SetFileSizeLimit(LimitBytes);
        using PersistentHeap heap = PersistentHeap.Create(path, options);
        int n = 0;
        while (heap.TryAllocate(3000, 1, out _))
        {
            n++;
        }

        SetFileSizeLimit(-1); // RLIM_INFINITY: the hard limit was left unlimited
        bool grew = heap.TryAllocate(3000, 1, out _);
        Console.WriteLine($"full after {n} blocks at {new FileInfo(path).Length} bytes; after raising the limit an allocation {(grew ? "succeeded" : "still failed")}");
        return grew ? SafetyChild.Survived : SafetyChild.WrongOutcome;
    }

    /// <summary>
    /// A heap that grows until its growth fails (the file size limit; a full file system behaves the same: the
    /// extension fails) and is then full: deletes must still work, as on a heap at its MaxSize, since deleting is the
    /// only way to make room; then the room they made takes new values, and after a reopen under the same limit deletes
    /// work again.
    /// </summary>
    private static int FullThenDelete(string path, bool maxSizeAtLimit, long size = 1L << 20)
    {
        var options = new HeapFileOptions
        {
            Size = size,
            MaxSize = maxSizeAtLimit ? LimitBytes : 64L << 20,
            MappedFileWriteBack = MappedFileWriteBack.PrivateMapping,
            Domain = PersistenceDomainKind.MappedFile,
        };
        SetFileSizeLimit(LimitBytes);
        int n = 0;
        BufferedDurableHeap heap = BufferedDurableHeap.Create(path, options, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
        var map = new PersistentByteMap<long>(heap, typeId: 1);
        byte[] value = new byte[3000];
        try
        {
            for (; n < 100_000; n++)
            {
                map.Set(n, value);
            }
        }
        catch (InsufficientMemoryException e)
        {
            Console.WriteLine($"full after {n} values at {new FileInfo(path).Length} bytes: {e.Message}");
        }

        heap.Sync();
        int removed = 0;
        string? failure = null;
        for (int k = 0; k < 50; k++)
        {
            try
            {
                if (map.Remove(k))
                {
                    removed++;
                }
            }
            catch (InsufficientMemoryException e)
            {
                failure ??= e.Message;
            }
        }

        heap.Sync();
        heap.Sync();
        heap.Sync();
        int added = 0;
        try
        {
            for (int k = 0; k < 20; k++)
            {
                map.Set(1_000_000 + k, value);
                added++;
            }
        }
        catch (InsufficientMemoryException)
        {
        }

        Console.WriteLine($"removed {removed} of 50 (first failure: {failure ?? "none"}); then added {added} of 20");
        heap.Dispose();
        int removedAfterReopen = 0;
        using (BufferedDurableHeap reopened = BufferedDurableHeap.Open(path, options, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan }))
        {
            var again = new PersistentByteMap<long>(reopened, typeId: 1);
            for (int k = 50; k < 100; k++)
            {
                try
                {
                    if (again.Remove(k))
                    {
                        removedAfterReopen++;
                    }
                }
                catch (InsufficientMemoryException)
                {
                }
            }

            reopened.Sync();
        }

        Console.WriteLine($"after reopen under the limit: removed {removedAfterReopen} of 50");
        return removed == 50 && added == 20 && removedAfterReopen == 50 ? SafetyChild.Survived : SafetyChild.WrongOutcome;
    }
}
