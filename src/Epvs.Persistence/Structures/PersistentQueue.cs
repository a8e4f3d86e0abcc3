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
/// that dropped a damaged element, the survivors keep their order and their sequence numbers: the gap is accepted at
/// that open and every later one because both of its neighbours were kept by the salvage (tagged at or below
/// <see cref="DurableRecoveryReport.SalvagedThrough"/>, which the file records before the salvage frees anything). Nothing
/// is written to close it, so opening a salvaged queue needs no room on the heap and cannot leave half of a repair.
/// </summary>
/// <typeparam name="T">An unmanaged element type; stored by its bytes.</typeparam>
/// <remarks>All members are thread-safe (one lock, taken inside the operation's EPVS region, so lock order agrees with
/// version order). Every member but <see cref="Count"/> is one operation, <see cref="ToArray"/> included: inside an
/// operation of another heap on the same thread it throws <see cref="InvalidOperationException"/> (see
/// <see cref="BufferedDurableHeap.BeginOperation"/>).</remarks>
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
    /// <exception cref="InvalidDataException">The recovered payloads are not this queue's, or their sequence numbers have a gap that no salvage explains (an inconsistent heap), or two have one sequence number.</exception>
    /// <exception cref="ObjectDisposedException">The heap has been disposed.</exception>
    public PersistentQueue(BufferedDurableHeap heap, int typeId)
    {
        ArgumentNullException.ThrowIfNull(heap);
        _heap = heap;

        // The rebuild reads the payloads in the mapping: inside a read operation, so that a disposed heap throws and a
        // Dispose waits for it instead of unmapping under it.
        using DurableOperation op = heap.BeginRebuildOperation();
        _typeId = StructureKind.Claim(heap, op, StructureKind.Queue, typeId, keySize: 0);
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
    /// <exception cref="InvalidOperationException">No operation can begin on the heap (this one changed nothing): its advancer
    /// failed (a write-back or a fence failed: see <see cref="BufferedDurableHeap.Sync()"/>), its version space is used up, or the
    /// calling thread is inside an operation of another buffered heap.</exception>
    /// <exception cref="System.IO.IOException">In <see cref="DurabilityMode.Strict"/>, this write's own write-back failed: the
    /// write is in place but not durable (see <see cref="DurabilityMode.Strict"/>).</exception>
    /// <exception cref="ObjectDisposedException">The heap was disposed.</exception>
    public void Enqueue(T value)
    {
        using DurableOperation op = _heap.BeginOperation();
        lock (_gate)
        {
            // Room first: an Enqueue whose growth of the list ran out of memory after the allocation failed for the caller
            // while its element, written and tracked, became durable (the reopened queue had one element more).
            _items.EnsureCapacity(_items.Count + 1);
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
    /// <exception cref="InsufficientMemoryException">The heap has no block for the anti-payload: possible only on a heap
    /// that cannot grow (at its maximum size, or the libpmem domain) after a burst of deletes that took the whole delete
    /// reserve (a segment's worth, about 1,400 anti-payloads beyond the free blocks of their size, which other
    /// allocations leave free) before any of them was reclaimed; they are reclaimed, and the reserve refilled, two
    /// versions after the deletes (a <see cref="BufferedDurableHeap.Sync()"/>, or the advancer's next cycles). The element stays
    /// at the head then.</exception>
    /// <exception cref="InvalidOperationException">No operation can begin on the heap (this one changed nothing): its advancer
    /// failed (a write-back or a fence failed: see <see cref="BufferedDurableHeap.Sync()"/>), its version space is used up, or the
    /// calling thread is inside an operation of another buffered heap.</exception>
    /// <exception cref="System.IO.IOException">In <see cref="DurabilityMode.Strict"/>, this write's own write-back failed: the
    /// write is in place but not durable (see <see cref="DurabilityMode.Strict"/>).</exception>
    /// <exception cref="ObjectDisposedException">The heap was disposed.</exception>
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

            // Copied as bytes straight into the caller's variable: a copy in this frame (as T head) made the call need
            // twice the element's size of stack (a 600 KiB element into a local overflowed a 1 MiB stack). Read before
            // the anti-payload, whose block stays valid inside this operation; if the heap is full Delete throws and the
            // element stays, as recovery would see it.
            Unsafe.SkipInit(out value);
            Unsafe.CopyBlockUnaligned(ref Unsafe.As<T, byte>(ref value), ref _heap.PayloadUnchecked(offset)[sizeof(long)], (uint)sizeof(T));
            op.DeleteOwned(new PayloadRef(offset));
            _items.Dequeue();
            return true;
        }
    }

    /// <summary>A copy of the elements, oldest first.</summary>
    /// <returns>The elements.</returns>
    /// <remarks>.NET makes no arrays of value types of 64 KiB or more: for such a <typeparamref name="T"/> the runtime refuses
    /// the call itself (its result type) with a <see cref="TypeLoadException"/> before this method runs. The queue holds
    /// such elements all the same: take them one at a time with <see cref="TryDequeue"/>.</remarks>
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
        for (int i = 1; i < ordered.Length; i++)
        {
            if (ordered[i].Sequence == ordered[i - 1].Sequence + 1)
            {
                continue;
            }

            // A gap is a dropped element only between elements a salvage kept (dropped damaged blocks, at this open or an
            // earlier one): it stays, and is accepted at every later open by the same rule while both neighbours remain.
            // Elements enqueued since are numbered after the last one, so no gap can open next to them. Otherwise, or for
            // two elements of one sequence number, the heap is not a consistent prefix.
            if (ordered[i].Sequence == ordered[i - 1].Sequence)
            {
                throw new InvalidDataException($"Two recovered elements of the queue with type id {_typeId & (StructureKind.TypeIdLimit - 1)} have sequence number {ordered[i].Sequence} (at 0x{ordered[i - 1].Offset:X} and 0x{ordered[i].Offset:X}): the heap is not a consistent prefix.");
            }

            if (Math.Max(ordered[i].Epoch, ordered[i - 1].Epoch) > salvaged)
            {
                throw new InvalidDataException($"The recovered elements of the queue with type id {_typeId & (StructureKind.TypeIdLimit - 1)} are not contiguous (sequence {ordered[i - 1].Sequence} is followed by {ordered[i].Sequence}) and no salvage explains the gap: the heap is not a consistent prefix.");
            }
        }

        foreach ((_, long offset, _) in ordered)
        {
            _items.Enqueue(offset);
        }

        _nextSequence = ordered.Length == 0 ? 0 : ordered[^1].Sequence + 1;
    }
}
