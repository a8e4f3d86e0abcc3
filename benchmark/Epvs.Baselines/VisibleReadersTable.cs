using System;
using System.Threading;

namespace Epvs.Baselines;

/// <summary>
/// BRAVO's global visible-readers table (Dice &amp; Kogan 2019, "BRAVO — Biased Locking for Reader-Writer Locks",
/// USENIX ATC): an array of lock references shared by every <see cref="BravoReaderWriterLock"/> that uses it. A
/// fast-path reader publishes "I am reading lock L" by installing L in its hashed slot with a CAS; a writer revoking
/// L's bias scans the whole table and waits until no slot holds L.
/// </summary>
/// <remarks>
/// Entries are not padded, as in the paper (4096 pointers, 32 KiB): collisions and false sharing are part of the
/// design being measured. There is no collision handling: a reader whose slot is taken uses the underlying lock.
/// </remarks>
public sealed class VisibleReadersTable
{
    /// <summary>The size used by the EPVS paper's evaluation unless stated otherwise (§6).</summary>
    public const int DefaultSize = 4096;

    private static VisibleReadersTable? s_shared;

    /// <summary>The slots; null means free.</summary>
    internal readonly object?[] Slots;

    private readonly int mask;

    /// <summary>Creates a table.</summary>
    /// <param name="size">Number of slots; a power of two, at least 1.</param>
    /// <exception cref="ArgumentOutOfRangeException"><paramref name="size"/> is not a positive power of two.</exception>
    public VisibleReadersTable(int size = DefaultSize)
    {
        if (size < 1 || (size & (size - 1)) != 0)
            throw new ArgumentOutOfRangeException(nameof(size), size, "The table size must be a positive power of two.");
        Slots = new object?[size];
        mask = size - 1;
    }

    /// <summary>A process-wide table of <see cref="DefaultSize"/> slots, as BRAVO's single global table.</summary>
    public static VisibleReadersTable Shared
    {
        get
        {
            VisibleReadersTable? t = Volatile.Read(ref s_shared); // acquire: pairs with the CAS below
            if (t is not null)
                return t;
            Interlocked.CompareExchange(ref s_shared, new VisibleReadersTable(), null);
            return s_shared!;
        }
    }

    /// <summary>The number of slots.</summary>
    public int Size => Slots.Length;

    /// <summary>The slot of the calling thread for a lock with id <paramref name="lockId"/> (0 to ignore the lock).</summary>
    internal int SlotFor(int threadId, int lockId)
    {
        // A multiplicative (Fibonacci) mix, so consecutive thread ids and lock ids spread over the table.
        uint h = unchecked(((uint)threadId * 0x9E3779B1u) ^ ((uint)lockId * 0x85EBCA77u));
        h ^= h >> 15;
        h = unchecked(h * 0x2C1B3C6Du);
        h ^= h >> 12;
        return (int)(h & (uint)mask);
    }
}
