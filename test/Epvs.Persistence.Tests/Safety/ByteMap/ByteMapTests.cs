using System;
using System.Collections.Generic;
using System.Linq;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// A probe's findings on <see cref="PersistentByteMap{TKey}"/>'s placeholders (the entries a failed insert or remove
/// leaves when the key's own code throws again): one filled through an Equal key with other bytes made the running map
/// report the placeholder's key bytes and the reopened map the payload's. The map's entries now take the key from the
/// payload, as recovery does. Also edge values (0 bytes to megabytes) and keys with padding, running and reopened alike.
/// </summary>
public sealed class ByteMapTests
{
    private static readonly HeapFileOptions Mapped = new() { Size = 16L << 20, Domain = PersistenceDomainKind.MappedFile };
    private static readonly BufferedDurableHeapOptions NoAdvancer = new() { AdvancePeriod = Timeout.InfiniteTimeSpan };

    private static T WithHashThrowAt<T>(int call, Func<T> action)
    {
        ProbeKey.HashThrowAt = call;
        try
        {
            return action();
        }
        finally
        {
            ProbeKey.HashThrowAt = 0;
        }
    }

    private static SortedDictionary<long, (long Tag, string Value)> Contents(PersistentByteMap<ProbeKey> map) =>
        new(map.ToList().ToDictionary(p => p.Key.Value, p => (p.Key.Tag, Convert.ToHexString(p.Value))));

    /// <summary>
    /// A remove whose Dictionary.Remove threw leaves a placeholder holding the removed key's bytes. A reinsert through an
    /// Equal key with other bytes fills that placeholder: the payload has the new key's bytes, the running index the
    /// old ones. The running map and the reopened map then differ in the key.
    /// </summary>
    [Fact]
    public void PlaceholderOfARemove_ReinsertedThroughAnEqualKeyWithOtherBytes_RunningAndReopenedMapsAgree()
    {
        using var dir = new TempDirectory();
        string path = dir.File("m.heap");
        SortedDictionary<long, (long, string)> running;
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, Mapped, NoAdvancer))
        {
            var map = new PersistentByteMap<ProbeKey>(heap, 5);
            map.Set(new ProbeKey(1, tag: 100), new byte[] { 1 });
            heap.Sync();

            // Calls of the hash: ShardOf (1), GetValueRefOrNullRef (2), Dictionary.Remove (3): the placeholder stays.
            Assert.True(WithHashThrowAt(3, () => map.Remove(new ProbeKey(1, tag: 100))));
            Assert.Empty(map.ToList());
            Assert.Equal(0, map.Count);

            Assert.True(map.Set(new ProbeKey(1, tag: 200), new byte[] { 2 }));
            running = Contents(map);
        }

        using BufferedDurableHeap reopened = BufferedDurableHeap.Open(path, Mapped, NoAdvancer);
        var again = Contents(new PersistentByteMap<ProbeKey>(reopened, 5));
        Assert.Equal(running, again);
    }

    /// <summary>
    /// A placeholder left by a remove whose Dictionary.Remove threw is tidied by the next remove of the key (which finds
    /// nothing to delete): the index does not keep an entry per failed call for the map's life.
    /// </summary>
    [Fact]
    public void PlaceholderOfARemove_RemovedAgain_IsTidied()
    {
        using var dir = new TempDirectory();
        using BufferedDurableHeap heap = BufferedDurableHeap.Create(dir.File("m.heap"), Mapped, NoAdvancer);
        var map = new PersistentByteMap<ProbeKey>(heap, 5);
        map.Set(new ProbeKey(1), new byte[] { 1 });
        map.Set(new ProbeKey(2), new byte[] { 2 });

        // ShardOf (1), GetValueRefOrNullRef (2), Dictionary.Remove (3) throws: the entry stays, as a placeholder.
        Assert.True(WithHashThrowAt(3, () => map.Remove(new ProbeKey(1))));
        Assert.Equal(1, map.Count);
        Assert.Equal(2, map.EntriesForTesting);

        Assert.False(map.Remove(new ProbeKey(1)));
        Assert.Equal(1, map.EntriesForTesting);
        Assert.Equal(1, map.Count);
        Assert.Equal(new byte[] { 2 }, map.Get(new ProbeKey(2)));
    }

    /// <summary>The same through the placeholder of an insert that found the heap full and whose removal threw.</summary>
    [Fact]
    public void PlaceholderOfAFailedInsert_FilledThroughAnEqualKeyWithOtherBytes_RunningAndReopenedMapsAgree()
    {
        using var dir = new TempDirectory();
        string path = dir.File("m.heap");
        var options = new HeapFileOptions { Size = 1L << 20, MaxSize = 1L << 20, Domain = PersistenceDomainKind.MappedFile };
        SortedDictionary<long, (long, string)> running;
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, options, NoAdvancer))
        {
            var map = new PersistentByteMap<ProbeKey>(heap, 5);
            long k = 1000;
            var filler = new byte[4000];
            while (true)
            {
                try
                {
                    map.Set(new ProbeKey(k++), filler);
                }
                catch (InsufficientMemoryException)
                {
                    break;
                }
            }

            // ShardOf (1), GetValueRefOrAddDefault (2), the placeholder's Dictionary.Remove (3) throws: the heap's error comes out.
            Assert.Throws<InsufficientMemoryException>(() => WithHashThrowAt(3, () => map.Set(new ProbeKey(1, tag: 100), filler)));
            Assert.Null(map.Get(new ProbeKey(1)));
            long count = map.Count;
            Assert.Equal(count, map.ToList().Count);

            // Room again: remove fillers, two Syncs reclaim them.
            for (long r = 1000; r < 1010; r++)
            {
                Assert.True(map.Remove(new ProbeKey(r)));
            }

            heap.Sync();
            heap.Sync();
            heap.Sync();
            Assert.True(map.Set(new ProbeKey(1, tag: 200), filler));
            Assert.Equal(map.Count, map.ToList().Count);
            running = Contents(map);
        }

        using BufferedDurableHeap reopened = BufferedDurableHeap.Open(path, options, NoAdvancer);
        var again = Contents(new PersistentByteMap<ProbeKey>(reopened, 5));
        Assert.Equal(running, again);
    }

    /// <summary>Edge values: 0 bytes, large values, size changes in a version and across, padded keys, remove and reinsert in one version.</summary>
    [Fact]
    public void EdgeValuesAndPaddedKeys_RunningEqualsReopened()
    {
        using var dir = new TempDirectory();
        string path = dir.File("m.heap");
        var options = new HeapFileOptions { Size = 64L << 20, Domain = PersistenceDomainKind.MappedFile };
        var expected = new Dictionary<PaddedKey, byte[]>();
        var random = new Random(5);
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, options, NoAdvancer))
        {
            var map = new PersistentByteMap<PaddedKey>(heap, 6);
            int[] sizes = { 0, 1, 7, 100, 4096, 70_000, 1 << 20, 3 << 20 };
            for (int round = 0; round < 300; round++)
            {
                var key = new PaddedKey((byte)random.Next(4), random.Next(20));
                int what = random.Next(10);
                if (what < 6)
                {
                    byte[] value = new byte[sizes[random.Next(sizes.Length)]];
                    random.NextBytes(value);
                    Assert.Equal(!expected.ContainsKey(key), map.Set(key, value));
                    expected[key] = value;
                }
                else if (what < 8)
                {
                    Assert.Equal(expected.Remove(key), map.Remove(key));
                    if (random.Next(2) == 0)
                    {
                        Assert.True(map.Set(key, Array.Empty<byte>()));
                        expected[key] = Array.Empty<byte>();
                    }
                }
                else if (what == 8)
                {
                    heap.Sync();
                }
                else
                {
                    heap.AdvanceVersion(TimeSpan.FromSeconds(30));
                }

                Assert.Equal(expected.Count, map.Count);
                byte[]? got = map.Get(key);
                Assert.Equal(expected.TryGetValue(key, out byte[]? e) ? e : null, got);
            }

            Assert.Equal(expected.Count, map.ToList().Count);
        }

        using BufferedDurableHeap reopened = BufferedDurableHeap.Open(path, options, NoAdvancer);
        var again = new PersistentByteMap<PaddedKey>(reopened, 6).ToList().ToDictionary(p => p.Key, p => p.Value);
        Assert.Equal(expected.Count, again.Count);
        foreach (var (k, v) in expected)
        {
            Assert.Equal(v, again[k]);
        }
    }
}
