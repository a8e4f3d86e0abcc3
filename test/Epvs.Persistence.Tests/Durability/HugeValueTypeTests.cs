using System;
using System.Runtime.CompilerServices;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// A probe's finding: a map or queue of an unmanaged type of 64 KiB or more holds, reads and recovers its values, but its
/// copy methods (<see cref="PersistentHashMap{TKey, TValue}.ToDictionary"/>, <see cref="PersistentQueue{T}.ToArray"/>)
/// failed with the runtime's <see cref="TypeLoadException"/> (.NET makes no arrays of such types). The map's now says
/// why, as a <see cref="NotSupportedException"/>. The queue's cannot: the runtime refuses the call itself (its result
/// type, T[]) before it runs, so its documentation says so. The values are read one at a time.
/// </summary>
public sealed class HugeValueTypeTests
{
    [InlineArray(70_000)]
    public struct Huge
    {
        private byte _element;
    }

    [Fact]
    public void CopyMethodsOfHugeValueTypes_SayWhy_AndTheValuesStayReadable()
    {
        using var domain = new SimulatedPersistenceDomain(1 << 20, 64 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file);
        var map = new PersistentHashMap<long, Huge>(heap, typeId: 1);
        var queue = new PersistentQueue<Huge>(heap, typeId: 2);
        var value = default(Huge);
        ((Span<byte>)value)[5] = 42;
        map.Set(1, value);
        queue.Enqueue(value);

        NotSupportedException fromMap = Assert.Throws<NotSupportedException>(() => map.ToDictionary());
        Assert.Contains("70000 bytes", fromMap.Message, StringComparison.Ordinal);
        Assert.IsType<TypeLoadException>(fromMap.InnerException);
        Assert.Throws<TypeLoadException>(() => queue.ToArray()); // the runtime's, as documented

        Assert.True(map.TryGetValue(1, out Huge read));
        Assert.Equal(42, ((ReadOnlySpan<byte>)read)[5]);
        Assert.True(queue.TryDequeue(out Huge dequeued));
        Assert.Equal(42, ((ReadOnlySpan<byte>)dequeued)[5]);
    }
}
