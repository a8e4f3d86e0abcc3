using System;
using System.Runtime.CompilerServices;

namespace Epvs.Persistence;

/// <summary>A growable list of block offsets, touched by one thread at a time (the owner inside a version, the advancer after it).</summary>
internal sealed class OffsetList
{
    private long[] _items = new long[64];

    internal int Count { get; private set; }

    internal long this[int index] => _items[index];

    internal void Add(long offset)
    {
        if (Count == _items.Length)
        {
            Grow(Count + 1);
        }

        _items[Count++] = offset;
    }

    /// <summary>
    /// Makes room for <paramref name="more"/> entries, so that that many <see cref="Add(long)"/> calls allocate nothing
    /// (an operation calls it before it allocates a block: an append that ran out of memory after the allocation left a
    /// block allocated that no list knew of).
    /// </summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    internal void EnsureRoom(int more)
    {
        if (Count + more > _items.Length)
        {
            Grow(Count + more);
        }
    }

    [MethodImpl(MethodImplOptions.NoInlining)]
    private void Grow(int needed)
    {
        int length = _items.Length * 2;
        while (length < needed)
        {
            length *= 2;
        }

        Array.Resize(ref _items, length);
    }

    /// <summary>Bytes the entries account for (retired blocks: header and payload), as given to <see cref="Add(long, long)"/>.</summary>
    internal long Bytes { get; private set; }

    /// <summary>Adds a retired block and the bytes it frees, so that reclaiming the list needs no read of its headers.</summary>
    internal void Add(long offset, long bytes)
    {
        Add(offset);
        Bytes += bytes;
    }

    internal void Clear()
    {
        Count = 0;
        Bytes = 0;
    }

    /// <summary>Removes the last entry if it is <paramref name="offset"/>; whether it did (write-back lists only: <see cref="Bytes"/> is not adjusted).</summary>
    internal bool RemoveLast(long offset)
    {
        if (Count == 0 || _items[Count - 1] != offset)
        {
            return false;
        }

        Count--;
        return true;
    }

    internal void CopyTo(Span<long> destination) => _items.AsSpan(0, Count).CopyTo(destination);
}
