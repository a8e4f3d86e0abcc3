using System;
using System.Threading;
using System.Threading.Tasks;

namespace Epvs;

/// <summary>
/// Deferred actions waiting for their epoch to become safe: an append-only chain of slot segments
/// (<see cref="Segment{T}"/>), lock-free,
/// growing instead of blocking when full (FASTER's drain list has 16 slots and spins when they are taken,
/// which livelocks while a protected thread is parked).
/// </summary>
/// <remarks>
/// A slot's <c>Epoch</c> word is its state: <see cref="Free"/>, <see cref="Busy"/> (being filled or being
/// emptied by whoever won it), or the epoch after which the action may run. Publication writes the action
/// and then the epoch with a full fence; a drainer claims with a CAS from that epoch to Busy before it reads the
/// action (DESIGN §2.2).
/// </remarks>
internal sealed class DrainList
{
    private const long Free = long.MaxValue;
    private const long Busy = long.MaxValue - 1;

    private struct Slot
    {
        public long Epoch;
        public Action? Action;
        public TaskCompletionSource<bool>? Completion;
    }

    private readonly Segment<Slot> first;
    private Segment<Slot> insertHint;

    public DrainList(int initialSize)
    {
        first = new Segment<Slot>(initialSize);
        MarkFree(first.Items);
        insertHint = first;
    }

    public int Capacity => Segment<Slot>.TotalLength(first);

    private static void MarkFree(Slot[] slots)
    {
        for (int i = 0; i < slots.Length; i++)
            slots[i].Epoch = Free;
    }

    /// <summary>
    /// Publishes <paramref name="action"/> to run once <paramref name="epoch"/> is safe, counting it in
    /// <paramref name="pending"/> (the owner's count of published, unclaimed actions) first, so that the count can
    /// run ahead of the list but never behind it. Never blocks.
    /// </summary>
    /// <returns>The slot's state word: it holds <paramref name="epoch"/> until a drainer claims the action (epochs are
    /// unique per registration, so a reused slot cannot be mistaken for this one).</returns>
    public ref long Add(long epoch, Action action, TaskCompletionSource<bool>? completion, ref long pending)
    {
        Segment<Slot> start = Volatile.Read(ref insertHint);
        Segment<Slot> segment = start;
        bool wrapped = false;
        while (true)
        {
            Slot[] slots = segment.Items;
            for (int i = 0; i < slots.Length; i++)
            {
                if (Volatile.Read(ref slots[i].Epoch) == Free &&
                    Interlocked.CompareExchange(ref slots[i].Epoch, Busy, Free) == Free)
                {
                    slots[i].Action = action;
                    slots[i].Completion = completion;
                    // Count before publishing: a drainer decrements only after claiming, so the count never
                    // reads lower than the number of claimable actions (Suspend and ProtectAndDrain trust it).
                    Interlocked.Increment(ref pending);
                    // Full fence, and release for the fields above: the action is visible before the epoch that
                    // lets a drainer claim it (pairs with the drainer's CAS), and the registration is visible
                    // before the caller scans the epoch table (pairs with the fence a leaver issues before its scan).
                    Interlocked.Exchange(ref slots[i].Epoch, epoch);
                    if (segment != start)
                        Volatile.Write(ref insertHint, segment);
                    return ref slots[i].Epoch;
                }
            }

            if (Volatile.Read(ref segment.Next) is null && !wrapped && start != first)
            {
                // Slots before the hint may have been freed since; look there before growing.
                wrapped = true;
                segment = first;
                continue;
            }
            segment = segment.NextOrGrow(minimumSize: 16, MarkFree);
        }
    }

    /// <summary>
    /// Runs every published action whose epoch is at most <paramref name="safeEpoch"/>, decrementing
    /// <paramref name="pending"/> for each one claimed. Returns how many ran. Actions never throw out of here: faults
    /// go to <paramref name="onFault"/>.
    /// </summary>
    public int RunEligible(long safeEpoch, ref long pending, Action<Exception> onFault)
    {
        int ran = 0;
        for (Segment<Slot>? s = first; s is not null; s = Volatile.Read(ref s.Next))
        {
            Slot[] slots = s.Items;
            for (int i = 0; i < slots.Length; i++)
            {
                long e = Volatile.Read(ref slots[i].Epoch);
                // Free and Busy are larger than any epoch, so this also skips them.
                if (e > safeEpoch)
                    continue;
                // Claim before reading the action: only the winner of this CAS runs it. The CAS is a full
                // fence, so the reads below see what the publisher wrote before its release of Epoch.
                if (Interlocked.CompareExchange(ref slots[i].Epoch, Busy, e) != e)
                    continue;
                Action action = slots[i].Action!;
                TaskCompletionSource<bool>? completion = slots[i].Completion;
                slots[i].Action = null;
                slots[i].Completion = null;
                // Release: the cleared fields are written before the slot can be reused.
                Volatile.Write(ref slots[i].Epoch, Free);
                Interlocked.Decrement(ref pending);
                ran++;
                try
                {
                    action();
                    completion?.TrySetResult(true);
                }
                catch (Exception ex)
                {
                    completion?.TrySetException(ex);
                    onFault(ex);
                }
            }
        }
        return ran;
    }

    /// <summary>Epochs of the published actions, for diagnostics (racy snapshot).</summary>
    public long[] PendingEpochs()
    {
        var result = new System.Collections.Generic.List<long>();
        for (Segment<Slot>? s = first; s is not null; s = Volatile.Read(ref s.Next))
        {
            Slot[] slots = s.Items;
            for (int i = 0; i < slots.Length; i++)
            {
                long e = Volatile.Read(ref slots[i].Epoch);
                if (e < Busy)
                    result.Add(e);
            }
        }
        result.Sort();
        return result.ToArray();
    }
}
