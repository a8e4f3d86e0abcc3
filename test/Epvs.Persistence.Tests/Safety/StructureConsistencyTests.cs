using System;
using System.Collections.Generic;
using System.IO;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// Issue 10, consistency: what a running structure shows and what recovery rebuilds agree even when an operation
/// fails (a full heap), and reopening with the wrong types or the wrong structure is refused with one clear exception.
/// </summary>
public sealed class StructureConsistencyTests
{
    private static readonly BufferedDurableHeapOptions NoAdvancer = new() { AdvancePeriod = Timeout.InfiniteTimeSpan };

    [Fact]
    public void Remove_OnAFullHeap_ThrowsAndKeepsTheEntryInMemoryAndAfterRecovery() =>
        OnAFullHeap(map => Assert.Throws<InsufficientMemoryException>(() => map.Remove(1)));

    /// <summary>
    /// A new key on a full heap: its index slot is claimed before the payload's allocation throws, and the claim must
    /// leave nothing behind (a tombstone, not a live key): absent and not counted, in memory and after recovery.
    /// </summary>
    [Fact]
    public void SetOfANewKey_OnAFullHeap_ThrowsAndLeavesNoEntry() =>
        OnAFullHeap(map =>
        {
            Assert.Throws<InsufficientMemoryException>(() => map.Set(2, 20));
            Assert.Throws<InsufficientMemoryException>(() => map.Set(2, 21));
        });

    /// <summary>
    /// A map holding 1 → 10 on a heap with no room left: after <paramref name="fail"/> (operations that must throw and
    /// change nothing) the map still holds exactly 1 → 10, in memory and after a Sync and a reopen.
    /// </summary>
    private static void OnAFullHeap(Action<PersistentHashMap<long, long>> fail)
    {
        var expected = new Dictionary<long, long> { [1] = 10 };
        using var dir = new TempDirectory();
        string path = dir.File("full.heap");
        using (BufferedDurableHeap heap = Create(path))
        {
            var map = new PersistentHashMap<long, long>(heap, typeId: 1);
            map.Set(1, 10);
            FillHeap(heap);

            fail(map);
            Assert.True(map.TryGetValue(1, out long value) && value == 10, "the failed operation dropped the entry from the index");
            Assert.Equal(1, map.Count);
            Assert.Equal(expected, map.ToDictionary());
            heap.Sync();
        }

        using (BufferedDurableHeap heap = BufferedDurableHeap.Open(path, null, NoAdvancer))
        {
            var map = new PersistentHashMap<long, long>(heap, typeId: 1);
            Assert.Equal(expected, map.ToDictionary());
            Assert.Equal(1, map.Count);
        }
    }

    [Fact]
    public void TryDequeue_OnAFullHeap_ThrowsAndKeepsTheElementInMemoryAndAfterRecovery()
    {
        using var dir = new TempDirectory();
        string path = dir.File("full.heap");
        using (BufferedDurableHeap heap = Create(path))
        {
            var queue = new PersistentQueue<long>(heap, typeId: 1);
            queue.Enqueue(5);
            queue.Enqueue(6);
            FillHeap(heap);

            Assert.Throws<InsufficientMemoryException>(() => queue.TryDequeue(out _));
            Assert.Equal(new long[] { 5, 6 }, queue.ToArray());
            heap.Sync();
        }

        using (BufferedDurableHeap heap = BufferedDurableHeap.Open(path, null, NoAdvancer))
        {
            Assert.Equal(new long[] { 5, 6 }, new PersistentQueue<long>(heap, typeId: 1).ToArray());
        }
    }

    [Fact]
    public void Resize_InTheSameVersionOnAFullHeap_ThrowsAndKeepsOneLivePayload()
    {
        using var dir = new TempDirectory();
        string path = dir.File("full.heap");
        byte[] small = new byte[20];
        small.AsSpan().Fill(7);
        using (BufferedDurableHeap heap = Create(path))
        {
            var map = new PersistentByteMap<long>(heap, typeId: 1);
            map.Set(1, small);
            map.Set(2, new byte[500]); // formats a segment of the larger class: free blocks of it stay cached
            FillHeap(heap);

            // Same version, a new size of that larger class: the copy fits, its anti-payload does not.
            Assert.Throws<InsufficientMemoryException>(() => map.Set(1, new byte[500]));
            Assert.Equal(small, map.Get(1));
            heap.Sync();
        }

        using (BufferedDurableHeap heap = BufferedDurableHeap.Open(path, null, NoAdvancer))
        {
            // Before the fix the copy stayed live too: "two live payloads for one key".
            Assert.Equal(small, new PersistentByteMap<long>(heap, typeId: 1).Get(1));
        }
    }

    [Fact]
    public void Reopen_WithAnotherValueType_ThrowsOneInvalidDataExceptionNamingBothSizes()
    {
        using var dir = new TempDirectory();
        string path = dir.File("map.heap");
        using (BufferedDurableHeap heap = Create(path))
        {
            var map = new PersistentHashMap<long, long>(heap, typeId: 1);
            for (long k = 0; k < 100; k++)
            {
                map.Set(k, k);
            }
        }

        using (BufferedDurableHeap heap = BufferedDurableHeap.Open(path, null, NoAdvancer))
        {
            InvalidDataException e = Assert.Throws<InvalidDataException>(() => new PersistentHashMap<long, int>(heap, typeId: 1));
            Assert.Contains("12 bytes", e.Message, StringComparison.Ordinal);
            Assert.Contains("16 bytes", e.Message, StringComparison.Ordinal);
        }
    }

    /// <summary>
    /// Keys and values of other sizes that add up to the same payload size: only the total used to be checked, so an
    /// 8-byte key read back as a 4-byte one (and the rest as value) without a word of warning.
    /// </summary>
    [Fact]
    public void Reopen_WithAnotherKeySizeOfTheSamePayloadSize_IsRefused()
    {
        using var dir = new TempDirectory();
        string path = dir.File("maps.heap");
        using (BufferedDurableHeap heap = Create(path))
        {
            new PersistentHashMap<long, long>(heap, typeId: 1).Set(0x1111_2222_3333_4444, 0x5555_6666_7777_0001);
            new PersistentByteMap<long>(heap, typeId: 2).Set(0x0102_0304_0506_0708, new byte[] { 9, 9 });
        }

        using (BufferedDurableHeap heap = BufferedDurableHeap.Open(path, null, NoAdvancer))
        {
            InvalidDataException map = Assert.Throws<InvalidDataException>(() => new PersistentHashMap<int, TwelveBytes>(heap, typeId: 1));
            Assert.Contains("keys of 8 bytes", map.Message, StringComparison.Ordinal);
            Assert.Contains("4 bytes", map.Message, StringComparison.Ordinal);
            InvalidDataException bytes = Assert.Throws<InvalidDataException>(() => new PersistentByteMap<int>(heap, typeId: 2));
            Assert.Contains("keys of 8 bytes", bytes.Message, StringComparison.Ordinal);

            // With the types it was written with, everything is there.
            Assert.True(new PersistentHashMap<long, long>(heap, typeId: 1).TryGetValue(0x1111_2222_3333_4444, out long value) && value == 0x5555_6666_7777_0001);
            Assert.Equal(new byte[] { 9, 9 }, new PersistentByteMap<long>(heap, typeId: 2).Get(0x0102_0304_0506_0708));
        }
    }

    private readonly record struct TwelveBytes(int A, int B, int C);

    /// <summary>
    /// Keys of 31 bytes or more: the stored type id's key code holds sizes up to 30 bytes, so a map of 40-byte keys
    /// reopened with 32-byte keys was read without a word (a key's fifth field became part of the value). Each such
    /// structure now keeps a key-size record, checked at every open. The control writes none.
    /// </summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void Reopen_WithAnotherKeySizeOf31BytesOrMore_IsRefused(bool control)
    {
        using var dir = new TempDirectory();
        string path = dir.File("wide.heap");
        var options = new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, Faults = control ? DurabilityFaults.SkipKeySizeRecord : DurabilityFaults.None };
        var key40 = new Key40(1, 2, 3, 4, 5);
        var key32 = new Key32(1, 2, 3, 4);
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, new HeapFileOptions { Size = 1L << 20, Domain = PersistenceDomainKind.MappedFile }, options))
        {
            new PersistentByteMap<Key40>(heap, typeId: 1).Set(key40, new byte[] { 9, 9, 9 });
            new PersistentHashMap<Key32, (long, long)>(heap, typeId: 2).Set(key32, (5, 6)); // 48-byte payloads, as Key40 + long
        }

        using (BufferedDurableHeap heap = BufferedDurableHeap.Open(path, null, options))
        {
            Exception? bytes = Record.Exception(() => new PersistentByteMap<Key32>(heap, typeId: 1));
            Exception? map = Record.Exception(() => new PersistentHashMap<Key40, long>(heap, typeId: 2));
            if (control)
            {
                Assert.Null(bytes);
                Assert.Null(map);
                return;
            }

            Assert.Contains("keys of 40 bytes, but this one's keys are 32 bytes", Assert.IsType<InvalidDataException>(bytes).Message, StringComparison.Ordinal);
            Assert.Contains("keys of 32 bytes, but this one's keys are 40 bytes", Assert.IsType<InvalidDataException>(map).Message, StringComparison.Ordinal);

            // Refused before anything was taken: with the types they were written with, both open on the same heap.
            Assert.Equal(new byte[] { 9, 9, 9 }, new PersistentByteMap<Key40>(heap, typeId: 1).Get(key40));
            Assert.True(new PersistentHashMap<Key32, (long, long)>(heap, typeId: 2).TryGetValue(key32, out (long, long) value) && value == (5, 6));
        }
    }

    /// <summary>
    /// A wide-key structure's first open on a full heap: its key-size record finds no room, and the open throws
    /// InsufficientMemoryException. The type id stayed reserved, so every retry in the heap's session was refused as a
    /// second open of it, also once there was room (found by an adversarial round, session 38). Now the failed open leaves
    /// the heap as it was: a retry fails for the room alone, and opens once there is some. The control keeps the type id.
    /// </summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void AWideKeyStructuresFirstOpenOnAFullHeap_CanBeRetried(bool control)
    {
        using var dir = new TempDirectory();
        string path = dir.File("full.heap");
        var options = new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, Faults = control ? DurabilityFaults.KeepTypeIdOfAFailedOpen : DurabilityFaults.None };
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, new HeapFileOptions { Size = 1L << 20, MaxSize = 1L << 20, Domain = PersistenceDomainKind.MappedFile }, options))
        {
            List<PayloadRef> fillers = AllocateUntilFull(heap);
            Assert.Throws<InsufficientMemoryException>(() => new PersistentHashMap<Key40, long>(heap, typeId: 3));
            Exception? retry = Record.Exception(() => new PersistentHashMap<Key40, long>(heap, typeId: 3));
            if (control)
            {
                Assert.Contains("already opened", Assert.IsType<InvalidOperationException>(retry).Message, StringComparison.Ordinal);
                return;
            }

            Assert.True(retry is InsufficientMemoryException, $"the retry: {retry}");

            // Room: a few fillers deleted (their anti-payloads take the delete reserve) and reclaimed over the next versions.
            foreach (PayloadRef filler in fillers.GetRange(0, 64))
            {
                using DurableOperation op = heap.BeginOperation();
                op.Delete(filler);
            }

            for (int i = 0; i < 4; i++)
            {
                heap.Sync();
            }

            Assert.Equal(0, new PersistentHashMap<Key40, long>(heap, typeId: 3).Count);
            heap.Sync();
        }

        // The retried open recorded its key size: a reopen with another wide key is refused, with its own key it opens.
        using (BufferedDurableHeap heap = BufferedDurableHeap.Open(path, null, options))
        {
            Assert.Equal(0, new PersistentHashMap<Key40, long>(heap, typeId: 3).Count);
        }

        using (BufferedDurableHeap heap = BufferedDurableHeap.Open(path, null, options))
        {
            Assert.Contains("keys of 40 bytes, but this one's keys are 32 bytes", Assert.Throws<InvalidDataException>(() => new PersistentHashMap<Key32, long>(heap, typeId: 3)).Message, StringComparison.Ordinal);
        }
    }

    /// <summary>
    /// A wide-key structure whose key-size record was damaged, and dropped by a salvage: the structure used to open with
    /// whatever key type the caller named (and record it, locking a misreading in). Its payloads without their record
    /// are refused now, whatever the key type.
    /// </summary>
    [Fact]
    public void AWideKeyStructureWhoseRecordASalvageDropped_IsRefused()
    {
        using var dir = new TempDirectory();
        string path = dir.File("salvaged.heap");
        var key40 = new Key40(1, 2, 3, 4, 5);
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, new HeapFileOptions { Size = 1L << 20, Domain = PersistenceDomainKind.MappedFile }, NoAdvancer))
        {
            new PersistentByteMap<Key40>(heap, typeId: 1).Set(key40, new byte[] { 7 });
        }

        long record = -1;
        using (BufferedDurableHeap heap = BufferedDurableHeap.Open(path, null, NoAdvancer))
        {
            heap.Heap.ForEachAllocated((block, header) =>
            {
                if (header.TypeId < 0)
                {
                    record = block.Offset;
                }
            });
        }

        Assert.True(record > 0, "no key-size record on the file");
        using (FileStream f = File.OpenWrite(path))
        {
            RandomAccess.Write(f.SafeFileHandle, new byte[] { 0x55 }, record + HeapLayout.HeaderSize);
        }

        using (BufferedDurableHeap heap = BufferedDurableHeap.Open(path, null, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, SalvageDamagedBlocks = true }))
        {
            Assert.Equal(new[] { record }, heap.Recovery.DamagedBlocks);
            Assert.Contains("key-size record is missing", Assert.Throws<InvalidDataException>(() => new PersistentByteMap<Key32>(heap, typeId: 1)).Message, StringComparison.Ordinal);
            Assert.Contains("key-size record is missing", Assert.Throws<InvalidDataException>(() => new PersistentByteMap<Key40>(heap, typeId: 1)).Message, StringComparison.Ordinal);
        }
    }

    private readonly record struct Key40(long A, long B, long C, long D, long E);

    private readonly record struct Key32(long A, long B, long C, long D);

    [Fact]
    public void Reopen_AMapsTypeIdAsAQueue_IsRefused()
    {
        using var dir = new TempDirectory();
        string path = dir.File("map.heap");
        using (BufferedDurableHeap heap = Create(path))
        {
            new PersistentHashMap<long, long>(heap, typeId: 1).Set(1, 2);
        }

        using (BufferedDurableHeap heap = BufferedDurableHeap.Open(path, null, NoAdvancer))
        {
            // PersistentQueue<long> elements are 16 bytes, like the map's payloads: only the recorded kind tells them apart.
            InvalidDataException e = Assert.Throws<InvalidDataException>(() => new PersistentQueue<long>(heap, typeId: 1));
            Assert.Contains("PersistentHashMap", e.Message, StringComparison.Ordinal);
            Assert.Equal(1, new PersistentHashMap<long, long>(heap, typeId: 1).Count);
        }
    }

    [Fact]
    public void Structure_TypeIdOutOfRange_Throws()
    {
        using var dir = new TempDirectory();
        using BufferedDurableHeap heap = Create(dir.File("a.heap"));
        Assert.Throws<ArgumentOutOfRangeException>(() => new PersistentQueue<long>(heap, typeId: 1 << 24));
        Assert.Throws<ArgumentOutOfRangeException>(() => new PersistentHashMap<long, long>(heap, typeId: -1));
    }

    private static BufferedDurableHeap Create(string path) =>
        BufferedDurableHeap.Create(path, new HeapFileOptions { Size = 1L << 20, MaxSize = 1L << 20, Domain = PersistenceDomainKind.MappedFile }, NoAdvancer);

    /// <summary>Allocates empty payloads (the size of an anti-payload, and of a key-size record's block) until the heap is full; the delete reserve stays.</summary>
    private static List<PayloadRef> AllocateUntilFull(BufferedDurableHeap heap)
    {
        var fillers = new List<PayloadRef>();
        for (int i = 0; i < 1_000_000; i++)
        {
            using DurableOperation op = heap.BeginOperation();
            try
            {
                fillers.Add(op.Allocate(0, typeId: 99));
            }
            catch (InsufficientMemoryException)
            {
                return fillers;
            }
        }

        throw new InvalidOperationException("the heap did not fill up");
    }

    /// <summary>
    /// Allocates empty payloads (the size of an anti-payload) until the heap is full, then deletes them until a delete
    /// throws: the delete reserve (a segment's worth of anti-payloads, which ordinary allocations leave free; see
    /// FullHeapTests) is taken too, so the next anti-payload finds no block either.
    /// </summary>
    private static void FillHeap(BufferedDurableHeap heap)
    {
        List<PayloadRef> fillers = AllocateUntilFull(heap);
        foreach (PayloadRef filler in fillers)
        {
            using DurableOperation op = heap.BeginOperation();
            try
            {
                op.Delete(filler);
            }
            catch (InsufficientMemoryException)
            {
                return;
            }
        }

        throw new InvalidOperationException("the heap did not fill up");
    }
}
