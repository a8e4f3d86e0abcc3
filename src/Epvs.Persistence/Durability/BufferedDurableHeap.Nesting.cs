using System.Runtime.CompilerServices;
using System.Threading;

namespace Epvs.Persistence;

// The calls refused inside an operation of another heap on the same thread.
// Each heap's version transition waits for the operations of its version to end, and holds back operations that begin
// meanwhile. A thread inside an operation of heap A that begins an operation of heap B, or waits for B's version (a
// Sync, an AdvanceVersion, a Dispose's last advance), therefore waits for B's transition while holding back A's; a
// thread doing the same with the heaps the other way round holds back B's while it waits for A's. Both waited for ever
// (every writer and both advancers, until a Dispose). So every such call is refused before it changes anything: an
// operation's beginning, Sync, SyncAsync, AdvanceVersion, Dispose (also a second one waiting for one in progress),
// and creating or opening a heap (whose Dispose would be refused there, so a heap created in a using there stayed
// open with its file locked). Operations of one heap still nest. The thread's open operation is read through its
// buffers (ThreadBuffers.InsideAnOperationOfALiveHeap); an operation left open in a heap since disposed
// no longer counts. The broken control, DurabilityFaults.NestAcrossHeaps, lets every one of them through.
public sealed partial class BufferedDurableHeap
{
    /// <summary>The refusal of this heap's operation beginning inside another heap's operation (the caller found one on its hot path).</summary>
    [MethodImpl(MethodImplOptions.NoInlining)]
    private void RefuseOperationInsideAnotherHeapsOperation()
    {
        if ((_faults & DurabilityFaults.NestAcrossHeaps) == 0)
        {
            ThrowHelper.ThrowInvalidOperation("An operation of this BufferedDurableHeap (or a structure's call on it, which begins one) was begun inside an operation of another BufferedDurableHeap on the same thread: each heap's version transition waits for the operations of its version to end and holds back new ones, so threads nesting operations of two heaps wait for each other for ever. End the other heap's operation first (nesting operations of one heap is fine).");
        }
    }

    /// <summary>Refuses a Sync, SyncAsync or AdvanceVersion (<paramref name="what"/>) inside another heap's operation: it waits for this heap's version to end.</summary>
    private void RefuseWaitInsideAnotherHeapsOperation(string what)
    {
        if (InsideAnotherHeapsOperation(_faults, mine: null))
        {
            ThrowHelper.ThrowInvalidOperation($"{what} was called inside an operation of another BufferedDurableHeap on the same thread: it waits for this heap's version to end, which a thread nesting the two heaps in the other order can hold back for ever. End the other heap's operation first.");
        }
    }

    /// <summary>
    /// Refuses a Dispose inside another heap's operation, until the heap is closed (a later Dispose waits for one in
    /// progress, which may wait for this thread's operation of the other heap). Its last advance waits for this heap's
    /// version, and calls SyncCore past this check.
    /// </summary>
    private void RefuseDisposeInsideAnotherHeapsOperation()
    {
        if (_disposal.IsCompleted)
        {
            return;
        }

        // This thread's own buffers are found through the registry, not the thread-local (which a Dispose in progress
        // may dispose).
        ThreadBuffers? mine = null;
        Thread current = Thread.CurrentThread;
        // Volatile.Read: acquire; pairs with the release in RegisterThread.
        foreach (ThreadBuffers buffers in Volatile.Read(ref _registry))
        {
            if (buffers.Owner == current)
            {
                mine = buffers;
                break;
            }
        }

        if (InsideAnotherHeapsOperation(_faults, mine))
        {
            ThrowHelper.ThrowInvalidOperation("Dispose was called inside an operation of another BufferedDurableHeap on the same thread: its last advance waits for this heap's version to end, which a thread nesting the two heaps in the other order can hold back for ever. Nothing is disposed: end the other heap's operation first.");
        }
    }

    /// <summary>Refuses creating or opening a heap inside another heap's operation, before anything is created: its Dispose would be refused there.</summary>
    private static void RefuseOpeningInsideAnotherHeapsOperation(BufferedDurableHeapOptions? options)
    {
        DurabilityFaults faults = options?.Faults ?? DurabilityFaults.None;
        if (InsideAnotherHeapsOperation(faults, mine: null))
        {
            ThrowHelper.ThrowInvalidOperation("A BufferedDurableHeap was created or opened inside an operation of another BufferedDurableHeap on the same thread: it could not be disposed there (its Dispose would wait for its version, which a thread nesting the heaps in the other order can hold back for ever). End the other heap's operation first.");
        }
    }

    /// <summary>Whether the calling thread is inside an operation of a live heap other than the one of <paramref name="mine"/> (never under the broken control).</summary>
    private static bool InsideAnotherHeapsOperation(DurabilityFaults faults, ThreadBuffers? mine) =>
        (faults & DurabilityFaults.NestAcrossHeaps) == 0 && ThreadBuffers.InsideAnOperationOfALiveHeap(except: mine);
}
