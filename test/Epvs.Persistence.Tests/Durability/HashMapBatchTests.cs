using System;
using System.Collections.Generic;
using System.Linq;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// <see cref="PersistentHashMap{TKey, TValue}.SetMany"/>: the same as <see cref="PersistentHashMap{TKey, TValue}.Set"/>
/// of each item in order (last value of a repeated key wins, the count of inserted keys), across index growths and
/// versions, durable after a Sync; and when it fails part-way (the index cannot grow, the heap is full), exactly the items
/// before the failing one are written, in DRAM and after a reopen.
/// </summary>
public sealed class HashMapBatchTests
{
    private static readonly HeapFileOptions FileOptions = new() { Size = 32L << 20, Domain = PersistenceDomainKind.MappedFile };

    /// <summary>
    /// Batches of 0 to 300 items (shorter and longer than the prefetch distance and the items per operation), with new
    /// keys (the index grows inside batches) and repeats (within a batch too), versions advanced between batches: the map
    /// must agree with a dictionary updated item by item, each call must return how many keys it inserted, and the
    /// reopened heap must hold the same entries.
    /// </summary>
    [Fact]
    public void SetMany_AgreesWithSetInALoop_AndIsDurableAfterSync()
    {
        using var dir = new TempDirectory();
        string path = dir.File("batch.heap");
        var expected = new Dictionary<long, long>();
        var random = new Random(11);
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, FileOptions, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan }))
        {
            var map = new PersistentHashMap<long, long>(heap, typeId: 1);
            long capacity = map.IndexCapacity;
            int growths = 0;
            for (int round = 0; round < 400; round++)
            {
                var batch = new KeyValuePair<long, long>[random.Next(0, 301)];
                for (int i = 0; i < batch.Length; i++)
                {
                    // Keys grow with the rounds (new keys, so the index grows) and repeat (within the batch too).
                    long key = random.Next(0, 100 + (round * 40));
                    batch[i] = new KeyValuePair<long, long>(key, random.NextInt64());
                }

                int inserted = 0;
                foreach (KeyValuePair<long, long> item in batch)
                {
                    inserted += expected.TryAdd(item.Key, item.Value) ? 1 : 0;
                    expected[item.Key] = item.Value;
                }

                Assert.Equal(inserted, map.SetMany(batch));
                Assert.Equal(expected.Count, map.Count);
                if (map.IndexCapacity != capacity)
                {
                    growths++;
                    capacity = map.IndexCapacity;
                }

                if (round % 7 == 0)
                {
                    heap.AdvanceVersion(TimeSpan.FromMinutes(1));
                }
            }

            Assert.True(growths >= 3, $"only {growths} index growths inside batches");
            Assert.Equal(expected.OrderBy(e => e.Key), map.ToDictionary().OrderBy(e => e.Key));
            heap.Sync();
        }

        using BufferedDurableHeap reopened = BufferedDurableHeap.Open(path, FileOptions);
        var recovered = new PersistentHashMap<long, long>(reopened, typeId: 1);
        Assert.Equal(expected.OrderBy(e => e.Key), recovered.ToDictionary().OrderBy(e => e.Key));
    }

    /// <summary>
    /// The index cannot grow (a simulated allocation failure): a batch of new keys throws
    /// <see cref="OutOfMemoryException"/> at the insert that finds no room, having written exactly the items before it —
    /// one growth attempt at half full (the insert that asked for it is written) and one more for the insert that found
    /// no room (not written). Control: none needed; a batch that skipped the failing item or wrote past it is what fails.
    /// </summary>
    /// <remarks>With <paramref name="syncBeforeDispose"/> false, the clean Dispose alone must make the prefix durable (the
    /// docs: "after a dispose a reopen shows the written ones"): the private mapping reaches the file only through the
    /// heap's write-back, so a Dispose that left the failed call's operations out would reopen without them.</remarks>
    [Theory]
    [InlineData(true)]
    [InlineData(false)]
    public void SetMany_WhenTheIndexCannotGrow_ThrowsHavingWrittenExactlyThePrefix(bool syncBeforeDispose)
    {
        using var dir = new TempDirectory();
        string path = dir.File("no-growth.heap");
        var batch = Enumerable.Range(0, 10_000).Select(k => new KeyValuePair<long, long>(k, k * 5)).ToArray();
        int written;
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, FileOptions, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, Faults = DurabilityFaults.IndexGrowthOutOfMemory }))
        {
            var map = new PersistentHashMap<long, long>(heap, typeId: 1);
            Assert.Throws<OutOfMemoryException>(() => map.SetMany(batch));
            written = checked((int)map.Count);
            Assert.InRange(written, 1, batch.Length - 1);
            Assert.Equal(2, map.IndexGrowthAttempts);
            AssertPrefix(batch, written, map);
            if (syncBeforeDispose)
            {
                heap.Sync();
            }
        }

        using BufferedDurableHeap reopened = BufferedDurableHeap.Open(path, FileOptions);
        var recovered = new PersistentHashMap<long, long>(reopened, typeId: 1);
        AssertPrefix(batch, written, recovered);

        // Without the simulated failure the rest goes in.
        Assert.Equal(batch.Length - written, recovered.SetMany(batch));
        Assert.Equal(batch.Length, recovered.Count);
    }

    /// <summary>
    /// One growth of the index fails (as if out of memory) and later ones succeed: the insert that asked for the failed
    /// growth is written; the inserts after it fill the table until one finds no room, which grows the index and is
    /// written then (not skipped, not written twice). Every key must be in the map, counted once, before and after a
    /// reopen.
    /// </summary>
    [Fact]
    public void SetMany_AfterAFailedGrowth_WritesTheInsertThatFoundNoRoomOnceGrown()
    {
        using var dir = new TempDirectory();
        string path = dir.File("one-failure.heap");
        var batch = Enumerable.Range(0, 10_000).Select(k => new KeyValuePair<long, long>(k, k * 7)).ToArray();
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, FileOptions, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan }))
        {
            var map = new PersistentHashMap<long, long>(heap, typeId: 1) { FailingIndexGrowthsForTesting = 1 };
            Assert.Equal(batch.Length, map.SetMany(batch));
            Assert.Equal(0, map.FailingIndexGrowthsForTesting);
            Assert.True(map.IndexGrowthAttempts >= 2, $"{map.IndexGrowthAttempts} growth attempts");
            AssertPrefix(batch, batch.Length, map);
            heap.Sync();
        }

        using BufferedDurableHeap reopened = BufferedDurableHeap.Open(path, FileOptions);
        AssertPrefix(batch, batch.Length, new PersistentHashMap<long, long>(reopened, typeId: 1));
    }

    /// <summary>
    /// The heap fills during a batch of new keys: <see cref="InsufficientMemoryException"/>, and the map holds exactly
    /// the items before the one that found no room, before and after a reopen.
    /// </summary>
    /// <remarks><paramref name="syncBeforeDispose"/>: as in <see cref="SetMany_WhenTheIndexCannotGrow_ThrowsHavingWrittenExactlyThePrefix"/>.</remarks>
    [Theory]
    [InlineData(true)]
    [InlineData(false)]
    public void SetMany_WhenTheHeapFills_ThrowsHavingWrittenExactlyThePrefix(bool syncBeforeDispose)
    {
        using var dir = new TempDirectory();
        string path = dir.File("full.heap");
        var small = new HeapFileOptions { Size = 4L << 20, MaxSize = 4L << 20, Domain = PersistenceDomainKind.MappedFile };
        var batch = Enumerable.Range(0, 1_000_000).Select(k => new KeyValuePair<long, long>(k, ~k)).ToArray();
        int written;
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, small, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan }))
        {
            var map = new PersistentHashMap<long, long>(heap, typeId: 1);
            Assert.Throws<InsufficientMemoryException>(() => map.SetMany(batch));
            written = checked((int)map.Count);
            Assert.InRange(written, 1, batch.Length - 1);
            AssertPrefix(batch, written, map);
            if (syncBeforeDispose)
            {
                heap.Sync();
            }
        }

        using BufferedDurableHeap reopened = BufferedDurableHeap.Open(path, small);
        AssertPrefix(batch, written, new PersistentHashMap<long, long>(reopened, typeId: 1));
    }

    /// <summary>
    /// Two threads write batches of the same keys at once (each key's last value is one of the two threads'), while
    /// versions advance in the background: the map's count matches its contents, every value is one a thread wrote for
    /// that key, and after a Sync the reopened heap holds exactly the map's entries (one live payload per key).
    /// </summary>
    [Fact]
    public void SetMany_FromTwoThreadsOnTheSameKeys_LeavesOneEntryPerKeyAndRecoversIt()
    {
        using var dir = new TempDirectory();
        string path = dir.File("two.heap");
        Dictionary<long, long> final;
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, FileOptions, new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromMilliseconds(1) }))
        {
            var map = new PersistentHashMap<long, long>(heap, typeId: 1);
            using var start = new Barrier(2);
            Thread[] threads = Enumerable.Range(0, 2).Select(t => new Thread(() =>
            {
                var random = new Random(t);
                start.SignalAndWait();
                for (int round = 0; round < 300; round++)
                {
                    var batch = new KeyValuePair<long, long>[100];
                    for (int i = 0; i < batch.Length; i++)
                    {
                        long key = random.Next(0, 5_000);
                        batch[i] = new KeyValuePair<long, long>(key, (key << 8) | (long)t);
                    }

                    map.SetMany(batch);
                }
            })).ToArray();
            foreach (Thread thread in threads)
            {
                thread.Start();
            }

            foreach (Thread thread in threads)
            {
                thread.Join();
            }

            final = map.ToDictionary();
            Assert.Equal(final.Count, map.Count);
            Assert.All(final, e => Assert.True(e.Value >> 8 == e.Key && (e.Value & 0xFF) <= 1, $"key {e.Key} holds {e.Value:X}"));
            heap.Sync();
        }

        using BufferedDurableHeap reopened = BufferedDurableHeap.Open(path, FileOptions);
        Assert.Equal(final.OrderBy(e => e.Key), new PersistentHashMap<long, long>(reopened, typeId: 1).ToDictionary().OrderBy(e => e.Key));
    }

    /// <summary>
    /// Back-pressure counts a batch's items, not its operations: once the version is older than
    /// <see cref="BufferedDurableHeapOptions.MaxVersionAge"/> (a test clock makes it two hours old), a SetMany writer ends
    /// it within about <see cref="BufferedDurableHeap.LagCheckInterval"/> items, as a Set writer does. Counting one per
    /// 64-item operation let it write about 64 times as many (12,416 items in the review's probe) first.
    /// </summary>
    [Fact]
    public void SetMany_PastMaxVersionAge_EndsTheVersionWithinTheItemsSetWould()
    {
        using var domain = new SimulatedPersistenceDomain(16L << 20);
        using HeapFile file = HeapFile.Create(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromHours(1) });
        long jump = 0;
        heap.ClockForTesting = () => System.Diagnostics.Stopwatch.GetTimestamp() + Volatile.Read(ref jump);
        var map = new PersistentHashMap<long, long>(heap, typeId: 1);
        var batch = Enumerable.Range(0, 64).Select(k => new KeyValuePair<long, long>(k, k)).ToArray();
        map.SetMany(batch);
        long version = heap.CurrentVersion;

        // The version is now two hours old; the bound is 1.25 advance periods (75 minutes).
        Volatile.Write(ref jump, 2L * System.Diagnostics.Stopwatch.Frequency * 3600);
        int items = 0;
        while (heap.CurrentVersion == version && items < 100_000)
        {
            map.SetMany(batch);
            items += batch.Length;
        }

        Assert.True(heap.CurrentVersion > version, "the version was never ended");
        Assert.True(items <= BufferedDurableHeap.LagCheckInterval + (2 * batch.Length), $"{items} items written past MaxVersionAge before the writer ended the version (Set: at most about {BufferedDurableHeap.LagCheckInterval})");
    }

    private static void AssertPrefix(KeyValuePair<long, long>[] batch, int written, PersistentHashMap<long, long> map)
    {
        Assert.Equal(written, map.Count);
        for (int i = 0; i < batch.Length; i++)
        {
            bool present = map.TryGetValue(batch[i].Key, out long value);
            Assert.True(present == (i < written), $"item {i} of {batch.Length}: present {present}, {written} written");
            if (present)
            {
                Assert.Equal(batch[i].Value, value);
            }
        }
    }

    /// <summary>
    /// Another thread of the caller's changes the batch's keys while SetMany runs (here, deterministically, each item's
    /// key just before its write, after SetMany read and hashed it): whichever keys end up written, the map must stay one
    /// slot per key — the count equal to the distinct keys, each readable — and the heap must reopen with the same
    /// entries. Reading the key again at its write (the control, as SetMany used to) wrote key k in the slot of another
    /// key's hash: the count grew past the keys, and recovery refused the file (two live payloads of one key).
    /// </summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void SetMany_WhoseItemsChangeWhileItRuns_KeepsOneSlotPerKey_AndTheFileOpens(bool control)
    {
        using var dir = new TempDirectory();
        string path = dir.File("mutated.heap");
        const int Keys = 512;
        var expected = new Dictionary<long, long>();
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, FileOptions, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan }))
        {
            var map = new PersistentHashMap<long, long>(heap, typeId: 1);
            for (long k = 0; k < Keys; k++)
            {
                map.Set(k, -1);
            }

            var batch = new KeyValuePair<long, long>[Keys];
            for (int i = 0; i < Keys; i++)
            {
                batch[i] = new KeyValuePair<long, long>(i, i);
            }

            // Each item's key becomes the next key (mod Keys) once SetMany has hashed it: as a racing thread's store.
            map.CoreForTesting.ItemsReadAheadForTesting = i => batch[i] = new KeyValuePair<long, long>((i + 1) % Keys, batch[i].Value);
            map.CoreForTesting.KeysReadAgainForTesting = control;
            try
            {
                map.SetMany(batch);
            }
            finally
            {
                map.CoreForTesting.ItemsReadAheadForTesting = null;
                map.CoreForTesting.KeysReadAgainForTesting = false;
            }

            if (control)
            {
                Assert.NotEqual(Keys, map.Count);
                heap.Sync();
                return;
            }

            Assert.Equal(Keys, map.Count);
            for (long k = 0; k < Keys; k++)
            {
                // The fixed SetMany wrote the keys it read (every key, value = its position).
                Assert.True(map.TryGetValue(k, out long value));
                Assert.Equal(k, value);
                expected[k] = value;
            }

            heap.Sync();
        }

        using (BufferedDurableHeap heap = BufferedDurableHeap.Open(path, FileOptions))
        {
            var map = new PersistentHashMap<long, long>(heap, typeId: 1);
            Assert.Equal(expected, map.ToDictionary());
        }
    }
}
