using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Threading;

namespace Epvs;

public sealed partial class EpochProtectedVersionScheme
{
    // A step's start, read with the coarse millisecond clock (Environment.TickCount64: about 6 ns here, against 25 ns
    // for Stopwatch.GetTimestamp, which every step used to read twice — a fifth of a transition's cost). Stall
    // detection needs no finer clock.
    private long stepStartMilliseconds;
    // Stopwatch.GetTimestamp at the step's start, read only while the duration histogram has a listener; otherwise 0.
    private long stepStartTimestamp;
    // The epoch (transitionPrior) of the last step whose stall was reported, 0 for none. Only grows: a step's epoch is
    // above every earlier step's (each step increments the epoch), so a claim is keyed to the step it timed, and a waiter
    // still looking at an earlier step can never use up a later step's report (a flag reset by each step could).
    private long stallReportedPrior;
    private long stallThresholdTicks = TimeSpan.TicksPerSecond;

    /// <summary>
    /// How long a step may wait for protected threads before <see cref="TransitionStalled"/> is raised (once per
    /// step). Default 1 second. A thread that holds protection for a long time stalls every transition behind it
    /// (the paper's metastable-stall warning); this is how to find it. Measured with the system's coarse millisecond
    /// clock (<c>Environment.TickCount64</c>), whose readings are whole ticks of a few milliseconds (4 ms on a Linux
    /// kernel at 250 Hz): a step is reported up to one tick early or late, and the reported elapsed time has that
    /// resolution. Keep the threshold well above a tick.
    /// </summary>
    /// <exception cref="ArgumentOutOfRangeException">The value is not positive.</exception>
    public TimeSpan StallThreshold
    {
        get => new TimeSpan(Volatile.Read(ref stallThresholdTicks));
        set
        {
            if (value <= TimeSpan.Zero)
                ThrowHelper.ThrowArgumentOutOfRange(nameof(value), "The stall threshold must be positive.");
            Volatile.Write(ref stallThresholdTicks, value.Ticks);
        }
    }

    /// <summary>The coarse millisecond clock (never 0: it counts from the system's start).</summary>
    private static long NowMilliseconds() =>
#if NETSTANDARD2_1
        (long)(Stopwatch.GetTimestamp() / (Stopwatch.Frequency / 1000.0));
#else
        Environment.TickCount64;
#endif

    /// <summary>Records a step's start (in the step, after <see cref="transitionPrior"/> is reset to
    /// <see cref="UnknownPrior"/> and before its state goes intermediate: see <see cref="ReportStallIfDue"/>).</summary>
    private void RecordStepStart()
    {
        Volatile.Write(ref stepStartTimestamp, EpochDiagnostics.TransitionDurationListened ? Stopwatch.GetTimestamp() : 0);
        Volatile.Write(ref stepStartMilliseconds, NowMilliseconds()); // release: after the reset of transitionPrior
    }

    /// <summary>
    /// Raised, at most once per step, by a thread that is waiting for a step that has been in flight longer than
    /// <see cref="StallThreshold"/>. The arguments name the threads holding it back. Costs nothing when no step
    /// waits; handlers must not throw (exceptions from handlers are ignored) and must not wait for the step.
    /// </summary>
    /// <remarks>
    /// <para>Who reports (the <c>epvs.transition.stalls</c> counter too): a thread blocked in
    /// <see cref="ExecuteStateMachine"/> or <see cref="AdvanceVersionWithCriticalSection"/> (waiting for another machine
    /// to end, or with <c>spin: true</c> for its own), an <see cref="Enter()"/> or <see cref="Refresh"/> waiting for the step,
    /// and <see cref="AdvanceVersionAsync"/> while it awaits its transition (it checks every threshold, so it may report up
    /// to one threshold late).</para>
    /// <para>Nobody reports a step that nobody waits for: one started with <see cref="TryExecuteStateMachine"/> or
    /// <see cref="TryAdvanceVersionWithCriticalSection"/>, with no other thread entering meanwhile, stays unreported however
    /// long it is held back. Poll <see cref="GetThreadsBlockingTransition"/> for such steps (it names the same threads), or
    /// request the transition with a form that waits for it (<c>spin: true</c>, or <see cref="AdvanceVersionAsync"/>).</para>
    /// <para>A step the machine itself delays (its <see cref="VersionSchemeStateMachine.GetNextStep"/> returns false) is
    /// held back by no thread: it is neither reported here nor listed by <see cref="GetThreadsBlockingTransition"/>.</para>
    /// </remarks>
    public event EventHandler<TransitionStalledEventArgs>? TransitionStalled;

    /// <summary>
    /// The protected threads that the step in flight is waiting for (empty when no step is in flight): those that
    /// announced the step's epoch or an older one. A snapshot, taken without stopping anyone.
    /// </summary>
    /// <returns>The blocking threads, oldest announcement first.</returns>
    public IReadOnlyList<EpochSlotInfo> GetThreadsBlockingTransition()
    {
        long prior = Volatile.Read(ref transitionPrior);
        if (!CurrentState.IsIntermediate || prior == UnknownPrior)
            return Array.Empty<EpochSlotInfo>();
        return epoch.GetSnapshot(prior).ProtectedThreads;
    }

    /// <summary>Called from wait loops: raises <see cref="TransitionStalled"/> once if the step in flight is overdue.</summary>
    private void ReportStallIfDue()
    {
        // The state first: its acquire pairs with the step's CAS to the intermediate state, which follows the step's
        // RecordStepStart, so what is read next is this step's (or a later one's).
        long word = Volatile.Read(ref state);
        if ((word & VersionSchemeState.IntermediateMask) == 0 || Volatile.Read(ref disposed) != 0)
            return;
        // Then the step's epoch, its start, and its epoch again. The step writes them in the other order (its epoch reset
        // to UnknownPrior, its start, the intermediate state, its epoch), each a release: a start read after reading the
        // step's epoch (acquire) is that step's or a later one's, and a later one's reset of the epoch comes before its
        // start, so the second read of the epoch sees that reset. Equal reads: the start and the epoch are one step's.
        long prior = Volatile.Read(ref transitionPrior);
        if (prior == UnknownPrior)
            return; // between publishing the state and bumping the epoch: nothing waits yet
        long start = Volatile.Read(ref stepStartMilliseconds);
        if (start == 0 || Volatile.Read(ref transitionPrior) != prior || Volatile.Read(ref state) != word)
            return; // moved on meanwhile (the state read last pairs the from-state with the step, up to a same-word ABA)
        long elapsedMilliseconds = NowMilliseconds() - start;
        if (elapsedMilliseconds * TimeSpan.TicksPerMillisecond < Volatile.Read(ref stallThresholdTicks))
            return;
        long reported = Volatile.Read(ref stallReportedPrior);
        if (reported >= prior)
            return; // this step (or a later one) has been reported
        StallDueHookForTesting?.Invoke();
        // Claim this step's report, keyed to its epoch; never move the key back (a waiter of an earlier step may race us).
        while (true)
        {
            long witnessed = Interlocked.CompareExchange(ref stallReportedPrior, prior, reported);
            if (witnessed == reported)
                break;
            if (witnessed >= prior)
                return;
            reported = witnessed;
        }

        EpochDiagnostics.RecordStall();
        EventHandler<TransitionStalledEventArgs>? handler = TransitionStalled;
        if (handler is null)
            return;
        try
        {
            // The step's own from-state and epoch, as read above: the state may have moved on since.
            var from = new VersionSchemeState(word).WithoutIntermediate();
            handler(this, new TransitionStalledEventArgs(from, TimeSpan.FromMilliseconds(elapsedMilliseconds), epoch.GetSnapshot(prior).ProtectedThreads));
        }
        catch
        {
            // Documented: handlers must not throw; a waiting thread is no place to surface their faults.
        }
    }
}
