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
/// dequeues of the versions up to the durable frontier.
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
    /// <exception cref="ArgumentOutOfRangeException"><paramref name="typeId"/> is not in [0, 2^24) (the high bits record the structure's kind).</exception>
    /// <exception cref="InvalidOperationException">A structure with this type id was already opened on the heap.</exception>
    /// <exception cref="InvalidDataException">The recovered payloads are not this queue's, or their sequence numbers are not contiguous (an inconsistent heap).</exception>
    /// <exception cref="ObjectDisposedException">The heap has been disposed.</exception>
    public PersistentQueue(BufferedDurableHeap heap, int typeId)
    {
        ArgumentNullException.ThrowIfNull(heap);
        _heap = heap;

        // The rebuild reads the payloads in the mapping: inside a read operation, so that a disposed heap throws and a
        // Dispose waits for it instead of unmapping under it.
        using DurableOperation op = heap.BeginRebuildOperation();
        _typeId = StructureKind.Claim(heap, StructureKind.Queue, typeId, keySize: 0);
        Rebuild(heap.TakeRecoveredPayloads(_typeId));
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
            PayloadRef block = op.Allocate(PayloadSize, _typeId);
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
            op.Delete(new PayloadRef(offset));
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

    private void Rebuild(IReadOnlyList<RecoveredPayload> payloads)
    {
        var ordered = new (long Sequence, long Offset)[payloads.Count];
        for (int i = 0; i < payloads.Count; i++)
        {
            if (payloads[i].Header.Size != PayloadSize)
            {
                throw new InvalidDataException($"The queue with type id {_typeId & (StructureKind.TypeIdLimit - 1)} expects elements of {PayloadSize} bytes (a sequence number and a {typeof(T).Name}), but recovery found one of {payloads[i].Header.Size} bytes: was it written with another element type?");
            }

            ordered[i] = (MemoryMarshal.Read<long>(_heap.PayloadUnchecked(payloads[i].Block.Offset)), payloads[i].Block.Offset);
        }

        Array.Sort(ordered, (a, b) => a.Sequence.CompareTo(b.Sequence));
        for (int i = 1; i < ordered.Length; i++)
        {
            if (ordered[i].Sequence != ordered[i - 1].Sequence + 1)
            {
                string salvaged = _heap.Recovery.DamagedBlocks.Count != 0 ? $" Recovery dropped {_heap.Recovery.DamagedBlocks.Count} damaged block(s) (SalvageDamagedBlocks), perhaps an element among them: the surviving elements' payloads are on the heap (PersistentHeap.ForEachAllocated)." : string.Empty;
                throw new InvalidDataException($"The recovered elements of the queue with type id {_typeId & (StructureKind.TypeIdLimit - 1)} are not contiguous (sequence {ordered[i - 1].Sequence} is followed by {ordered[i].Sequence}): the heap is not a consistent prefix.{salvaged}");
            }
        }

        foreach ((_, long offset) in ordered)
        {
            _items.Enqueue(offset);
        }

        _nextSequence = ordered.Length == 0 ? 0 : ordered[^1].Sequence + 1;
    }
}
