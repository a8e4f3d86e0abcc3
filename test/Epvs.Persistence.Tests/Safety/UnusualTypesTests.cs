using System;
using System.Collections.Generic;
using System.Linq;
using System.Runtime.CompilerServices;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// A probe's checks that held (kept as regression tests): keys and values of unusual sizes (40-byte keys, 20 KB values
/// and queue elements, empty structs) round-trip through updates, removes and reopen; one type id opened at once by
/// three structures on three threads is won by exactly one, with every entry; keys not equal to themselves (NaN) agree
/// between the running and the reopened maps.
/// </summary>
public sealed class UnusualTypesTests
{
    private static readonly HeapFileOptions Mapped = new() { Size = 32L << 20, Domain = PersistenceDomainKind.MappedFile };

    [InlineArray(5000)]
    private struct Big20K
    {
        private int _element0;
    }

    [InlineArray(40)]
    private struct WideKey : IEquatable<WideKey>
    {
        private byte _element0;

        public bool Equals(WideKey other) => ((ReadOnlySpan<byte>)this).SequenceEqual(other);

        public override bool Equals(object? obj) => obj is WideKey k && Equals(k);

        public override int GetHashCode()
        {
            var h = new HashCode();
            h.AddBytes(this);
            return h.ToHashCode();
        }
    }

    private struct Empty : IEquatable<Empty>
    {
        public bool Equals(Empty other) => true;

        public override int GetHashCode() => 0;
    }

    private static WideKey Wide(int i)
    {
        WideKey k = default;
        k[0] = (byte)i;
        k[39] = (byte)(i >> 8);
        return k;
    }

    private static Big20K Value(int seed)
    {
        Big20K v = default;
        for (int i = 0; i < 5000; i++)
        {
            v[i] = seed * 7 + i;
        }

        return v;
    }

    /// <summary>Wide keys (key-size record), 20 KB values (larger than the biggest size class), and a 1-byte key and value: updates across versions, removes, SetMany, reopen after Dispose.</summary>
    [Fact]
    public void LargeAndTinyTypes_RoundTripThroughUpdatesRemovesAndReopen()
    {
        using var dir = new TempDirectory();
        string path = dir.File("big.heap");
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, Mapped, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan }))
        {
            var map = new PersistentHashMap<WideKey, Big20K>(heap, typeId: 1);
            var tiny = new PersistentHashMap<Empty, Empty>(heap, typeId: 2);
            var q = new PersistentQueue<Big20K>(heap, typeId: 3);
            for (int i = 0; i < 50; i++)
            {
                map.Set(Wide(i), Value(i));
                q.Enqueue(Value(i));
            }

            heap.Sync();
            for (int i = 0; i < 50; i += 2)
            {
                map.Set(Wide(i), Value(i + 1000)); // copies across versions
            }

            map.Set(Wide(2), Value(2000)); // in place
            Assert.True(map.Remove(Wide(3)));
            var batch = Enumerable.Range(100, 20).Select(i => new KeyValuePair<WideKey, Big20K>(Wide(i), Value(i))).ToArray();
            map.SetMany(batch);
            for (int i = 0; i < 10; i++)
            {
                q.TryDequeue(out _);
            }

            Assert.True(tiny.Set(default, default));
            Assert.False(tiny.Set(default, default));
            heap.Sync();
            Assert.True(tiny.Remove(default));
            Assert.True(tiny.Set(default, default));
        }

        using BufferedDurableHeap reopened = BufferedDurableHeap.Open(path, Mapped);
        var again = new PersistentHashMap<WideKey, Big20K>(reopened, typeId: 1);
        var tinyAgain = new PersistentHashMap<Empty, Empty>(reopened, typeId: 2);
        var qAgain = new PersistentQueue<Big20K>(reopened, typeId: 3);
        Assert.Equal(69, again.Count);
        for (int i = 0; i < 50; i++)
        {
            bool has = again.TryGetValue(Wide(i), out Big20K v);
            Assert.Equal(i != 3, has);
            if (has)
            {
                int seed = i == 2 ? 2000 : i % 2 == 0 ? i + 1000 : i;
                Assert.Equal(seed * 7 + 4999, v[4999]);
            }
        }

        Assert.Equal(1, tinyAgain.Count);
        Assert.Equal(40, qAgain.Count);
        Assert.Equal(10 * 7, qAgain.ToArray()[0][0]);
    }

    /// <summary>Two threads open the same type id at once on a heap with recovered payloads: exactly one succeeds, with every payload.</summary>
    [Fact]
    public void SameTypeId_OpenedByTwoThreadsAtOnce_OneWinsWithEveryEntry()
    {
        using var dir = new TempDirectory();
        string path = dir.File("twice.heap");
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, Mapped))
        {
            var map = new PersistentHashMap<long, long>(heap, typeId: 1);
            for (int i = 0; i < 20_000; i++)
            {
                map.Set(i, i);
            }
        }

        for (int round = 0; round < 10; round++)
        {
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(path, Mapped);
            object?[] results = new object?[3];
            using var barrier = new Barrier(3);
            var threads = Enumerable.Range(0, 3).Select(t => new Thread(() =>
            {
                barrier.SignalAndWait();
                try
                {
                    results[t] = t switch
                    {
                        0 => new PersistentHashMap<long, long>(heap, typeId: 1),
                        1 => new PersistentByteMap<long>(heap, typeId: 1),
                        _ => new PersistentHashMap<long, long>(heap, typeId: 1),
                    };
                }
                catch (Exception e)
                {
                    results[t] = e;
                }
            })).ToList();
            threads.ForEach(t => t.Start());
            threads.ForEach(t => Assert.True(t.Join(TimeSpan.FromSeconds(30))));
            var maps = results.OfType<PersistentHashMap<long, long>>().ToList();
            Assert.True(maps.Count <= 1, "two structures opened one type id");
            Assert.True(results.OfType<PersistentByteMap<long>>().Count() == 0, "a byte map opened a hash map's type id");
            Assert.True(maps.Count == 1, string.Join("; ", results.OfType<Exception>().Select(e => e.GetType().Name + ": " + e.Message)));
            Assert.Equal(20_000, maps[0].Count);
        }
    }

    private readonly record struct IeeeKey(double D)
    {
        public bool Equals(IeeeKey other) => D == other.D; // NaN != NaN: equal bytes, not Equal

        public override int GetHashCode() => D.GetHashCode();
    }

    /// <summary>Keys not Equal to themselves (NaN under ==): every Set inserts; the running and reopened maps must agree.</summary>
    [Fact]
    public void KeysNotEqualToThemselves_RunningAndReopenedAgree()
    {
        using var dir = new TempDirectory();
        string path = dir.File("nan.heap");
        long running;
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, Mapped, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan }))
        {
            var map = new PersistentHashMap<IeeeKey, long>(heap, typeId: 1);
            var bytes = new PersistentByteMap<IeeeKey>(heap, typeId: 2);
            for (int i = 0; i < 2000; i++)
            {
                Assert.True(map.Set(new IeeeKey(double.NaN), i));
                Assert.True(bytes.Set(new IeeeKey(double.NaN), new byte[] { 1 }));
            }

            Assert.False(map.Remove(new IeeeKey(double.NaN)));
            Assert.False(bytes.Remove(new IeeeKey(double.NaN)));
            running = map.Count;
            Assert.Equal(2000, bytes.Count);
        }

        using BufferedDurableHeap reopened = BufferedDurableHeap.Open(path, Mapped);
        Assert.Equal(running, new PersistentHashMap<IeeeKey, long>(reopened, typeId: 1).Count);
        Assert.Equal(2000, new PersistentByteMap<IeeeKey>(reopened, typeId: 2).Count);
    }
}
