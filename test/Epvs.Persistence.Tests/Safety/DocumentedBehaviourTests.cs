using System;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>Claims of the README and the XML docs that a probe found untrue (a new user's reading).</summary>
public sealed class DocumentedBehaviourTests
{
    /// <summary>
    /// Dispose with a thread left inside an operation closes the heap and throws TimeoutException (documented); its
    /// message was Sync's verbatim ("end its operation, or wait longer"), never saying the heap was already closed,
    /// quarantined and without a clean-shutdown mark.
    /// </summary>
    [Fact]
    public void DisposeTimeout_MessageSaysTheHeapIsClosed()
    {
        using var dir = new TempDirectory();
        var heap = BufferedDurableHeap.Create(dir.File("d.heap"), new HeapFileOptions { Size = 4L << 20, Domain = PersistenceDomainKind.MappedFile },
            new BufferedDurableHeapOptions { SyncTimeout = TimeSpan.FromMilliseconds(200) });
        using var inside = new ManualResetEventSlim();
        using var release = new ManualResetEventSlim();
        var straggler = new Thread(() =>
        {
            try
            {
                using DurableOperation op = heap.BeginOperation();
                inside.Set();
                release.Wait();
            }
            catch (ObjectDisposedException)
            {
            }
        });
        straggler.Start();
        inside.Wait();
        TimeoutException e = Assert.Throws<TimeoutException>(heap.Dispose);
        release.Set();
        straggler.Join();
        // What happened to the heap first; the Sync's own message (which names what it waited for) after it.
        Assert.StartsWith("BufferedDurableHeap.Dispose: the heap is closed", e.Message, StringComparison.Ordinal);
        Assert.Contains("Its final Sync timed out", e.Message, StringComparison.Ordinal);
    }

    /// <summary>
    /// README ("No call crashes the process"): "Calls after Dispose throw ObjectDisposedException." The byte map's and
    /// queue's reads did; PersistentHashMap.TryGetValue and ToDictionary returned the closed heap's last values instead.
    /// </summary>
    [Fact]
    public void HashMapReads_AfterHeapDispose_ThrowObjectDisposed()
    {
        using var dir = new TempDirectory();
        var heap = BufferedDurableHeap.Create(dir.File("r.heap"), new HeapFileOptions { Size = 4L << 20, Domain = PersistenceDomainKind.MappedFile });
        var map = new PersistentHashMap<long, long>(heap, typeId: 1);
        var bytes = new PersistentByteMap<long>(heap, typeId: 2);
        map.Set(1, 1);
        bytes.Set(1, [1]);
        heap.Dispose();
        Assert.Throws<ObjectDisposedException>(() => bytes.Get(1));
        Assert.Throws<ObjectDisposedException>(() => map.TryGetValue(1, out _));
        Assert.Throws<ObjectDisposedException>(() => map.ToDictionary());
    }
}
