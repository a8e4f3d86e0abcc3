using System;
using System.Threading;

namespace Epvs.Persistence;

// What the heap's background threads hold of it.
// The advancer and the stocker hold the heap only while they run a cycle or a stocking: between them, only this link,
// whose reference to the heap is weak. Their threads used to hold the heap itself, so a heap nobody disposed was never
// garbage: its two threads, its mapping, its descriptor and its file lock (a reopen in the same process said
// HeapFileError.AlreadyOpen) lived until the process exited. Such a heap is now collected: its finalizer
// stops both threads, and the file's own handles release the lock and the mapping as they are finalized. While a
// SyncAsync waits, the link holds the heap strongly (its task may be all that references the heap), until a cycle
// reaches its target or the heap fails or is disposed (a SyncAsync that timed out or was canceled still counts until
// then); a task still pending when the heap is finalized fails. Nothing is written: as after a crash, the next open recovers up to the durable
// frontier.
public sealed partial class BufferedDurableHeap
{
    private readonly BackgroundLink _link;

    /// <summary>Wakes the advancer (a SyncAsync, Dispose); in the link, which its thread holds instead of the heap.</summary>
    private AutoResetEvent _wake => _link.Wake;

    /// <summary>
    /// A heap that was never disposed and is unreachable: stops its background threads (they would otherwise run cycles
    /// on a heap nobody uses, and wait for ever). Not a Dispose: nothing is made durable, no clean-shutdown mark is left.
    /// </summary>
    ~BufferedDurableHeap()
    {
        // Null when the constructor threw before it made the link (invalid options, say): no thread was started, and no
        // SyncAsync can be waiting. (An exception here would kill the process: a review found a NullReferenceException.)
        BackgroundLink? link = _link;
        if (link is null)
        {
            return;
        }

        try
        {
            link.Stop();

            // A SyncAsync task its caller still holds would otherwise never complete (with an infinite SyncTimeout).
            FailWaiters(new ObjectDisposedException(nameof(BufferedDurableHeap), "The heap was collected without a Dispose before this SyncAsync's operations became durable."), close: true);
        }
        catch (Exception)
        {
            // Nothing may escape a finalizer (it would kill the process); there is nothing more to stop or fail.
        }
    }

    /// <summary>The background threads' hold on the heap (see the remarks of this file's part of the class).</summary>
    private sealed class BackgroundLink
    {
        internal BackgroundLink(BufferedDurableHeap heap) => Heap = new WeakReference<BufferedDurableHeap>(heap);

        /// <summary>The heap, held weakly: gone once nobody else references it.</summary>
        internal WeakReference<BufferedDurableHeap> Heap { get; }

        /// <summary>Wakes the advancer before its period ends (a SyncAsync, a stop).</summary>
        internal AutoResetEvent Wake { get; } = new(false);

        /// <summary>The stocker's gate: <see cref="StockRequested"/> and <see cref="StockerStopping"/> are read and written under it.</summary>
        internal object StockGate { get; } = new();

        /// <summary>The heap, held strongly while a SyncAsync of it waits (under the heap's waiters' gate): the waiter's task may be all that references it.</summary>
        internal BufferedDurableHeap? Pinned { get; set; }

        /// <summary>The advancer's period (set before its thread starts).</summary>
        internal TimeSpan Period { get; set; }

        /// <summary>Set when the advancer is to stop (Dispose, or the heap's finalizer).</summary>
        internal volatile bool Stopping;

        /// <summary>Set (under <see cref="StockGate"/>) by a cycle or an allocating thread that asks for stocking; cleared by the stocker when it starts one.</summary>
        internal bool StockRequested;

        /// <summary>Set (under <see cref="StockGate"/>) when the stocker is to stop.</summary>
        internal bool StockerStopping;

        /// <summary>Stops both threads (the finalizer of a heap never disposed: no waiting, no shield).</summary>
        internal void Stop()
        {
            Stopping = true;
            try
            {
                Wake.Set();
            }
            catch (ObjectDisposedException)
            {
                // A Dispose that stopped the advancer disposed the event.
            }

            lock (StockGate)
            {
                StockerStopping = true;
                Monitor.Pulse(StockGate);
            }
        }
    }
}
