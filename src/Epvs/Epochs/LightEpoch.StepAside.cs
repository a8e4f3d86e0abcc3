using System.Diagnostics;
using System.Threading;

namespace Epvs;

public sealed unsafe partial class LightEpoch
{
    /// <summary>
    /// Steps the calling thread's outermost level aside for a moment, inside a region that stays open (a version scheme's
    /// Refresh, so that a transition waiting for it can complete). The thread is unprotected until <see cref="ComeBack"/>,
    /// but keeps its slot, parked (<see cref="EpochSlotTable.ParkedMarker"/>: taken, holding nothing back). So coming back
    /// allocates nothing and cannot fail (claiming a slot again could: every slot may have been taken meanwhile, and the
    /// table's growth may fail), and a Dispose meanwhile finds the slot taken and refuses instead of closing the epoch
    /// under the region. Call <see cref="DrainAfterStepAside"/> next, as a Suspend would drain. Never throws.
    /// </summary>
    /// <returns>The parked slot, to give to <see cref="ComeBack"/> or <see cref="AbandonStepAside"/>.</returns>
    internal nint StepAside()
    {
        ThreadRecord* r = FindRecord();
        Debug.Assert(r->Depth == 1, "only the outermost level steps aside");
        EpochSlot* slot = r->Slot;
        r->Depth = 0;
        if (LegacyStepAsideForTesting)
        {
            Volatile.Write(ref slot->Epoch, 0);
            return 0;
        }
        // Release, as Suspend's store of 0: every access the region made happens-before a scanner reads the marker, which
        // every scan takes for "not announced" (it is above every epoch) and no claim takes for free.
        Volatile.Write(ref slot->Epoch, EpochSlotTable.ParkedMarker);
        return (nint)slot;
    }

    /// <summary>The drain of a Suspend, after <see cref="StepAside"/>: runs what stepping aside made safe. May throw, like
    /// any drain (out of memory); the thread is still stepped aside then.</summary>
    internal void DrainAfterStepAside()
    {
        // As in Suspend: this load may pass the store of the marker, which a bumper covers with its second look.
        if (Volatile.Read(ref pendingActions.Value) != 0)
            FenceAndDrain();
    }

    /// <summary>
    /// Ends a <see cref="StepAside"/>: the thread is protected again at its outermost level, in the slot it parked. Waits
    /// for nothing (no Dispose can have closed the epoch: it found the slot taken) and allocates nothing; throws only if
    /// the drain after a raised announcement fails, with the level back (the region is kept).
    /// </summary>
    internal void ComeBack(nint parked)
    {
        if (parked == 0)
        {
            Resume(); // LegacyStepAsideForTesting
            return;
        }
        var slot = (EpochSlot*)parked;
        // A fresh lookup: drains while aside may have run actions that reallocated this thread's records.
        ThreadRecord* r = FindRecord();
        if (r->Depth != 0 && !IgnoreLevelLeftBehindForTesting)
        {
            // An action that ran on this thread while it was aside left a level of its own behind (misuse): the thread is
            // protected through it. Count ours on top, as a nested Resume would, and give the parked slot back.
            r->Depth++;
            Volatile.Write(ref slot->Epoch, 0);
            return;
        }
        // Any epoch not newer than the current one is a valid announcement (see Resume). Acquire: pairs with the increment.
        long epoch = Volatile.Read(ref currentEpoch.Value);
        // Full fence: the outermost Resume's announcing compare-and-swap (DESIGN §2.2), as an exchange: nobody else
        // writes a parked slot (claims and Dispose's marks only replace 0).
        Interlocked.Exchange(ref slot->Epoch, epoch);
        r->Slot = slot;
        r->Depth = 1;
        // The same synchronous call that stepped aside, so the same async flow (ProtectAndDrain checked it): no fresh
        // marker. An action that entered and left while the thread was aside wrote its own into the record; tag the region
        // with this flow's current one again (that action may have run in an async method, whose marker did not flow out).
        if (ChecksAsyncFlow && !StaleFlowAfterStepAsideForTesting)
            r->Flow = flow!.Value;
        slot->OwnerThreadId = r->ThreadId; // diagnostics only
        if (Volatile.Read(ref currentEpoch.Value) != epoch)
            Reannounce(ref slot->Epoch, epoch, backOutOnFailure: false);
    }

    /// <summary>Ends a <see cref="StepAside"/> without coming back: the thread has left its region (only
    /// <see cref="EpochProtectedVersionScheme.LegacyFailedWaitForTesting"/>, the behaviour before, does this).</summary>
    internal void AbandonStepAside(nint parked)
    {
        if (parked != 0)
            Volatile.Write(ref ((EpochSlot*)parked)->Epoch, 0); // release: a leave
    }
}
