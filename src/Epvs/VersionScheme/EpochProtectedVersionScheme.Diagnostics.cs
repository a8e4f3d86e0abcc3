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
    private int stallReported;
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

    /// <summary>Records a step's start (in the step, before its state goes intermediate).</summary>
    private void RecordStepStart()
    {
        Volatile.Write(ref stepStartTimestamp, EpochDiagnostics.TransitionDurationListened ? Stopwatch.GetTimestamp() : 0);
        Volatile.Write(ref stepStartMilliseconds, NowMilliseconds());
        Volatile.Write(ref stallReported, 0);
    }

    /// <summary>
    /// Raised, at most once per step, by a thread that is waiting for a step that has been in flight longer than
    /// <see cref="StallThreshold"/>. The arguments name the threads holding it back. Costs nothing when no step
    /// waits; handlers must not throw (exceptions from handlers are ignored) and must not wait for the step.
    /// </summary>
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
        // RecordStepStart, so the start read next is this step's (or a later one's: a shorter wait, never a longer one).
        if (!CurrentState.IsIntermediate)
            return;
        long start = Volatile.Read(ref stepStartMilliseconds);
        if (start == 0)
            return;
        long elapsedMilliseconds = NowMilliseconds() - start;
        if (elapsedMilliseconds * TimeSpan.TicksPerMillisecond < Volatile.Read(ref stallThresholdTicks) || Volatile.Read(ref stallReported) != 0)
            return;
        if (Interlocked.Exchange(ref stallReported, 1) != 0)
            return;

        EpochDiagnostics.RecordStall();
        EventHandler<TransitionStalledEventArgs>? handler = TransitionStalled;
        if (handler is null)
            return;
        try
        {
            handler(this, new TransitionStalledEventArgs(CurrentState.WithoutIntermediate(), TimeSpan.FromMilliseconds(elapsedMilliseconds), GetThreadsBlockingTransition()));
        }
        catch
        {
            // Documented: handlers must not throw; a waiting thread is no place to surface their faults.
        }
    }
}
