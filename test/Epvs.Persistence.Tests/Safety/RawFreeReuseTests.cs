using System;
using System.Collections.Generic;
using System.Linq;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// A probe's findings on the raw <see cref="PersistentHeap"/>'s <see cref="PersistentHeap.Free(PayloadRef)"/>, which
/// only stores the free word. It handed the block out again at once, so the block's next allocation could reach the
/// medium before the free: after a crash, recovery read the freed payload's durable header over the next payload's
/// bytes — a block whose persist had completed, recovered with bytes it never had (the raw heap checks headers, not
/// payloads). A small block is now handed out again only once its free is durable. Also: four calls on a disposed heap
/// whose file stays open answered with another heap's blocks and accounting instead of throwing.
/// </summary>
public sealed class RawFreeReuseTests
{
    private const int Blocks = 100;
    private readonly ITestOutputHelper _output;

    public RawFreeReuseTests(ITestOutputHelper output) => _output = output;

    /// <summary>
    /// Blocks persisted, freed (no write-back: the contract lets a free be undone by a crash), then the same number of
    /// new blocks allocated, stamped and persisted, with a crash armed at points of that second phase. In every image, a
    /// block that comes back under a freed payload's uid must hold that payload's bytes.
    /// </summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void BlockWhoseFreeWasNotDurable_NeverComesBackWithTheNextAllocationsBytes(bool control)
    {
        var violations = new List<string>();
        int images = 0, reused = 0, resurrected = 0;
        for (int seed = 0; seed < 8; seed++)
        {
            using var domain = new SimulatedPersistenceDomain(1 << 20);
            var freed = new Dictionary<long, long>(); // offset -> uid of the freed payload
            using (HeapFile file = HeapFile.Create(domain))
            using (var heap = new PersistentHeap(file, new PersistentHeapOptions { Faults = control ? HeapFaults.ReuseRawFreesAtOnce : HeapFaults.None }))
            {
                var first = new List<PayloadRef>();
                for (int i = 0; i < Blocks; i++)
                {
                    PayloadRef a = heap.Allocate(400, typeId: 1);
                    Stamp.Write(heap.GetPayload(a), heap.GetHeader(a).Uid);
                    heap.Persist(a);
                    first.Add(a);
                }

                foreach (PayloadRef a in first)
                {
                    freed[a.Offset] = heap.GetHeader(a).Uid;
                    heap.Free(a);
                }

                var random = new Random(seed);
                long start = domain.CrashPointCount;
                for (int i = 0; i < 40; i++)
                {
                    domain.ArmCrash(start + 1 + random.Next(4 * Blocks), random.Next());
                }

                for (int i = 0; i < Blocks; i++)
                {
                    PayloadRef b = heap.Allocate(400, typeId: 2);
                    reused += freed.ContainsKey(b.Offset) ? 1 : 0;
                    Stamp.Write(heap.GetPayload(b), heap.GetHeader(b).Uid);
                    heap.Persist(b);
                }
            }

            foreach (SimulatedCrash crash in domain.CapturedCrashes)
            {
                images++;
                using var crashed = SimulatedPersistenceDomain.FromImage(crash.Image);
                using HeapFile reopened = HeapFile.Open(crashed);
                using var recovered = new PersistentHeap(reopened);
                recovered.ForEachAllocated((block, header) =>
                {
                    if (freed.TryGetValue(block.Offset, out long uid) && header.Uid == uid)
                    {
                        resurrected++;
                        if (!Stamp.Matches(recovered.GetPayload(block), uid))
                        {
                            violations.Add($"seed {seed} point {crash.Point}: the block at 0x{block.Offset:X} came back as the freed payload (uid {uid}) with bytes it never had");
                        }
                    }
                });
            }
        }

        _output.WriteLine($"{images} images; {reused} new blocks reused freed ones; freed payloads back (their frees undone) {resurrected} times, with foreign bytes {violations.Count}; e.g. {violations.FirstOrDefault()}");
        Assert.True(reused > 0, "no new block reused a freed one: the check saw nothing");
        if (control)
        {
            Assert.SkipWhen(violations.Count == 0, "INCONCLUSIVE: the control (blocks handed out before their frees are durable) was not caught");
            return;
        }

        Assert.Empty(violations);
    }

    /// <summary>Frees made durable by the thread's own Fence hand their blocks out at once; statistics count held blocks as free.</summary>
    [Fact]
    public void HeldFrees_AreFreeInTheStatistics_AndReusedAfterTheThreadsFence()
    {
        using var domain = new SimulatedPersistenceDomain(1 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using var heap = new PersistentHeap(file);
        PayloadRef a = heap.Allocate(400, typeId: 1);
        heap.Persist(a);
        HeapStatistics before = heap.GetStatistics();
        heap.Free(a);
        HeapStatistics after = heap.GetStatistics();
        Assert.True(after.AddsUp, after.ToString());
        Assert.Equal(before.LiveBlocks - 1, after.LiveBlocks);
        Assert.Equal(before.FreeBytes + (before.LiveBytes - after.LiveBytes), after.FreeBytes);

        // Not handed out before its free is durable; after the thread's fence (the protocol: WriteBackHeader, Fence), at once.
        PayloadRef b = heap.Allocate(400, typeId: 2);
        Assert.NotEqual(a, b);
        heap.WriteBackHeader(a);
        heap.Fence();
        PayloadRef c = heap.Allocate(400, typeId: 3);
        Assert.Equal(a, c);
    }

    /// <summary>
    /// A review's finding: a raw heap disposed while its file stays open left the frees its threads held not durable, and
    /// a second heap attached to the file read those blocks free from the mapping and handed them out at once. Dispose
    /// makes them durable first.
    /// </summary>
    [Fact]
    public void Dispose_WithTheFileStayingOpen_MakesTheHeldFreesDurable()
    {
        using var domain = new SimulatedPersistenceDomain(1 << 20);
        using HeapFile file = HeapFile.Create(domain);
        var blocks = new List<PayloadRef>();
        using (var heap = new PersistentHeap(file))
        {
            for (int i = 0; i < 40; i++)
            {
                PayloadRef a = heap.Allocate(400, typeId: 1);
                heap.Persist(a);
                blocks.Add(a);
            }

            foreach (PayloadRef a in blocks)
            {
                heap.Free(a);
            }
        }

        byte[] durable = domain.GetDurableImage();
        int stillAllocated = blocks.Count(b => HeapLayout.InUse(BitConverter.ToUInt64(durable, (int)b.Offset + HeapLayout.CommitOffset)));
        Assert.Equal(0, stillAllocated);
    }

    /// <summary>A heap disposed while its file stays open (another heap may use the file since): every call throws.</summary>
    [Fact]
    public void CallsOnADisposedHeap_WhoseFileStaysOpen_Throw()
    {
        using var domain = new SimulatedPersistenceDomain(1 << 20);
        using HeapFile file = HeapFile.Create(domain);
        var first = new PersistentHeap(file);
        PayloadRef a = first.Allocate(100, typeId: 1);
        first.Dispose();
        using var second = new PersistentHeap(file);
        second.Allocate(100, typeId: 2);

        Assert.Throws<ObjectDisposedException>(() => first.WriteBackHeader(a));
        Assert.Throws<ObjectDisposedException>(first.Fence);
        Assert.Throws<ObjectDisposedException>(() => first.GetStatistics());
        Assert.Throws<ObjectDisposedException>(() => first.ForEachAllocated((_, _) => { }));
    }
}
