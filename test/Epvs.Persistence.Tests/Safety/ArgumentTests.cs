#pragma warning disable CA1307, CA1310, CA2000
using System;
using System.Collections.Generic;
using System.Linq;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// A probe's findings on invalid and forged arguments, which must be refused at the call with a clear exception, never
/// crash the process, and leave the heap usable (a reopen showing the state before the call): a simulated domain's image
/// read after Dispose (an access violation); a forged reference to an anti-payload or to a structure's payload accepted
/// by <see cref="DurableOperation.Replace"/> and <see cref="DurableOperation.Delete"/> (a double free that failed the
/// heap later, or a key the reopened map lost); a Replace size named after the allocator's parameter; a raw heap's
/// RecoveryParallelism below 1 taken silently. Each test fails without its fix. The crash-prone cases run in a child
/// process (<see cref="ArgumentsChild"/>).
/// </summary>
public sealed class ArgumentTests
{
    private static readonly Dictionary<string, string> NoEnvironment = new();
    private static readonly BufferedDurableHeapOptions Manual = new() { AdvancePeriod = Timeout.InfiniteTimeSpan };
    private readonly ITestOutputHelper _output;

    public ArgumentTests(ITestOutputHelper output) => _output = output;

    // ---- Finding 1 (crash): SimulatedPersistenceDomain reads freed native memory after Dispose. ----

    [Theory]
    [InlineData("sim-durable-image-after-dispose")]
    [InlineData("sim-crash-after-dispose")]
    public void SimulatedDomain_ImageCallsAfterDispose_ThrowObjectDisposedInsteadOfCrashing(string scenario)
    {
        (int code, string output) = TestProgram.RunChild(NoEnvironment, ArgumentsChild.Role, scenario, "-");
        _output.WriteLine(output);
        Assert.True(code == 0, $"exit {code}: {output}");
    }

    // ---- Finding 2 (heap-fatal late failure): an anti-payload is accepted by Delete/Replace. ----

    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void DurableOperation_DeleteOrReplaceOfAnAntiPayload_IsRefusedAtTheCall_AndTheHeapKeepsWorking(bool replace)
    {
        using var dir = new TempDirectory();
        string path = dir.File("a.heap");
        Exception? refused, later, closed;
        var heap = BufferedDurableHeap.Create(path, new HeapFileOptions { Size = 4L << 20 }, Manual);
        {
            PayloadRef a, keep;
            using (DurableOperation op = heap.BeginOperation())
            {
                a = op.Allocate(16, 1);
                keep = op.Allocate(16, 1);
                op.GetPayload(a).Fill(1);
                op.GetPayload(keep).Fill(2);
            }

            heap.Sync();
            using (DurableOperation op = heap.BeginOperation())
            {
                op.Delete(a);
            }

            PayloadRef anti = AllBlocks(heap).Single(b => b.Header.Kind == PayloadKind.Delete).Block;
            refused = Record.Exception(() =>
            {
                using DurableOperation op = heap.BeginOperation();
                if (replace)
                {
                    op.Replace(anti, 16);
                }
                else
                {
                    op.Delete(anti);
                }
            });

            // Whatever happened at the call, the heap must keep working: three cycles reclaim the delete.
            later = Record.Exception(() =>
            {
                for (int i = 0; i < 4; i++)
                {
                    heap.Sync();
                }
            });
            closed = Record.Exception(heap.Dispose);
            Assert.True(refused is ArgumentException or InvalidOperationException, $"the anti-payload {anti} was accepted by {(replace ? "Replace" : "Delete")}; later Sync: {later?.Message}; Dispose: {closed?.Message}");
        }

        Assert.Null(later);
        Assert.Null(closed);

        using var reopened = BufferedDurableHeap.Open(path, null, Manual);
        IReadOnlyList<RecoveredPayload> payloads = reopened.TakeRecoveredPayloads(1);
        Assert.Single(payloads);
        Assert.True(reopened.Recovery.WasCleanShutdown);
    }

    // ---- Finding 3 (heap-fatal late failure): a library structure's payload is accepted by Delete/Replace. ----

    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void DurableOperation_DeleteOrReplaceOfAStructuresPayload_IsRefusedAtTheCall_AndTheMapKeepsWorking(bool replace)
    {
        using var dir = new TempDirectory();
        string path = dir.File("a.heap");
        Exception? refused, later, closed;
        var heap = BufferedDurableHeap.Create(path, new HeapFileOptions { Size = 4L << 20 }, Manual);
        {
            var map = new PersistentHashMap<long, long>(heap, 7);
            map.Set(1, 10);
            map.Set(2, 20);
            heap.Sync();
            heap.Sync();

            // A forged reference to the map's payload of key 1 (type id above 2^24: the library's).
            PayloadRef target = AllBlocks(heap).First(b => b.Header.Size == 16 && b.Header.TypeId >= 1 << 24).Block;
            refused = Record.Exception(() =>
            {
                using DurableOperation op = heap.BeginOperation();
                if (replace)
                {
                    op.Replace(target, 16);
                }
                else
                {
                    op.Delete(target);
                }
            });

            later = Record.Exception(() =>
            {
                heap.Sync();
                map.Set(1, 11);
                map.Set(2, 21);
                for (int i = 0; i < 4; i++)
                {
                    heap.Sync();
                }
            });
            closed = Record.Exception(heap.Dispose);
            Assert.True(refused is ArgumentException or InvalidOperationException, $"the map's payload {target} was accepted by {(replace ? "Replace" : "Delete")}; later: {later?.Message}; Dispose: {closed?.Message}");
        }

        Assert.Null(later);
        Assert.Null(closed);

        using var reopened = BufferedDurableHeap.Open(path, null, Manual);
        var again = new PersistentHashMap<long, long>(reopened, 7);
        Assert.Equal(new Dictionary<long, long> { [1] = 11, [2] = 21 }, again.ToDictionary());
        Assert.True(reopened.Recovery.WasCleanShutdown);
    }

    /// <summary>
    /// The silent form of finding 3: after a user operation deletes the map's payload of key 1 through a forged
    /// reference (accepted), the map still reports key 1, Sync and a clean Dispose succeed, and the reopened map has lost
    /// key 1: the durable state silently diverges from what the live map said.
    /// </summary>
    [Fact]
    public void DurableOperation_DeleteOfAStructuresPayload_IsRefused_AndTheReopenedMapKeepsTheKey()
    {
        using var dir = new TempDirectory();
        string path = dir.File("a.heap");
        Exception? refused;
        using (var heap = BufferedDurableHeap.Create(path, new HeapFileOptions { Size = 4L << 20 }, Manual))
        {
            var map = new PersistentHashMap<long, long>(heap, 7);
            map.Set(1, 10);
            map.Set(2, 20);
            heap.Sync();
            PayloadRef target = AllBlocks(heap).First(b => b.Header.Size == 16 && b.Header.TypeId >= 1 << 24).Block;
            long key = System.Buffers.Binary.BinaryPrimitives.ReadInt64LittleEndian(heap.Heap.GetPayload(target));
            refused = Record.Exception(() =>
            {
                using DurableOperation op = heap.BeginOperation();
                op.Delete(target);
            });
            heap.Sync();
            Assert.True(map.TryGetValue(key, out long before));
            _output.WriteLine($"deleted the payload of key {key} (value {before}); refused: {refused?.Message}");
        }

        using var reopened = BufferedDurableHeap.Open(path, null, Manual);
        var again = new PersistentHashMap<long, long>(reopened, 7);
        Assert.True(refused is ArgumentException or InvalidOperationException, $"accepted; the live map kept both keys, the reopened map has: {string.Join(",", again.ToDictionary())}");
        Assert.Equal(2, again.Count);
    }

    // ---- Finding 4 (wrong error): Replace with a bad size names the allocator's parameter, not newSize. ----

    [Theory]
    [InlineData(-1)]
    [InlineData(int.MaxValue)]
    public void DurableOperation_ReplaceWithAnImpossibleSize_NamesNewSize_AndChangesNothing(int newSize)
    {
        using var dir = new TempDirectory();
        string path = dir.File("a.heap");
        using (var heap = BufferedDurableHeap.Create(path, new HeapFileOptions { Size = 4L << 20 }, Manual))
        {
            PayloadRef a;
            using (DurableOperation op = heap.BeginOperation())
            {
                a = op.Allocate(16, 1);
                op.GetPayload(a).Fill(7);
            }

            heap.Sync();
            var e = Assert.Throws<ArgumentOutOfRangeException>(() =>
            {
                using DurableOperation op = heap.BeginOperation();
                op.Replace(a, newSize);
            });

            // The heap still works: the same payload can be replaced properly afterwards.
            using (DurableOperation op = heap.BeginOperation())
            {
                PayloadRef copy = op.Replace(a, 16);
                Assert.Equal(7, op.GetPayload(copy)[0]);
            }

            heap.Sync();
            Assert.Equal("newSize", e.ParamName);
        }

        using var reopened = BufferedDurableHeap.Open(path, null, Manual);
        Assert.Single(reopened.TakeRecoveredPayloads(1));
    }

    // ---- Finding 5 (wrong error / inconsistency): a raw heap's RecoveryParallelism of 0 or less is accepted silently. ----

    [Theory]
    [InlineData(0)]
    [InlineData(-5)]
    public void PersistentHeapOptions_NonPositiveRecoveryParallelism_IsRefusedLikeTheBufferedHeaps(int parallelism)
    {
        using var dir = new TempDirectory();
        string path = dir.File("a.heap");
        PersistentHeap.Create(path, new HeapFileOptions { Size = 4L << 20 }).Dispose();
        Assert.Throws<ArgumentOutOfRangeException>(() => BufferedDurableHeap.Create(dir.File("b.heap"), null, new BufferedDurableHeapOptions { RecoveryParallelism = parallelism }).Dispose());
        Exception? e = Record.Exception(() => PersistentHeap.Open(path, null, new PersistentHeapOptions { RecoveryParallelism = parallelism }).Dispose());
        Assert.IsType<ArgumentOutOfRangeException>(e);
    }

    // ---- Finding 6 (adversarial round, session 38): a negative length to grow to, and a scan on no threads, were taken. ----

    [Theory]
    [InlineData(-1L)]
    [InlineData(long.MinValue)]
    public void PersistenceDomain_TryGrowToANegativeLength_IsRefused(long newLength)
    {
        using var domain = new SimulatedPersistenceDomain(64L << 10, 1L << 20);
        long before = domain.Length;
        Assert.Equal("newLength", Assert.Throws<ArgumentOutOfRangeException>(() => domain.TryGrow(newLength)).ParamName);
        Assert.Equal(before, domain.Length);
        Assert.True(domain.TryGrow(before * 2));
    }

    [Theory]
    [InlineData(0)]
    [InlineData(-1)]
    public void PersistentHeap_ForEachAllocatedOnNoThreads_IsRefused(int degreeOfParallelism)
    {
        using var dir = new TempDirectory();
        using PersistentHeap heap = PersistentHeap.Create(dir.File("a.heap"), new HeapFileOptions { Size = 4L << 20 });
        heap.Persist(heap.Allocate(8, typeId: 1));
        int visited = 0;
        Assert.Equal("degreeOfParallelism", Assert.Throws<ArgumentOutOfRangeException>(() => heap.ForEachAllocated((_, _) => visited++, degreeOfParallelism)).ParamName);
        Assert.Equal(0, visited);
        heap.ForEachAllocated((_, _) => visited++);
        Assert.Equal(1, visited);
    }

    private static List<(PayloadRef Block, PayloadHeader Header)> AllBlocks(BufferedDurableHeap heap)
    {
        var blocks = new List<(PayloadRef, PayloadHeader)>();
        heap.Heap.ForEachAllocated((r, h) => { lock (blocks) { blocks.Add((r, h)); } });
        return blocks;
    }
}

/// <summary>The probes that held: each scenario prints every call's outcome and must run to its end in the child.</summary>
public sealed class ArgumentHeldTests
{
    private static readonly Dictionary<string, string> NoEnvironment = new();
    private readonly ITestOutputHelper _output;

    public ArgumentHeldTests(ITestOutputHelper output) => _output = output;

    [Theory]
    [InlineData("explore-raw")]
    [InlineData("explore-durable")]
    [InlineData("explore-domain")]
    [InlineData("explore-options")]
    [InlineData("explore-structures")]
    [InlineData("explore-uid")]
    public void EveryCallIsRefusedCleanlyOrWorks_NeverACrash(string scenario)
    {
        using var dir = new TempDirectory();
        (int code, string output) = TestProgram.RunChild(NoEnvironment, ArgumentsChild.Role, scenario, dir.File("a.heap"));
        _output.WriteLine(output);
        Assert.True(code == 0, $"exit {code}: {output}");
        Assert.DoesNotContain("unexpected:", output);
        Assert.DoesNotContain("AccessViolation", output);
        Assert.DoesNotContain("NullReferenceException", output);
        Assert.DoesNotContain("IndexOutOfRangeException", output);
        Assert.DoesNotContain("OverflowException", output);
    }
}
