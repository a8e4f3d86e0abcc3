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

    /// <summary>A published action reserved for a disposing epoch's final run (<see cref="ReserveAll"/>): only a run with
    /// <c>includeReserved</c> claims it. Like <see cref="Free"/> and <see cref="Busy"/>, larger than any epoch.</summary>
    private const long Reserved = long.MaxValue - 2;

    /// <summary>A safe epoch that covers every published action, and no reserved one.</summary>
    internal const long AllPublished = long.MaxValue - 3;

    internal struct Slot
    {
        public long Epoch;
        public Action? Action;
        public TaskCompletionSource<bool>? Completion;

        /// <summary>The epoch a slot held when <see cref="ReserveAll"/> reserved it (diagnostics: <see cref="PendingEpochs"/>).</summary>
        public long ReservedFrom;
    }

    private readonly Segment<Slot> first;
    private Segment<Slot> insertHint;

    /// <summary>Where in <see cref="insertHint"/> the last registration found its slot: the next one starts looking
    /// there, so registering behind a long run of waiting actions does not rescan them (a racy hint: any value is
    /// correct, it only decides where the search starts).</summary>
    private int insertIndex;

    /// <summary>The latest registration that was counted before a process-wide barrier and still pending after it (see
    /// <see cref="LightEpoch"/>'s <c>Defer</c>), or null. Written with release semantics after the barrier.</summary>
    private Covered? covered;

    /// <summary>A published registration: where its state word is and which epoch it was published with.</summary>
    public readonly struct Registration
    {
        private readonly Slot[] items;
        private readonly int index;

        internal Registration(Slot[] items, int index, long epoch)
        {
            this.items = items;
            this.index = index;
            Epoch = epoch;
        }

        public long Epoch { get; }

        /// <summary>Whether no drainer has claimed the action yet. Epochs are unique per registration, so a reused slot
        /// is never mistaken for this one. Acquire: pairs with the claiming CAS.</summary>
        public bool IsPending => Volatile.Read(ref items[index].Epoch) == Epoch;
    }

    private sealed class Covered
    {
        public readonly Registration Registration;

        public Covered(Registration registration) => Registration = registration;
    }

    /// <summary>Records <paramref name="registration"/> (still pending) as published before a process-wide barrier.</summary>
    public void MarkCovered(Registration registration) =>
        Volatile.Write(ref covered, new Covered(registration)); // release: after the caller's barrier

    /// <summary>Whether a registration recorded by <see cref="MarkCovered"/> is still unclaimed.</summary>
    public bool CoveredStillPending() =>
        Volatile.Read(ref covered) is { } c && c.Registration.IsPending; // acquire: pairs with MarkCovered

    /// <summary>Test-only: registrations always continue from the last one's slot, as before (they marched through the
    /// whole list once it had grown, spreading a few waiting actions over all of it).</summary>
    internal static bool RotateInsertionsForTesting { get; set; }

    /// <summary>Test-only: scans visit every segment, as before (also the ones with nothing taken).</summary>
    internal static bool ScanEverySegmentForTesting { get; set; }

    /// <summary>Broken control for tests: behind 16 or more waiting actions, registrations continue from the hint even when
    /// an earlier burst left it in a segment far larger than what waits (the old behaviour: every drain then walked it).</summary>
    internal static bool KeepFarInsertHintForTesting { get; set; }

    /// <summary>Broken control for tests, set on the thread that runs the action: a faulted action's task completes before
    /// its fault is reported (the old order: a caller that awaited the task and then disposed the epoch could have a
    /// handler still running).</summary>
    [ThreadStatic] internal static bool FaultTaskBeforeReportForTesting;

    /// <summary>Test-only: count the slots the scans visit in <see cref="SlotsScannedForTesting"/>.</summary>
    internal static bool CountScansForTesting { get; set; }

    /// <summary>Test-only: how many slots the scans have visited while <see cref="CountScansForTesting"/> was set.</summary>
    internal long SlotsScannedForTesting;

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
    public Registration Add(long epoch, Action action, TaskCompletionSource<bool>? completion, ref long pending)
    {
        Segment<Slot> start = Volatile.Read(ref insertHint);
        int from = Volatile.Read(ref insertIndex);
        long waiting = Volatile.Read(ref pending);
        if ((waiting < first.Items.Length || (start.Items.Length > 4 * waiting && !KeepFarInsertHintForTesting)) && !RotateInsertionsForTesting)
        {
            // Few actions wait: take the first free slot from the front. Registrations then stay in the first segment,
            // and the scans (RunEligible, MinPendingEpoch) skip the others, which are empty; a list that once grew long
            // (a burst behind a parked thread) no longer makes every later drain walk all of it. Behind many waiting
            // actions the hint below keeps a registration from rescanning them — unless an earlier burst left it in a
            // segment far larger than what waits now (segments double: one of length L starts about L slots in). It
            // stayed there for the epoch's life, and every drain then walked that segment: after a burst of 200,000
            // actions, 131,088 slots per drain with 40 waiting, against 48 on a fresh list.
            start = first;
            from = 0;
        }

        Segment<Slot> segment = start;
        bool wrapped = false;
        while (true)
        {
            Slot[] slots = segment.Items;
            for (int i = segment == start && !wrapped ? Math.Min(from, slots.Length) : 0; i < slots.Length; i++)
            {
                if (Volatile.Read(ref slots[i].Epoch) == Free &&
                    Interlocked.CompareExchange(ref slots[i].Epoch, Busy, Free) == Free)
                {
                    // Counted before the publication below (and before the pending count): a scan that reads 0 for the
                    // segment read it before this slot was published, as if it had read the slot itself then.
                    Interlocked.Increment(ref segment.Occupied);
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
                    Volatile.Write(ref insertIndex, i + 1); // a hint only: racing writers may leave either value
                    return new Registration(slots, i, epoch);
                }
            }

            if (Volatile.Read(ref segment.Next) is null && !wrapped && (start != first || from != 0))
            {
                // Slots before the hint may have been freed since; look there before growing (once per pass, so a
                // full list costs one rescan per segment it grows by: amortized constant).
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
    /// go to <paramref name="onFault"/> (which must not throw), and so does a failure to give a faulted action's task its
    /// exception (the task is then canceled: see <see cref="TaskFaulting"/>).
    /// </summary>
    public int RunEligible(long safeEpoch, ref long pending, Action<Exception> onFault) => RunEligible(safeEpoch, ref pending, onFault, only: null, gate: null);

    /// <summary>
    /// <see cref="RunEligible(long, ref long, Action{Exception})"/>, restricted to registrations of <paramref name="only"/>
    /// when it is not null (a drain past the inline depth limit, for a waiter: see LightEpoch.Drain), claiming through
    /// <paramref name="gate"/> when it is not null (see <see cref="ClaimGate"/>), and also claiming the actions reserved
    /// for a final run if <paramref name="includeReserved"/>.
    /// </summary>
    public int RunEligible(long safeEpoch, ref long pending, Action<Exception> onFault, Action? only, ClaimGate? gate, bool includeReserved = false)
    {
        int ran = 0;
        for (Segment<Slot>? s = first; s is not null; s = Volatile.Read(ref s.Next))
        {
            // Acquire: a segment with nothing taken has nothing to claim (see Add).
            if (Volatile.Read(ref s.Occupied) == 0 && !ScanEverySegmentForTesting)
                continue;
            Slot[] slots = s.Items;
            if (CountScansForTesting)
                Interlocked.Add(ref SlotsScannedForTesting, slots.Length);
            for (int i = 0; i < slots.Length; i++)
            {
                long e = Volatile.Read(ref slots[i].Epoch);
                // Free, Busy and Reserved are larger than any epoch, so this also skips them.
                if (e > safeEpoch && !(includeReserved && e == Reserved))
                    continue;
                // The filter reads the action before the claim. Should the slot be reused in between by a registration
                // of the same epoch, the claim below succeeds for an action the filter did not look at: it is eligible
                // all the same (its epoch is e), so running it is safe; the filter only bounds how much runs.
                if (only is not null && !ReferenceEquals(Volatile.Read(ref slots[i].Action), only))
                    continue;
                // Claim before reading the action: only the winner of this CAS runs it. The CAS is a full
                // fence, so the reads below see what the publisher wrote before its release of Epoch.
                int stripe = gate?.Enter() ?? 0;
                bool won = Interlocked.CompareExchange(ref slots[i].Epoch, Busy, e) == e;
                gate?.Exit(stripe);
                if (!won)
                    continue;
                Action action = slots[i].Action!;
                TaskCompletionSource<bool>? completion = slots[i].Completion;
                slots[i].Action = null;
                slots[i].Completion = null;
                // Release: the cleared fields are written before the slot can be reused.
                Volatile.Write(ref slots[i].Epoch, Free);
                Interlocked.Decrement(ref s.Occupied); // after the slot is free: the count never reads low
                Interlocked.Decrement(ref pending);
                ran++;
                try
                {
                    action();
                    completion?.TrySetResult(true);
                }
                catch (Exception ex)
                {
                    // Reported before the task completes: a caller that awaits the task and then disposes the epoch
                    // never has a DeferredActionFailed handler still running after Dispose returned (it used to fault the
                    // task first). Giving the task the exception allocates, so it may fail: then the task is canceled
                    // rather than left incomplete (its awaiter would wait for ever), and the failure is reported too.
                    // Never throws: the actions after this one would stay pending (on a closed epoch, for good, when this
                    // is Dispose's final run).
                    bool faultFirst = FaultTaskBeforeReportForTesting;
                    Exception? completing = faultFirst && completion is not null ? TaskFaulting.Fault(completion, ex) : null;
                    onFault(ex);
                    if (!faultFirst && completion is not null)
                        completing = TaskFaulting.Fault(completion, ex);
                    if (completing is not null)
                        onFault(completing);
                }
            }
        }
        return ran;
    }

    /// <summary>Whether a published registration of <paramref name="only"/> has an epoch at most <paramref name="safeEpoch"/>
    /// (a racy look, for a waiter deciding whether its step can run now).</summary>
    public bool HasEligible(long safeEpoch, Action only)
    {
        for (Segment<Slot>? s = first; s is not null; s = Volatile.Read(ref s.Next))
        {
            if (Volatile.Read(ref s.Occupied) == 0 && !ScanEverySegmentForTesting)
                continue; // acquire: nothing published there (see Add)
            Slot[] slots = s.Items;
            for (int i = 0; i < slots.Length; i++)
            {
                if (Volatile.Read(ref slots[i].Epoch) <= safeEpoch && ReferenceEquals(Volatile.Read(ref slots[i].Action), only))
                    return true;
            }
        }
        return false;
    }

    /// <summary>
    /// For a disposing epoch, with every other claim held back (<see cref="ClaimGate"/>): marks every published action as
    /// reserved for the final run, which alone claims them from then on. No user code runs here. A registration published
    /// during the pass may be left unmarked: it counts as made after the close (its registrar runs the list itself).
    /// </summary>
    public void ReserveAll()
    {
        for (Segment<Slot>? s = first; s is not null; s = Volatile.Read(ref s.Next))
        {
            if (Volatile.Read(ref s.Occupied) == 0 && !ScanEverySegmentForTesting)
                continue; // acquire: nothing published there (see Add)
            Slot[] slots = s.Items;
            for (int i = 0; i < slots.Length; i++)
            {
                long e = Volatile.Read(ref slots[i].Epoch);
                // A published epoch (claims are held back, so it stays one): reserved with a CAS all the same, a full fence
                // that keeps the pass ordered with a registrar publishing the slot right now.
                if (e < Reserved)
                {
                    slots[i].ReservedFrom = e; // before the CAS (a full fence): a snapshot that sees Reserved reads it
                    Interlocked.CompareExchange(ref slots[i].Epoch, Reserved, e);
                }
            }
        }
    }

    /// <summary>The smallest epoch of a published, unclaimed action, or <see cref="long.MaxValue"/> if it sees none.
    /// A slot being filled or emptied (Busy) is skipped: its registrar, or its drainer, accounts for it.</summary>
    public long MinPendingEpoch()
    {
        long min = Free;
        for (Segment<Slot>? s = first; s is not null; s = Volatile.Read(ref s.Next))
        {
            if (Volatile.Read(ref s.Occupied) == 0 && !ScanEverySegmentForTesting)
                continue; // acquire: nothing published there (see Add)
            Slot[] slots = s.Items;
            if (CountScansForTesting)
                Interlocked.Add(ref SlotsScannedForTesting, slots.Length);
            for (int i = 0; i < slots.Length; i++)
            {
                long e = Volatile.Read(ref slots[i].Epoch); // acquire: after the caller's full fence
                if (e < min)
                    min = e;
            }
        }
        return min < Reserved ? min : Free;
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
                if (e < Reserved)
                    result.Add(e);
                else if (e == Reserved)
                    result.Add(slots[i].ReservedFrom); // pending all the same, for Dispose's final run
            }
        }
        result.Sort();
        return result.ToArray();
    }
}
