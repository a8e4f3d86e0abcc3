using System;
using System.Diagnostics.CodeAnalysis;
using System.Runtime.CompilerServices;
using System.Threading;

namespace Epvs;

public sealed unsafe partial class LightEpoch
{
    /// <summary>
    /// The <see cref="AppContext"/> switch that turns on the check that a region is left (and refreshed) by the async flow
    /// that entered it (see <see cref="LightEpoch"/>'s remarks). Read for the whole process when the first instance is created (see <see cref="s_mayCheckAsyncFlow"/>).
    /// </summary>
    internal const string CheckAsyncFlowSwitch = "Epvs.LightEpoch.CheckAsyncFlow";

    /// <summary>Test-only: when set, overrides <see cref="CheckAsyncFlowSwitch"/> for instances constructed afterwards (read
    /// once, at construction), so that a test can build a checked epoch and an unchecked control in one process; honoured
    /// only in a process where <see cref="CheckAsyncFlowTestableSwitch"/> (or the check itself) is on.</summary>
    internal static bool? CheckAsyncFlowForTesting;

    /// <summary>Test-only: coming back from a step aside keeps the marker the record holds (an action that entered and left
    /// while the thread was aside may have written its own), so the test can show that the region's own Leave would then be
    /// refused. Read only on that cold path.</summary>
    internal static bool StaleFlowAfterStepAsideForTesting;

    /// <summary>
    /// The switch this library's tests set (in their runtimeconfig) so that <see cref="CheckAsyncFlowForTesting"/> can
    /// turn the check on for single instances; never needed by users.
    /// </summary>
    internal const string CheckAsyncFlowTestableSwitch = "Epvs.LightEpoch.CheckAsyncFlowTestable";

    /// <summary>
    /// Whether any instance of this process may check the async flow (<see cref="CheckAsyncFlowSwitch"/> or
    /// <see cref="CheckAsyncFlowTestableSwitch"/> is on): a static readonly field, which the JIT's optimized code treats as
    /// a constant, so that with both switches off (the default) the checks are compiled out of the fast paths. (A branch
    /// on the instance's field alone cost Resume+Suspend about 0.4 ns of 5.5, in BenchmarkDotNet runs side by side.)
    /// </summary>
    private static readonly bool s_mayCheckAsyncFlow = IsOn(CheckAsyncFlowSwitch) || IsOn(CheckAsyncFlowTestableSwitch);

    /// <summary>Whether this instance checks the async flow (<see cref="CheckAsyncFlowSwitch"/>); fixed at construction.</summary>
    private readonly bool checkAsyncFlow;

    /// <summary>Whether this instance checks the async flow: false, folded by the JIT, unless a switch is on.</summary>
    private bool ChecksAsyncFlow
    {
        [MethodImpl(MethodImplOptions.AggressiveInlining)]
        get => s_mayCheckAsyncFlow && checkAsyncFlow;
    }

    /// <summary>With the check on: the marker of the outermost region the current async flow last entered on this instance
    /// (null with the check off). A stale value is harmless: every outermost entry writes a fresh one, here and into the
    /// thread's record (<see cref="ThreadRecord.Flow"/>).</summary>
    private readonly AsyncLocal<long>? flow;

    /// <summary>The last region marker handed out (all instances): markers are never 0, which means "not checked".</summary>
    private static long s_lastFlowMarker;

    private static bool IsOn(string name) => AppContext.TryGetSwitch(name, out bool on) && on;

    private static bool ReadCheckAsyncFlowSwitch()
    {
        if (!s_mayCheckAsyncFlow)
        {
            // The switch is read for the whole process when the first LightEpoch is created (so that, off, the check is
            // compiled out): one set later would be ignored silently.
            ThrowIfSwitchSetTooLate(mayCheck: false, switchOn: IsOn(CheckAsyncFlowSwitch));
            return false;
        }

        return CheckAsyncFlowForTesting ?? IsOn(CheckAsyncFlowSwitch);
    }

    /// <summary>Throws if the check's switch is on now but was off when the process's first epoch was created.</summary>
    internal static void ThrowIfSwitchSetTooLate(bool mayCheck, bool switchOn)
    {
        if (!mayCheck && switchOn)
            ThrowHelper.ThrowInvalidOperation(
                $"The AppContext switch {CheckAsyncFlowSwitch} was turned on after the process's first LightEpoch was created, " +
                "when it was read for the whole process: the check would be off. Turn it on before any epoch exists (best in the " +
                $"project: <RuntimeHostConfigurationOption Include=\"{CheckAsyncFlowSwitch}\" Value=\"true\" />), or turn it off again.");
    }

    /// <summary>
    /// The marker for an outermost entry about to announce: 0 with the check off; otherwise a fresh one, already stored in
    /// the current async flow. Called before the announcement, so that a Resume that fails here (storing an
    /// <see cref="AsyncLocal{T}"/> value allocates) has entered nothing.
    /// </summary>
    [MethodImpl(MethodImplOptions.NoInlining)]
    private long NewFlowMarker()
    {
        long marker = Interlocked.Increment(ref s_lastFlowMarker);
        flow!.Value = marker;
        return marker;
    }

    /// <summary>
    /// With the check on, before an outermost Suspend or ProtectAndDrain changes anything: throws if the region open on this
    /// thread was entered by another async flow (an <c>await</c> inside a region brought this flow here, or took the one that
    /// entered away). The region is left as it is: the flow that entered it is still protected by it.
    /// </summary>
    [MethodImpl(MethodImplOptions.NoInlining)]
    private void CheckFlow(ThreadRecord* r, string operation)
    {
        long entered = r->Flow;
        if (entered != 0 && flow!.Value != entered)
            ThrowOtherFlow(operation);
    }

    [DoesNotReturn]
    private static void ThrowOtherFlow(string operation)
    {
        string call = operation == nameof(Suspend) ? "Leave (Suspend)" : "Refresh (ProtectAndDrain)";
        ThrowHelper.ThrowInvalidOperation(
            $"{call} was called on a thread whose open region was entered by another async flow: an await inside a protected " +
            "region moved a flow on to this thread, or away from it, while that region was open. Ending or refreshing the " +
            "region here would release what it holds back while the flow that entered it still believes itself inside (G1). " +
            "Nothing was changed: that region is still open. Leave on the flow (and the thread) that entered, and never " +
            $"await inside a region. (Reported because the AppContext switch {CheckAsyncFlowSwitch} is on.)");
    }

    /// <summary>Whether this instance checks the async flow (test-only).</summary>
    internal bool ChecksAsyncFlowForTesting => checkAsyncFlow;
}
