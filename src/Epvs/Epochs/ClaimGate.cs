using System.Threading;

namespace Epvs;

/// <summary>
/// Keeps the drains of a <see cref="LightEpoch"/> from claiming deferred actions once Dispose has closed it, so that
/// every action still pending then is Dispose's to run, and has run when Dispose returns. A drain that began before the
/// close used to go on claiming actions in parallel with the final run, and Dispose returned while one of them still
/// ran.
/// </summary>
/// <remarks>
/// A drain enters the gate for each claim (<see cref="TryEnter"/>, a full fence, then a read of the closed flag) and
/// leaves it before it runs what it claimed; <see cref="Close"/> sets the flag (a full fence) and then waits for the
/// claims inside the gate. Store-load on both sides: either the closer's read of the count sees the drain inside, and
/// waits for its claim to end, or the drain's read of the flag sees it closed, and claims nothing. No user code runs
/// inside the gate, so the wait is a few instructions long and cannot deadlock.
/// </remarks>
internal sealed class ClaimGate
{
    private PaddedInt64 inside;
    private int closed;

    /// <summary>Test-only: claims ignore the gate (as before it existed).</summary>
    internal static bool IgnoredForTesting;

    /// <summary>Enters the gate for one claim; false once the gate is closed (nothing was entered).</summary>
    internal bool TryEnter()
    {
        if (IgnoredForTesting)
            return true;
        Interlocked.Increment(ref inside.Value); // full fence: before the read of the flag (pairs with Close)
        if (Volatile.Read(ref closed) == 0)
            return true;
        Interlocked.Decrement(ref inside.Value);
        return false;
    }

    /// <summary>Leaves the gate after a claim (won or lost), before running what it claimed.</summary>
    internal void Exit()
    {
        if (!IgnoredForTesting)
            Interlocked.Decrement(ref inside.Value); // release: the claim's CAS is ordered before it
    }

    /// <summary>Closes the gate and returns once no claim is inside it: every claim from now on fails.</summary>
    internal void Close()
    {
        Interlocked.Exchange(ref closed, 1); // full fence: before the reads of the count (pairs with TryEnter)
        var spinner = new SpinWait();
        while (Volatile.Read(ref inside.Value) != 0)
            spinner.SpinOnce(); // a claim inside is a few instructions away from leaving (unless its thread was preempted)
    }
}
