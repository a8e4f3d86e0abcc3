using System;
using System.Runtime.InteropServices;
using System.Threading;

namespace Epvs;

/// <summary>
/// One array in an append-only chain: the growth scheme behind the epoch table and the drain list. Arrays are never
/// moved or removed, so a reader can keep a reference (or, for a pinned chain, a pointer) to an element and a scanner
/// that follows <see cref="Next"/> sees every element ever handed out.
/// </summary>
internal sealed class Segment<T>
{
    public readonly T[] Items;

    /// <summary>Set once, by CAS; read with <c>Volatile.Read</c>.</summary>
    public Segment<T>? Next;

    /// <summary>
    /// For the drain list: an upper bound on how many of <see cref="Items"/> are taken (counted before a slot is
    /// published, uncounted after it is free again), so that a scan skips a segment that reads 0. Interlocked only.
    /// </summary>
    public int Occupied;

    private readonly bool pinned;
#if !NET5_0_OR_GREATER
    private GCHandle handle;
#endif

    /// <param name="size">Number of elements.</param>
    /// <param name="pinned">Whether the array must never move (elements of unmanaged types only), so that pointers
    /// to its elements stay valid for as long as the segment is alive.</param>
    public Segment(int size, bool pinned = false)
    {
        this.pinned = pinned;
        if (!pinned)
        {
            Items = new T[size];
            return;
        }
#if NET5_0_OR_GREATER
        Items = GC.AllocateArray<T>(size, pinned: true);
#else
        Items = new T[size];
        handle = GCHandle.Alloc(Items, GCHandleType.Pinned);
#endif
    }

#if !NET5_0_OR_GREATER
    ~Segment()
    {
        if (handle.IsAllocated)
            handle.Free();
    }
#endif

    /// <summary>The next segment, appending one twice this size (at least <paramref name="minimumSize"/>, pinned if
    /// this one is) if there is none yet. Racing growers agree on one successor.</summary>
    public Segment<T> NextOrGrow(int minimumSize, Action<T[]>? initialize = null)
    {
        Segment<T>? next = Volatile.Read(ref Next);
        if (next is not null)
            return next;
        var grown = new Segment<T>(Math.Max(minimumSize, Items.Length * 2), pinned);
        initialize?.Invoke(grown.Items);
        return Interlocked.CompareExchange(ref Next, grown, null) ?? grown;
    }

    /// <summary>Elements in the chain that starts at <paramref name="first"/>.</summary>
    public static int TotalLength(Segment<T> first)
    {
        int total = 0;
        for (Segment<T>? s = first; s is not null; s = Volatile.Read(ref s.Next))
            total += s.Items.Length;
        return total;
    }
}
