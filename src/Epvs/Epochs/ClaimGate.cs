using System;
using System.Threading;

namespace Epvs;

/// <summary>
/// Holds back every claim of a <see cref="LightEpoch"/>'s deferred actions (except Dispose's final run) from just before
/// Dispose closes the epoch until it has reserved the actions pending at the close for its final run
/// (<see cref="DrainList.ReserveAll"/>), so no claim falls between the two. A drain that began before the close used to
/// go on claiming them in parallel with the final run, and Dispose returned while one still ran.
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
    /// <summary>Claims inside the gate, counted on a stripe chosen by thread id: two threads draining at once would
    /// otherwise pass one cache line back and forth on every claim (about 50 ns a registration on this machine).</summary>
    private readonly PaddedInt64[] inside = new PaddedInt64[Stripes];

    private const int Stripes = 8;

    private int closed;

    /// <summary>Claims waiting while the gate is closed (counted on that slow path only).</summary>
    private int waiting;

    /// <summary>Test hook: how many claims wait at the closed gate.</summary>
    internal int WaitingForTesting => Volatile.Read(ref waiting);

    /// <summary>Test-only: the close waits for the claims inside interruptibly (as first written), so an interrupt pending
    /// on the disposing thread threw from it, between the close and the final run.</summary>
    internal static bool InterruptibleCloseForTesting;

    /// <summary>Test hook: runs on the closing thread when it finds a claim inside the gate and waits for it.</summary>
    internal Action? CloseWaitsHookForTesting { get; set; }

    /// <summary>Enters the gate for one claim, waiting while it is closed; returns what <see cref="Exit"/> takes.</summary>
    internal int Enter()
    {
        int stripe = Environment.CurrentManagedThreadId & (Stripes - 1);
        while (true)
        {
            Interlocked.Increment(ref inside[stripe].Value); // full fence: before the read of the flag (pairs with Close)
            if (Volatile.Read(ref closed) == 0)
                return stripe;
            Interlocked.Decrement(ref inside[stripe].Value);
            Interlocked.Increment(ref waiting);
            var patient = new UninterruptibleSpinWait();
            while (Volatile.Read(ref closed) != 0)
            {
                patient.SpinOnce();
            }
            patient.End();
            Interlocked.Decrement(ref waiting);
        }
    }

    /// <summary>Leaves the gate after a claim (won or lost), before running what it claimed.</summary>
    internal void Exit(int stripe) => Interlocked.Decrement(ref inside[stripe].Value); // release: the claim's CAS is ordered before it

    /// <summary>Closes the gate and returns once no claim is inside it: claims wait until <see cref="Open"/>.</summary>
    internal void Close()
    {
        Interlocked.Exchange(ref closed, 1); // full fence: before the reads of the counts (pairs with Enter)
        var patient = new UninterruptibleSpinWait();
        // A stripe read as 0 after the fence stays free of claims: any later increment on it reads the flag set and backs out.
        for (int stripe = 0; stripe < Stripes; stripe++)
        {
            if (Volatile.Read(ref inside[stripe].Value) != 0)
                CloseWaitsHookForTesting?.Invoke();
            while (Volatile.Read(ref inside[stripe].Value) != 0)
            {
                if (InterruptibleCloseForTesting)
                    Thread.Sleep(1); // a wait that an interrupt breaks, at once
                else
                    patient.SpinOnce();
            }
        }
        patient.End();
    }

    /// <summary>Lets claims go on (release: after what the closer did while it was closed).</summary>
    internal void Open() => Volatile.Write(ref closed, 0);
}
