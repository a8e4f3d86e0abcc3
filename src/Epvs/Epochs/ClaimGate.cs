using System.Threading;

namespace Epvs;

/// <summary>
/// Holds back every claim of a <see cref="LightEpoch"/>'s deferred actions (except Dispose's final run) while Dispose
/// reserves the actions pending at the close for its final run (<see cref="DrainList.ReserveAll"/>). A drain that began
/// before the close used to go on claiming them in parallel with the final run, and Dispose returned while one still ran.
/// </summary>
/// <remarks>
/// A claim enters the gate (<see cref="Enter"/>: an interlocked increment, a full fence, then a read of the closed flag;
/// while the gate is closed it backs out and waits) and leaves it before it runs what it claimed. <see cref="Close"/>
/// sets the flag (a full fence) and then waits for the claims inside the gate. Store-load on both sides: either the
/// closer's read of the count sees a claim inside, and waits for it to end, or the claim's read of the flag sees it
/// closed, and waits for <see cref="Open"/>. No user code runs inside the gate or while it is closed, so both waits are
/// a few instructions long (unless a thread is preempted) and cannot deadlock; neither is interruptible.
/// </remarks>
internal sealed class ClaimGate
{
    private PaddedInt64 inside;
    private int closed;

    /// <summary>Enters the gate for one claim, waiting while it is closed.</summary>
    internal void Enter()
    {
        while (true)
        {
            Interlocked.Increment(ref inside.Value); // full fence: before the read of the flag (pairs with Close)
            if (Volatile.Read(ref closed) == 0)
                return;
            Interlocked.Decrement(ref inside.Value);
            var patient = new UninterruptibleSpinWait();
            while (Volatile.Read(ref closed) != 0)
                patient.SpinOnce();
            patient.End();
        }
    }

    /// <summary>Leaves the gate after a claim (won or lost), before running what it claimed.</summary>
    internal void Exit() => Interlocked.Decrement(ref inside.Value); // release: the claim's CAS is ordered before it

    /// <summary>Closes the gate and returns once no claim is inside it: claims wait until <see cref="Open"/>.</summary>
    internal void Close()
    {
        Interlocked.Exchange(ref closed, 1); // full fence: before the reads of the count (pairs with Enter)
        var patient = new UninterruptibleSpinWait();
        while (Volatile.Read(ref inside.Value) != 0)
            patient.SpinOnce();
        patient.End();
    }

    /// <summary>Lets claims go on (release: after what the closer did while it was closed).</summary>
    internal void Open() => Volatile.Write(ref closed, 0);
}
