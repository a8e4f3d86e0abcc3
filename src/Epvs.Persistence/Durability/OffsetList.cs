using System;

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
            Array.Resize(ref _items, _items.Length * 2);
        }

        _items[Count++] = offset;
    }

    internal void Clear() => Count = 0;

    internal void CopyTo(Span<long> destination) => _items.AsSpan(0, Count).CopyTo(destination);
}
