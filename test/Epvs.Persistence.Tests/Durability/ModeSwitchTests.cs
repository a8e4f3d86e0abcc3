using System;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>A file written Transient reopens empty as Buffered; a file with durable data is refused as Transient, intact.</summary>
public sealed class ModeSwitchTests
{
    private readonly ITestOutputHelper _output;

    public ModeSwitchTests(ITestOutputHelper output) => _output = output;

    [Fact]
    public void TransientFile_ReopenedBuffered_AndDurableFile_ReopenedTransient()
    {
        using var dir = new TempDirectory();
        string path = dir.File("t.heap");
        var fo = new HeapFileOptions { Size = 4 << 20, Domain = PersistenceDomainKind.MappedFile };
        using (var heap = BufferedDurableHeap.Create(path, fo, new BufferedDurableHeapOptions { Mode = DurabilityMode.Transient }))
        {
            var map = new PersistentHashMap<long, long>(heap, 1);
            for (int i = 0; i < 100; i++) map.Set(i, i);
        }

        using (var heap = BufferedDurableHeap.Open(path, fo, new BufferedDurableHeapOptions { Mode = DurabilityMode.Buffered }))
        {
            var map = new PersistentHashMap<long, long>(heap, 1);
            _output.WriteLine($"transient then buffered: {map.Count} keys; {heap.Recovery}");
            Assert.Equal(0, map.Count);
            map.Set(1, 2);
        }

        Assert.Throws<InvalidOperationException>(() => BufferedDurableHeap.Open(path, fo, new BufferedDurableHeapOptions { Mode = DurabilityMode.Transient }).Dispose());
        using (var heap = BufferedDurableHeap.Open(path, fo, new BufferedDurableHeapOptions { Mode = DurabilityMode.Strict }))
        {
            Assert.True(new PersistentHashMap<long, long>(heap, 1).TryGetValue(1, out long v) && v == 2);
        }
    }
}
