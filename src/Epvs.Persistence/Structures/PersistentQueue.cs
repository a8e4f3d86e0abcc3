using System;
using System.Collections.Generic;
using System.IO;
using System.Runtime.CompilerServices;
using System.Runtime.InteropServices;

namespace Epvs.Persistence;

/// <summary>
/// A persistent FIFO queue of unmanaged values on a <see cref="BufferedDurableHeap"/> (DESIGN §4, layer 5): each
/// element is one payload [sequence number | value]; a dequeue writes an anti-payload. The order lives in DRAM and is
/// rebuilt from the sequence numbers at recovery, which yields a contiguous FIFO prefix: exactly the enqueues and
/// dequeues of the versions up to the durable frontier. After a salvage (<see cref="BufferedDurableHeapOptions.SalvageDamagedBlocks"/>)
/// that dropped a damaged element — at that open or a later one, if the queue was not opened in the salvaging session —
/// the survivors keep their order and are renumbered to close the gap, durably before the constructor returns (Sync;
/// with the next advance when it is called inside an operation).
/// </summary>
/// <typeparam name="T">An unmanaged element type; stored by its bytes.</typeparam>
/// <remarks>All members are thread-safe (one lock, taken inside the operation's EPVS region, so lock order agrees with version order).</remarks>
public sealed unsafe class PersistentQueue<T>
    where T : unmanaged
{
    private readonly BufferedDurableHeap _heap;
    private readonly int _typeId;
    private readonly Queue<long> _items = new();
    private readonly object _gate = new();
    private long _nextSequence;

    /// <summary>Opens the queue with type id <paramref name="typeId"/> on <paramref name="heap"/>, rebuilding it from the recovered payloads.</summary>
    /// <param name="heap">The heap.</param>
    /// <param name="typeId">This queue's type id, distinct from every other structure's on the heap.</param>
    /// <remarks>The rebuild runs inside one operation of the heap, which holds back version transitions (and so Sync) until it ends; once the advancer starts one, every operation that begins waits for it too. Open the structures before other threads use the heap, or expect them to pause for as long as the rebuild.</remarks>
    /// <exception cref="ArgumentOutOfRangeException"><paramref name="typeId"/> is not in [0, 2^24) (the high bits record the structure's kind).</exception>
    /// <exception cref="InvalidOperationException">A structure with this type id was already opened on the heap.</exception>
    /// <exception cref="InvalidDataException">The recovered payloads are not this queue's, or their sequence numbers are not contiguous (an inconsistent heap) and recovery dropped no damaged block, or two have one sequence number.</exception>
    /// <exception cref="InsufficientMemoryException">After a salvage that dropped an element, the heap has no room for the renumbered copies.</exception>
    /// <exception cref="ObjectDisposedException">The heap has been disposed.</exception>
    public PersistentQueue(BufferedDurableHeap heap, int typeId)
    {
        ArgumentNullException.ThrowIfNull(heap);
        _heap = heap;

        // The rebuild reads the payloads in the mapping: inside a read operation, so that a disposed heap throws and a
        // Dispose waits for it instead of unmapping under it.
        bool renumbered;
        using (DurableOperation op = heap.BeginRebuildOperation())
        {
            _typeId = StructureKind.Claim(heap, op, StructureKind.Queue, typeId, keySize: 0);
            renumbered = Rebuild(heap.TakeRecoveredPayloads(_typeId));
        }

        if (renumbered && !heap.VersionScheme.Epoch.ThisInstanceProtected())
        {
            // Durable before the queue is used: salvage freed the damaged block durably, so a crash before the renumbered
            // copies are durable would leave a gap with no damage to explain it, which every later open refuses. (Inside
            // a caller's operation it cannot wait: durable with that operation's version.)
            heap.Sync();
        }
    }

    /// <summary>The number of elements.</summary>
    public int Count
    {
        get
        {
            lock (_gate)
            {
                return _items.Count;
            }
        }
    }

    private static int PayloadSize => sizeof(long) + Unsafe.SizeOf<T>();

    /// <summary>Appends <paramref name="value"/>.</summary>
    /// <param name="value">The value.</param>
    /// <exception cref="InsufficientMemoryException">The heap is full.</exception>
    public void Enqueue(T value)
    {
        using DurableOperation op = _heap.BeginOperation();
        lock (_gate)
        {
            PayloadRef block = op.AllocateTyped(PayloadSize, _typeId);
            Span<byte> payload = _heap.PayloadUnchecked(block.Offset);
            long sequence = _nextSequence++;
            MemoryMarshal.Write(payload, in sequence);
            MemoryMarshal.Write(payload[sizeof(long)..], in value);
            _items.Enqueue(block.Offset);
        }
    }

    /// <summary>Removes and returns the oldest element.</summary>
    /// <param name="value">The element, or default when the queue is empty.</param>
    /// <returns>Whether an element was removed.</returns>
    public bool TryDequeue(out T value)
    {
        using DurableOperation op = _heap.BeginOperation();
        lock (_gate)
        {
            if (!_items.TryPeek(out long offset))
            {
                value = default;
                return false;
            }

            // The anti-payload first: if the heap is full it throws and the element stays, as recovery would see it.
            T head = MemoryMarshal.Read<T>(_heap.PayloadUnchecked(offset)[sizeof(long)..]);
            op.DeleteOwned(new PayloadRef(offset));
            _items.Dequeue();
            value = head;
            return true;
        }
    }

    /// <summary>A copy of the elements, oldest first.</summary>
    /// <returns>The elements.</returns>
    public T[] ToArray()
    {
        using DurableOperation op = _heap.BeginReadOperation();
        lock (_gate)
        {
            var result = new T[_items.Count];
            int i = 0;
            foreach (long offset in _items)
            {
                result[i++] = MemoryMarshal.Read<T>(_heap.PayloadUnchecked(offset)[sizeof(long)..]);
            }

            return result;
        }
    }

    /// <summary>The elements' sequence numbers, oldest first (for tests: they must be contiguous).</summary>
    internal long[] Sequences()
    {
        using DurableOperation op = _heap.BeginReadOperation();
        lock (_gate)
        {
            var result = new long[_items.Count];
            int i = 0;
            foreach (long offset in _items)
            {
                result[i++] = MemoryMarshal.Read<long>(_heap.PayloadUnchecked(offset));
            }

            return result;
        }
    }

    /// <summary>
    /// Renumbers the elements that follow a gap left by salvage (a damaged element dropped) so that the queue is
    /// contiguous again: each gets a copy with its new sequence number, tagged with this version, and is durable with
    /// it. Left as it was, the gap would outlive the damaged block (which salvage frees), and every later open, seeing
    /// a gap with no damage reported, would refuse the queue.
    /// </summary>
    private void CloseGaps((long Sequence, long Offset, long Epoch)[] ordered)
    {
        // Nested in the constructor's rebuild operation; refused like any write after a failed advance cycle.
        using DurableOperation op = _heap.BeginOperation();
        for (int i = 1; i < ordered.Length; i++)
        {
            long wanted = ordered[0].Sequence + i;
            if (ordered[i].Sequence != wanted)
            {
                PayloadRef copy = op.ReplaceOwned(new PayloadRef(ordered[i].Offset), PayloadSize);
                MemoryMarshal.Write(_heap.PayloadUnchecked(copy.Offset), in wanted);
                ordered[i] = (wanted, copy.Offset, ordered[i].Epoch);
            }
        }
    }

    /// <returns>Whether elements were renumbered to close the gaps of a salvage.</returns>
    private bool Rebuild(IReadOnlyList<RecoveredPayload> payloads)
    {
        var ordered = new (long Sequence, long Offset, long Epoch)[payloads.Count];
        long salvaged = _heap.SalvagedThrough;
        for (int i = 0; i < payloads.Count; i++)
        {
            if (payloads[i].Header.Size != PayloadSize)
            {
                throw new InvalidDataException($"The queue with type id {_typeId & (StructureKind.TypeIdLimit - 1)} expects elements of {PayloadSize} bytes (a sequence number and a {typeof(T).Name}), but recovery found one of {payloads[i].Header.Size} bytes: was it written with another element type?");
            }

            ordered[i] = (MemoryMarshal.Read<long>(_heap.PayloadUnchecked(payloads[i].Block.Offset)), payloads[i].Block.Offset, payloads[i].Header.EpochTag);
        }

        Array.Sort(ordered, (a, b) => a.Sequence.CompareTo(b.Sequence));
        bool gaps = false;
        for (int i = 1; i < ordered.Length; i++)
        {
            if (ordered[i].Sequence == ordered[i - 1].Sequence + 1)
            {
                continue;
            }

            // A gap is a dropped element only between elements a salvage kept (dropped damaged blocks, at this open or an
            // earlier one, in whose session the queue may not have been opened); otherwise, or for two elements of one
            // sequence number, the heap is not a consistent prefix.
            if (Math.Max(ordered[i].Epoch, ordered[i - 1].Epoch) > salvaged || ordered[i].Sequence == ordered[i - 1].Sequence)
            {
                throw new InvalidDataException($"The recovered elements of the queue with type id {_typeId & (StructureKind.TypeIdLimit - 1)} are not contiguous (sequence {ordered[i - 1].Sequence} is followed by {ordered[i].Sequence}): the heap is not a consistent prefix.");
            }

            gaps = true;
        }

        if (gaps)
        {
            CloseGaps(ordered);
        }

        foreach ((_, long offset, _) in ordered)
        {
            _items.Enqueue(offset);
        }

        _nextSequence = ordered.Length == 0 ? 0 : ordered[^1].Sequence + 1;
        return gaps;
    }
}
