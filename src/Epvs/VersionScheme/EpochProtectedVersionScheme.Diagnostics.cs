using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Threading;

namespace Epvs;

public sealed partial class EpochProtectedVersionScheme
{
    private long stepStartTimestamp;
    private int stallReported;
    private long stallThresholdTicks = Stopwatch.Frequency; // 1 s

    /// <summary>
    /// How long a step may wait for protected threads before <see cref="TransitionStalled"/> is raised (once per
    /// step). Default 1 second. A thread that holds protection for a long time stalls every transition behind it
    /// (the paper's metastable-stall warning); this is how to find it.
    /// </summary>
    /// <exception cref="ArgumentOutOfRangeException">The value is not positive.</exception>
    public TimeSpan StallThreshold
    {
        get => TimeSpan.FromSeconds((double)Volatile.Read(ref stallThresholdTicks) / Stopwatch.Frequency);
        set
        {
            if (value <= TimeSpan.Zero)
                ThrowHelper.ThrowArgumentOutOfRange(nameof(value), "The stall threshold must be positive.");
            Volatile.Write(ref stallThresholdTicks, (long)(value.TotalSeconds * Stopwatch.Frequency));
        }
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
        long start = Volatile.Read(ref stepStartTimestamp);
        if (start == 0 || !CurrentState.IsIntermediate)
            return;
        long elapsed = Stopwatch.GetTimestamp() - start;
        if (elapsed < Volatile.Read(ref stallThresholdTicks) || Volatile.Read(ref stallReported) != 0)
            return;
        if (Interlocked.Exchange(ref stallReported, 1) != 0)
            return;

        EpochDiagnostics.RecordStall();
        EventHandler<TransitionStalledEventArgs>? handler = TransitionStalled;
        if (handler is null)
            return;
        try
        {
            handler(this, new TransitionStalledEventArgs(CurrentState.WithoutIntermediate(), ElapsedSince(start), GetThreadsBlockingTransition()));
        }
        catch
        {
            // Documented: handlers must not throw; a waiting thread is no place to surface their faults.
        }
    }

    private static TimeSpan ElapsedSince(long timestamp) =>
        TimeSpan.FromSeconds((double)(Stopwatch.GetTimestamp() - timestamp) / Stopwatch.Frequency);
}
