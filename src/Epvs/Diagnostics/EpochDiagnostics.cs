using System.Diagnostics;
#if NET8_0_OR_GREATER
using System.Diagnostics.Metrics;
#endif

namespace Epvs;

/// <summary>
/// Metrics published under the meter named <see cref="MeterName"/> (<c>System.Diagnostics.Metrics</c>; on
/// .NET 8 and later). Instruments are only touched on cold paths (transitions, faults), and an instrument
/// with no listener costs a single branch.
/// </summary>
/// <remarks>
/// Instruments: <c>epvs.transitions</c> (counter, completed state-machine steps),
/// <c>epvs.transition.duration</c> (histogram, ms from the step's start to its completion, including the
/// wait for protected threads), <c>epvs.transition.faults</c> (counter),
/// <c>epvs.transition.stalls</c> (counter, steps that waited longer than the scheme's stall threshold),
/// <c>epvs.epoch.action_faults</c> (counter, deferred actions that threw).
/// </remarks>
internal static class EpochDiagnostics
{
    public const string MeterName = "Epvs";

#if NET8_0_OR_GREATER
    private static readonly Meter s_meter = new(MeterName, typeof(EpochDiagnostics).Assembly.GetName().Version?.ToString());
    private static readonly Counter<long> s_transitions = s_meter.CreateCounter<long>("epvs.transitions", description: "State-machine steps completed.");
    private static readonly Histogram<double> s_transitionDuration = s_meter.CreateHistogram<double>("epvs.transition.duration", "ms", "Time from a step's start to its completion, including the wait for protected threads.");
    private static readonly Counter<long> s_transitionFaults = s_meter.CreateCounter<long>("epvs.transition.faults", description: "State-machine steps whose callbacks threw.");
    private static readonly Counter<long> s_stalls = s_meter.CreateCounter<long>("epvs.transition.stalls", description: "Steps that waited longer than the stall threshold for protected threads.");
    private static readonly Counter<long> s_actionFaults = s_meter.CreateCounter<long>("epvs.epoch.action_faults", description: "Deferred epoch actions that threw.");

    // A MeterListener's measurement callback runs inside Add and Record, and its exceptions come through. These calls
    // sit between a step's critical section and the publication of its new state (or between a fault and the release
    // of the step): a throwing listener must not leave the scheme intermediate, or the step owned, for ever.

    /// <summary>Test-only: lets a listener's exception through, as before, so the test can show that it catches that.</summary>
    internal static bool LetListenerExceptionsThroughForTesting;

    /// <summary>Whether the duration histogram has a listener (a step reads the precise clock at its start only then).</summary>
    public static bool TransitionDurationListened => s_transitionDuration.Enabled;

    /// <summary>Counts a completed step and, if its start was timed (<paramref name="startTimestamp"/> not 0), records its duration.</summary>
    public static void RecordTransition(long startTimestamp)
    {
        try
        {
            s_transitions.Add(1);
            if (startTimestamp != 0 && s_transitionDuration.Enabled)
                s_transitionDuration.Record((double)(Stopwatch.GetTimestamp() - startTimestamp) * 1000 / Stopwatch.Frequency);
        }
        catch when (!LetListenerExceptionsThroughForTesting)
        {
            // Diagnostics never break the scheme.
        }
    }

    public static void RecordTransitionFault() => Record(s_transitionFaults);

    public static void RecordStall() => Record(s_stalls);

    public static void RecordActionFault() => Record(s_actionFaults);

    private static void Record(Counter<long> counter)
    {
        try
        {
            counter.Add(1);
        }
        catch when (!LetListenerExceptionsThroughForTesting)
        {
            // Diagnostics never break the scheme.
        }
    }
#else
    public static bool TransitionDurationListened => false;

    public static void RecordTransition(long startTimestamp) { }

    public static void RecordTransitionFault() { }

    public static void RecordStall() { }

    public static void RecordActionFault() { }
#endif
}
