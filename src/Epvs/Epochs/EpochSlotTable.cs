using System.Runtime.CompilerServices;
using System.Runtime.InteropServices;
using System.Threading;

namespace Epvs;

/// <summary>
/// One thread's announcement in the epoch table, on a cache line of its own.
/// </summary>
/// <remarks>
/// <see cref="Epoch"/> is the whole protocol: 0 means the slot is free, any other value means the slot
/// is owned by a protected thread that announced that epoch. Claiming a slot and announcing an epoch are
/// therefore one compare-and-swap, and leaving is one store. <see cref="OwnerThreadId"/> is written by
/// the owner after claiming and read only by diagnostics.
/// </remarks>
[StructLayout(LayoutKind.Explicit, Size = 128)]
internal struct EpochSlot
{
    [FieldOffset(64)] public long Epoch;
    [FieldOffset(72)] public int OwnerThreadId;
}

/// <summary>
/// The epoch table: an append-only chain of slot segments (<see cref="Segment{T}"/>). It starts small and grows by
/// appending a segment when every slot is taken, so any number of threads can be protected at once (FASTER's table is
/// fixed at 128 entries and spins when full). A thread keeps a direct reference to its slot's array.
/// </summary>
internal sealed unsafe class EpochSlotTable
{
    /// <summary>Written into every free slot by <see cref="LightEpoch.Dispose()"/> so no claim can succeed.</summary>
    public const long DisposedMarker = long.MaxValue;

    /// <summary>
    /// Written into its slot by a thread that steps aside inside a region (<see cref="LightEpoch.StepAside"/>): the slot
    /// stays taken (no claim succeeds, a Dispose counts it), and, above every epoch, it holds nothing back (every scan
    /// looks for announcements below a bound).
    /// </summary>
    public const long ParkedMarker = long.MaxValue - 1;

    private readonly Segment<EpochSlot> first;

    /// <summary>Test hook: runs on a thread that found every slot taken, before it appends a segment (which allocates); a
    /// hook that throws stands for an allocation failure there.</summary>
    internal static System.Action? GrowHookForTesting;

    public EpochSlotTable(int initialSize) => first = new Segment<EpochSlot>(initialSize, pinned: true);

    public Segment<EpochSlot> First => first;

    /// <summary>Total slots handed out so far (grows, never shrinks).</summary>
    public int Capacity => Segment<EpochSlot>.TotalLength(first);

    /// <summary>
    /// Claims a free slot and announces <paramref name="epoch"/> in it with one full-fence CAS, probing from
    /// <paramref name="hint"/> and appending a segment when every slot is taken. Never blocks. The returned pointer
    /// stays valid as long as the table (segments are pinned and never removed).
    /// </summary>
    public EpochSlot* Claim(long epoch, int hint)
    {
        Segment<EpochSlot> segment = first;
        while (true)
        {
            EpochSlot[] slots = segment.Items;
            int n = slots.Length;
            int start = (int)((uint)hint % (uint)n);
            for (int k = 0; k < n; k++)
            {
                int i = start + k;
                if (i >= n) i -= n;
                // A plain look first keeps probing threads from bouncing lines they cannot take.
                if (Volatile.Read(ref slots[i].Epoch) == 0 &&
                    // Full fence: the announce is globally visible before the caller reads any shared
                    // state (DESIGN §2.2). Pairs with the Interlocked.Increment in BumpCurrentEpoch that
                    // precedes the scanner's reads of this slot.
                    Interlocked.CompareExchange(ref slots[i].Epoch, epoch, 0) == 0)
                {
                    return (EpochSlot*)Unsafe.AsPointer(ref slots[i]);
                }
            }

            // Every slot seen was taken: move on, growing if this was the last segment. Doubling keeps the chain
            // logarithmic in the peak number of protected threads.
            if (Volatile.Read(ref segment.Next) is null)
                GrowHookForTesting?.Invoke();
            segment = segment.NextOrGrow(minimumSize: 16);
        }
    }

    /// <summary>
    /// The oldest epoch announced by any protected thread, or <paramref name="upperBound"/> if none is older.
    /// Reads each slot with acquire semantics; callers order these reads after their own announcement or
    /// registration with a full fence.
    /// </summary>
    public long OldestAnnounced(long upperBound)
    {
        long oldest = upperBound;
        for (Segment<EpochSlot>? s = first; s is not null; s = Volatile.Read(ref s.Next))
        {
            EpochSlot[] slots = s.Items;
            for (int i = 0; i < slots.Length; i++)
            {
                long e = Volatile.Read(ref slots[i].Epoch);
                if (e != 0 && e < oldest)
                    oldest = e;
            }
        }
        return oldest;
    }

    /// <summary>
    /// Like <see cref="OldestAnnounced"/> but ignoring one slot (the caller's own), to tell whether anyone
    /// else holds back an epoch.
    /// </summary>
    public bool AnyOtherAtOrBelow(long epoch, EpochSlot* own)
    {
        for (Segment<EpochSlot>? s = first; s is not null; s = Volatile.Read(ref s.Next))
        {
            EpochSlot[] slots = s.Items;
            for (int i = 0; i < slots.Length; i++)
            {
                if (Unsafe.AsPointer(ref slots[i]) == own)
                    continue;
                long e = Volatile.Read(ref slots[i].Epoch);
                if (e != 0 && e <= epoch)
                    return true;
            }
        }
        return false;
    }
}
