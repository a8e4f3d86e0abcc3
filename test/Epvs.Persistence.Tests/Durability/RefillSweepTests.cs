using System;
using System.Collections.Generic;
using System.Linq;
using System.Runtime.CompilerServices;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// Issue 10: an allocating thread that finds its class's pool empty on a heap with no free segment sweeps parked frees
/// for itself. The heap-full path after it (inside the thread's operation, which every version transition waits for:
/// a flush of every parked free, the release of pooled segments, or growth) is for a heap with under two batches of the
/// class parked and none in a sweep in flight. It
/// used to be taken whenever this thread's one sweep lost its blocks to another thread's allocations, or when the
/// parked frees sat in another thread's sweep in flight: under two writers of batches on a heap that cannot grow,
/// a flush of 3.5 million parked frees, and 7 of 20 benchmark repetitions with 17–45 cycles a second instead of about
/// 50 (benchmark/RESULTS.md). Each test counts the refills that took the heap-full path (<see cref="PersistentHeap.HeapFullRefills"/>);
/// the broken control (<see cref="HeapFaults.RefillSweepsOnce"/>, the old behaviour) takes it.
/// </summary>
public sealed class RefillSweepTests
{
    private const int PayloadSize = 16;
    private static readonly TimeSpan Wait = TimeSpan.FromSeconds(30);
    private static readonly int Class = SizeClasses.ForPayload(PayloadSize);

    [Fact]
    public void ARefillWhoseSweptBlocksOthersTookFirst_SweepsAgain()
    {
        (long heapFull, long pendingBefore, long pendingAfter) = RefillLosingItsFirstSweep(HeapFaults.None);
        Assert.Equal(0, heapFull);
        Assert.InRange(pendingAfter, 1, pendingBefore - 1);
    }

    [Fact]
    public void Control_ARefillThatSweepsOnce_IsCaughtTakingTheHeapFullPath()
    {
        (long heapFull, _, long pendingAfter) = RefillLosingItsFirstSweep(HeapFaults.RefillSweepsOnce);
        Assert.Equal(1, heapFull);
        Assert.Equal(0, pendingAfter); // its flush took every parked free
    }

    [Fact]
    public void ARefillWhoseClassIsParkedInASweepInFlight_WaitsForIt()
    {
        Assert.Equal(0, RefillBesideASweepHoldingEveryParkedFree(HeapFaults.None));
    }

    [Fact]
    public void Control_ARefillThatIgnoresTheSweepInFlight_IsCaughtTakingTheHeapFullPath()
    {
        Assert.Equal(1, RefillBesideASweepHoldingEveryParkedFree(HeapFaults.RefillSweepsOnce));
    }

    /// <summary>
    /// A raw heap of 1 MiB filled with 16-byte payloads (no free segment, the pool empty), every other block parked:
    /// a fresh thread allocates, and the blocks its first sweep hands out are taken from the pool before it takes a
    /// batch (by the test hook, as another writer would). Returns the heap-full refills of that allocation and the
    /// parked frees before and after it.
    /// </summary>
    private static (long HeapFull, long PendingBefore, long PendingAfter) RefillLosingItsFirstSweep(HeapFaults faults)
    {
        using var domain = new SimulatedPersistenceDomain(1 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using var heap = new PersistentHeap(file, new PersistentHeapOptions { Faults = faults });
        FillAndParkHalf(heap);
        var taken = new List<long[]>();
        int rounds = 0;
        heap.AfterRefillSweepForTesting = () =>
        {
            if (rounds++ == 0)
            {
                taken.AddRange(heap.TakePoolForTesting(Class));
            }
        };

        long pendingBefore = heap.PendingFreeBlocks;
        long heapFullBefore = heap.HeapFullRefills;
        AllocateOnAFreshThread(heap);
        Assert.True(taken.Sum(batch => batch.Length) > 0, "the first sweep handed nothing out");
        long heapFull = heap.HeapFullRefills - heapFullBefore;
        long pendingAfter = heap.PendingFreeBlocks;
        heap.PutBackForTesting(Class, taken);
        return (heapFull, pendingBefore, pendingAfter);
    }

    /// <summary>
    /// The same full heap; another thread's sweep takes every parked free and is held in flight (before its write-back)
    /// while a fresh thread allocates, and released once that thread waits for it or has taken the heap-full path.
    /// Returns the heap-full refills of the allocation.
    /// </summary>
    private static long RefillBesideASweepHoldingEveryParkedFree(HeapFaults faults)
    {
        using var domain = new SimulatedPersistenceDomain(1 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using var heap = new PersistentHeap(file, new PersistentHeapOptions { Faults = faults });
        FillAndParkHalf(heap);
        using var held = new ManualResetEventSlim();
        using var release = new ManualResetEventSlim();
        using var waiting = new ManualResetEventSlim();
        int first = 0;
        heap.AfterSweepMarkedForTesting = () =>
        {
            if (Interlocked.Exchange(ref first, 1) == 0)
            {
                held.Set();
                release.Wait(Wait);
            }
        };
        heap.BeforeRefillWaitsForSweepsForTesting = waiting.Set;

        long parked = heap.PendingFreeBlocks;
        var sweepFailure = new StrongBox<Exception?>();
        var sweeper = new Thread(() =>
        {
            try
            {
                heap.SweepPendingFrees(parked, Class);
            }
            catch (Exception e)
            {
                sweepFailure.Value = e;
            }
        })
        { IsBackground = true };
        Thread? allocator = null;
        StrongBox<Exception?>? failure = null;
        long heapFullBefore = heap.HeapFullRefills;
        try
        {
            sweeper.Start();
            Assert.True(held.Wait(Wait), "the sweep never marked its frees");
            Assert.Equal(0, heap.PendingFreeBlocks);
            (allocator, failure) = StartAllocation(heap);

            // Released only once the allocating thread is past its choice: waiting for the sweep, or on the heap-full
            // path (whose flush waits for it too).
            Assert.True(SpinWait.SpinUntil(() => waiting.IsSet || heap.HeapFullRefills != heapFullBefore, Wait), "the allocation neither waited nor took the heap-full path");
        }
        finally
        {
            // Never left held: the heap is disposed next, and a thread inside it would outlive it.
            release.Set();
            Assert.True(sweeper.Join(Wait));
            Assert.True(allocator?.Join(Wait) ?? true);
        }

        Assert.Null(sweepFailure.Value);
        Assert.Null(failure!.Value);
        return heap.HeapFullRefills - heapFullBefore;
    }

    /// <summary>Allocates 16-byte payloads until the heap is full (this thread's cache and the pool empty, no free segment), then parks every other block.</summary>
    private static void FillAndParkHalf(PersistentHeap heap)
    {
        var blocks = new List<long>();
        while (true)
        {
            try
            {
                blocks.Add(heap.Allocate(PayloadSize, typeId: 1).Offset);
            }
            catch (InsufficientMemoryException)
            {
                break;
            }
        }

        Assert.Equal(0, heap.GetStatistics().FreeSegments);
        Assert.Equal(0, heap.ReadyBlocks(Class));
        long[] parked = blocks.Where((_, i) => i % 2 == 0).ToArray();
        heap.DeferFrees(parked, parked.Length, new List<long>());
        Assert.True(heap.PendingFreeBlocks > 4 * SizeClasses.BlocksPerSegment[Class], $"only {heap.PendingFreeBlocks} frees parked");
    }

    /// <summary>One allocation on a new thread (its cache empty), which must succeed.</summary>
    private static void AllocateOnAFreshThread(PersistentHeap heap)
    {
        (Thread thread, StrongBox<Exception?> failure) = StartAllocation(heap);
        Assert.True(thread.Join(Wait));
        Assert.Null(failure.Value);
    }

    /// <summary>Starts one allocation on a new thread (its cache empty); its exception, if any, is in the box once the thread has ended.</summary>
    private static (Thread Thread, StrongBox<Exception?> Failure) StartAllocation(PersistentHeap heap)
    {
        var failure = new StrongBox<Exception?>();
        var thread = new Thread(() =>
        {
            try
            {
                heap.Allocate(PayloadSize, typeId: 1);
            }
            catch (Exception e)
            {
                failure.Value = e;
            }
        })
        { IsBackground = true };
        thread.Start();
        return (thread, failure);
    }
}
