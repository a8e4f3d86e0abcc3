using System;
using System.Threading;
using System.Threading.Tasks;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>A buffered heap (versions advanced by hand) whose map replaced every one of its keys three times: about three rounds of frees parked, in several segments of the smallest class. The first sweep to mark its frees is held there until released.</summary>
internal sealed class ParkedFrees : IDisposable
{
    private const int TypeId = 29;
    private const int Keys = 4096;
    private static readonly TimeSpan Wait = TimeSpan.FromSeconds(30);
    private readonly SimulatedPersistenceDomain _domain = new(8 << 20);
    private readonly HeapFile _file;
    private readonly ManualResetEventSlim _entered = new();
    private readonly ManualResetEventSlim _release = new();
    private int _held;

    public ParkedFrees(HeapFaults faults)
    {
        _file = HeapFile.Create(_domain);
        Heap = BufferedDurableHeap.Open(_file, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, HeapFaults = faults });
        Map = new PersistentHashMap<long, long>(Heap, TypeId);
        PersistentHashMap<long, long> map = Map;
        for (int round = 0; round < 4; round++)
        {
            for (long k = 0; k < Keys; k++)
            {
                map.Set(k, k + round);
            }

            Heap.AdvanceVersion(Wait);
        }

        Assert.True(Heap.Heap.PendingFreeBlocks >= 2 * Keys, $"only {Heap.Heap.PendingFreeBlocks} frees parked");

        // The first sweep to mark its frees waits there until released; later ones pass.
        Heap.Heap.AfterSweepMarkedForTesting = () =>
        {
            if (Interlocked.Exchange(ref _held, 1) == 0)
            {
                _entered.Set();
                _release.Wait();
            }
        };
    }

    public BufferedDurableHeap Heap { get; }

    /// <summary>The map whose replaced copies are parked (keys 0 to 4,095).</summary>
    public PersistentHashMap<long, long> Map { get; }

    /// <summary>Starts a sweep of one segment's parked frees on another thread and returns once it is held in flight.</summary>
    public Task StartHeldSweep()
    {
        Task sweep = Task.Run(() => Heap.Heap.SweepPendingFrees(1, 0));
        Assert.True(_entered.Wait(Wait), "the sweep never marked its frees");
        return sweep;
    }

    public void Release() => _release.Set();

    public void Dispose()
    {
        _release.Set();
        Heap.Dispose();
        _file.Dispose();
        _domain.Dispose();
        _entered.Dispose();
        _release.Dispose();
    }
}
