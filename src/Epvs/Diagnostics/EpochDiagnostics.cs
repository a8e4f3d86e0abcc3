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

    public static void RecordTransition(double milliseconds)
    {
        s_transitions.Add(1);
        if (s_transitionDuration.Enabled)
            s_transitionDuration.Record(milliseconds);
    }

    public static void RecordTransitionFault() => s_transitionFaults.Add(1);

    public static void RecordStall() => s_stalls.Add(1);

    public static void RecordActionFault() => s_actionFaults.Add(1);
#else
    public static void RecordTransition(double milliseconds) { }

    public static void RecordTransitionFault() { }

    public static void RecordStall() { }

    public static void RecordActionFault() { }
#endif
}
