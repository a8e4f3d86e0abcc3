using System;
using System.Collections.Generic;
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
        Assert.Contains("Huge value (70000 bytes)", fromMap.Message, StringComparison.Ordinal);
        Assert.IsType<TypeLoadException>(fromMap.InnerException);
        Assert.Throws<TypeLoadException>(() => queue.ToArray()); // the runtime's, as documented

        Assert.True(map.TryGetValue(1, out Huge read));
        Assert.Equal(42, ((ReadOnlySpan<byte>)read)[5]);
        Assert.True(queue.TryDequeue(out Huge dequeued));
        Assert.Equal(42, ((ReadOnlySpan<byte>)dequeued)[5]);
    }

    /// <summary>A probe's note: the message named the value's type even when the key made the entry too large. Now it names both.</summary>
    [Fact]
    public void ToDictionary_OfEntriesTooLargeByKeyAndValue_NamesBoth()
    {
        using var domain = new SimulatedPersistenceDomain(1 << 20, 64 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file);
        var map = new PersistentHashMap<LargestKey, Wide>(heap, typeId: 3);
        var key = default(LargestKey);
        ((Span<byte>)key)[7] = 9;
        var value = default(Wide);
        ((Span<byte>)value)[3] = 4;
        map.Set(key, value);

        NotSupportedException e = Assert.Throws<NotSupportedException>(() => map.ToDictionary());
        Assert.Contains("LargestKey key (4096 bytes) and a Wide value (62000 bytes)", e.Message, StringComparison.Ordinal);
        Assert.True(map.TryGetValue(key, out Wide read));
        Assert.Equal(4, ((ReadOnlySpan<byte>)read)[3]);
    }

    /// <summary>
    /// A probe's finding: a map of keys of 64 KiB or more failed in its constructor with the runtime's
    /// InvalidProgramException (a hash map: after it had claimed its type id, so a second attempt was told the type id was
    /// taken) or TypeLoadException (a byte map). Both refuse such key types first now, saying why, and the type id stays free.
    /// </summary>
    [Fact]
    public void MapsOfHugeKeys_AreRefusedBeforeTheyClaimTheirTypeId()
    {
        using var domain = new SimulatedPersistenceDomain(1 << 20, 64 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file);

        NotSupportedException fromHashMap = Assert.Throws<NotSupportedException>(() => new PersistentHashMap<HugeKey, long>(heap, typeId: 4));
        Assert.Contains("HugeKey takes 70000", fromHashMap.Message, StringComparison.Ordinal);
        NotSupportedException fromByteMap = Assert.Throws<NotSupportedException>(() => new PersistentByteMap<HugeKey>(heap, typeId: 5));
        Assert.Contains("HugeKey takes 70000", fromByteMap.Message, StringComparison.Ordinal);

        // Nothing claimed: the type ids take maps of keys that fit.
        new PersistentHashMap<long, long>(heap, typeId: 4).Set(1, 2);
        new PersistentByteMap<long>(heap, typeId: 5).Set(1, new byte[] { 3 });
        heap.Sync();
    }

    [Fact]
    public void TheLargestKeyTypeAMapTakes_Works()
    {
        using var domain = new SimulatedPersistenceDomain(1 << 20, 64 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file);
        Assert.Equal(StructureKind.MaxKeySize, Unsafe.SizeOf<LargestKey>());
        var key = default(LargestKey);
        ((Span<byte>)key)[7] = 9;
        var map = new PersistentHashMap<LargestKey, long>(heap, typeId: 6);
        var bytes = new PersistentByteMap<LargestKey>(heap, typeId: 7);
        map.Set(key, 5);
        bytes.Set(key, new byte[] { 6 });
        Assert.Single(map.ToDictionary());
        Assert.Equal(new byte[] { 6 }, bytes.Get(key));
        Assert.Single(bytes.ToList());
    }

    /// <summary>
    /// A review's finding: with the limit at 60 KiB, <c>SetMany</c> of the widest key overflowed a 1 MiB thread stack
    /// (Windows' default), which killed the process (the map passes keys by value, several frames deep). At the limit
    /// every call works on such a stack. In a child process: an overflow kills it.
    /// </summary>
    [Fact]
    public void TheWidestKeys_WorkOnAOneMiBStack()
    {
        ChildSurvives("widest-keys-on-a-small-stack");
    }

    /// <summary>
    /// A probe: <c>Set</c> of a 256 KiB value overflowed a 1 MiB thread stack and killed the process (the map copied the
    /// value into each frame on its way to the payload and the index slot; 224 KiB did, 192 KiB did not). The map passes
    /// values by reference now: every call works on such a stack, and so does a reopen. In a child process.
    /// </summary>
    [Fact]
    public void WideValues_WorkOnAOneMiBStack()
    {
        ChildSurvives("wide-values-on-a-small-stack");
    }

    /// <summary>
    /// A probe: ToDictionary of the largest entry it can return (a 4 KiB key and a 61,424-byte value) overflowed a 256 KiB
    /// thread stack and killed the process: the snapshot's frames held about 2.5 copies of the value and 13 of the key
    /// (260 KiB in optimized code, 220 KiB in tier 0), where the result is on the heap. Optimized code (tier 1): the
    /// child runs with tiered compilation off. In a child process.
    /// </summary>
    [Fact]
    public void ToDictionary_OfTheLargestEntries_WorksOnA128KiBStack()
    {
        ChildSurvives("largest-entries-to-dictionary-on-a-128k-stack", optimized: true);
    }

    /// <summary>
    /// A probe: SetMany of the widest keys needed 84 KiB of stack (21 copies of a 4 KiB key: its read-ahead ring of 16
    /// keys was stackalloc'ed), Set 16 KiB; on a 96 KiB stack it overflowed and killed the process. In a child process.
    /// </summary>
    [Fact]
    public void SetMany_OfTheWidestKeys_WorksOnA96KiBStack()
    {
        ChildSurvives("widest-keys-set-many-on-a-96k-stack");
    }

    /// <summary>
    /// A probe: TryDequeue of a 600 KiB element into a caller's local overflowed a 1 MiB stack and killed the process
    /// (TryDequeue copied the element into its own frame before the out parameter), where the map's TryGetValue into such
    /// a local works. In a child process.
    /// </summary>
    [Fact]
    public void TryDequeue_OfAWideElement_IntoALocal_WorksOnAOneMiBStack()
    {
        ChildSurvives("wide-dequeue-on-a-small-stack");
    }

    /// <summary>Runs a <see cref="SafetyChild"/> scenario in a child process (a stack overflow kills only the child) and
    /// asserts it survived; <paramref name="optimized"/> runs it with tiered compilation off (optimized code from the start).</summary>
    private static void ChildSurvives(string scenario, bool optimized = false)
    {
        using var dir = new TempDirectory();
        var environment = optimized ? new Dictionary<string, string> { ["DOTNET_TieredCompilation"] = "0" } : new Dictionary<string, string>();
        (int code, string output) = TestProgram.RunChild(environment, SafetyChild.Role, scenario, dir.File("a.heap"));
        Assert.True(code == SafetyChild.Survived, $"exit {code}: {output}");
    }

    [InlineArray(600 * 1024)]
    public struct WiderValue
    {
        private byte _element;
    }

    [InlineArray(256 * 1024)]
    public struct WideValue
    {
        private byte _element;
    }

    [InlineArray(70_000)]
    public struct HugeKey : IEquatable<HugeKey>
    {
        private byte _element;

        public readonly bool Equals(HugeKey other) => ((ReadOnlySpan<byte>)this).SequenceEqual(other);

        public override readonly bool Equals(object? obj) => obj is HugeKey other && Equals(other);

        public override readonly int GetHashCode() => ((ReadOnlySpan<byte>)this)[7];
    }

    [InlineArray(StructureKind.MaxKeySize)]
    public struct LargestKey : IEquatable<LargestKey>
    {
        private byte _element;

        public readonly bool Equals(LargestKey other) => ((ReadOnlySpan<byte>)this).SequenceEqual(other);

        public override readonly bool Equals(object? obj) => obj is LargestKey other && Equals(other);

        public override readonly int GetHashCode() => ((ReadOnlySpan<byte>)this)[7];
    }

    /// <summary>The widest value a dictionary entry holds with a <see cref="LargestKey"/> (its entry: 8 + 4,096 + 61,424 bytes, under 64 KiB).</summary>
    [InlineArray(61_424)]
    public struct WidestDictionaryValue
    {
        private byte _element;
    }

    [InlineArray(62_000)]
    public struct Wide
    {
        private byte _element;
    }
}
