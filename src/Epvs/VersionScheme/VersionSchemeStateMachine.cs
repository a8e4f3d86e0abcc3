using System;
using System.Threading;
using System.Threading.Tasks;

namespace Epvs;

/// <summary>
/// A sequence of transitions that takes an <see cref="EpochProtectedVersionScheme"/> to a new version. The scheme
/// asks <see cref="GetNextStep"/> for each next state, runs <see cref="OnEnteringState"/> under mutual exclusion
/// with every protected region, publishes the state, then runs <see cref="AfterEnteringState"/> concurrently with
/// protected regions. The machine ends when the scheme reaches <see cref="VersionSchemeState.Rest"/> at the
/// target version.
/// </summary>
/// <remarks>
/// An instance runs once: start a new instance for each transition. If a callback throws, the machine stops there
/// (see <see cref="EpochProtectedVersionScheme"/> for the state it leaves) and <see cref="Completion"/> faults.
/// </remarks>
public abstract class VersionSchemeStateMachine
{
    private TaskCompletionSource<bool>? completion; // created on first use of Completion
    private long actualToVersion = -1;
    private int started;
    private int completing;
    private int completed;
    private Exception? fault;

    /// <summary>Creates a machine that advances to <paramref name="toVersion"/>.</summary>
    /// <param name="toVersion">The version to reach, or -1 for "the version after the one current when the machine
    /// starts".</param>
    /// <exception cref="ArgumentOutOfRangeException"><paramref name="toVersion"/> is below -1 or above
    /// <see cref="VersionSchemeState.MaxVersion"/>.</exception>
    protected VersionSchemeStateMachine(long toVersion = -1)
    {
        ThrowIfInvalidTarget(toVersion, nameof(toVersion));
        ToVersion = toVersion;
    }

    /// <summary>Throws <see cref="ArgumentOutOfRangeException"/> unless <paramref name="toVersion"/> is -1 or between 0
    /// and <see cref="VersionSchemeState.MaxVersion"/> (the scheme's try form checks before its allocation-free answers).</summary>
    internal static void ThrowIfInvalidTarget(long toVersion, string parameterName)
    {
        if (toVersion < -1 || toVersion > VersionSchemeState.MaxVersion)
            ThrowHelper.ThrowArgumentOutOfRange(parameterName, $"The target version must be -1 (next) or between 0 and {VersionSchemeState.MaxVersion}.");
    }

    /// <summary>The requested target version, or -1 for "the next version".</summary>
    public long ToVersion { get; }

    /// <summary>The version this machine advances to, known once it has started (-1 before, and for good for a machine
    /// refused with <see cref="StateMachineExecutionStatus.Fail"/>).</summary>
    public long ActualToVersion => Volatile.Read(ref actualToVersion);

    /// <summary>Whether the machine has finished, successfully or not, or was refused (see <see cref="Completion"/>).</summary>
    public bool IsCompleted => Volatile.Read(ref completed) != 0; // acquire: pairs with Complete, publishes fault

    /// <summary>The exception a callback threw, if the machine stopped because of one; or the
    /// <see cref="InvalidOperationException"/> that refused it when the version was already at
    /// <see cref="VersionSchemeState.MaxVersion"/>.</summary>
    public Exception? Fault => IsCompleted ? fault : null;

    /// <summary>Completes when the machine ends; faults with <see cref="Fault"/> if it has one. Should giving the task that
    /// exception fail for lack of memory, the task is canceled instead (never left incomplete): <see cref="Fault"/> still
    /// holds the exception. A machine that a scheme refuses for good completes too, never having run: with
    /// <see cref="StateMachineExecutionStatus.Fail"/> (its target version already reached or claimed) successfully, with
    /// <see cref="ActualToVersion"/> still -1; at <see cref="VersionSchemeState.MaxVersion"/> with the refusal as its
    /// <see cref="Fault"/>. A machine not started because of <see cref="StateMachineExecutionStatus.Retry"/> (or an
    /// exception such as <see cref="ObjectDisposedException"/>) is not completed, and may be passed again.</summary>
    public Task Completion
    {
        get
        {
            TaskCompletionSource<bool>? tcs = Volatile.Read(ref completion);
            if (tcs is null)
            {
                var created = new TaskCompletionSource<bool>(TaskCreationOptions.RunContinuationsAsynchronously);
                // Full fence, then look at `completed`: either Complete (exchange, then read of `completion`)
                // sees our task, or we see it completed here. Both may; completing twice is harmless.
                tcs = Interlocked.CompareExchange(ref completion, created, null) ?? created;
                // A failure to give the task the fault here (out of memory) leaves it canceled, on the thread that asked
                // for it: it sees that, and Fault keeps the exception. Only the retiring scheme reports such a failure.
                if (Volatile.Read(ref completed) != 0)
                    _ = SetResult(tcs);
            }
            return tcs.Task;
        }
    }

    /// <summary>
    /// Given the current (stable) state, decides the next state to enter. Return false when the next step is not
    /// available yet (for example while waiting for I/O), and call
    /// <see cref="EpochProtectedVersionScheme.SignalStepAvailable"/> once it is.
    /// </summary>
    /// <remarks>It may be called several times for one step, from any thread (every thread that asks for the step while
    /// it is not available calls it again): make starting work from it idempotent (a once-guard).</remarks>
    /// <param name="currentState">The current state (never intermediate).</param>
    /// <param name="nextState">The state to enter: a phase below 128, and a version between the current one and
    /// <see cref="ActualToVersion"/>.</param>
    /// <returns>Whether a transition can be made now.</returns>
    public abstract bool GetNextStep(VersionSchemeState currentState, out VersionSchemeState nextState);

    /// <summary>
    /// Runs before <paramref name="toState"/> is published, while no thread is inside a protected region that
    /// observed <paramref name="fromState"/> and no thread can enter one: the critical section. It may run on any
    /// thread, including one that is itself between protected regions of this scheme.
    /// </summary>
    /// <remarks>
    /// Treat it like code holding a lock that every new region of this scheme waits for. In particular, entering another
    /// scheme here (a region of a scheme that shares this scheme's <see cref="LightEpoch"/>, or of any scheme) may wait
    /// for that scheme's own transition, which may wait for a thread inside one of its regions that is itself entering
    /// this scheme, and so waits for this critical section: a deadlock, as with two locks taken in opposite orders. Keep
    /// critical sections short and self-contained; if one must touch another scheme, let every thread take the two in
    /// one order.
    /// </remarks>
    /// <param name="fromState">The state being left.</param>
    /// <param name="toState">The state about to be entered.</param>
    public abstract void OnEnteringState(VersionSchemeState fromState, VersionSchemeState toState);

    /// <summary>
    /// Runs after <paramref name="state"/> is published; may interleave with protected regions. Use it for heavy
    /// work that needs no exclusion (copying, flushing), then return; the next step is requested afterwards.
    /// </summary>
    /// <remarks>
    /// As in FASTER, it runs on whichever thread takes the step, which may be a thread of this scheme's epoch that is
    /// itself protected: inside its <see cref="EpochProtectedVersionScheme.Refresh"/> (which announces the new epoch
    /// before it runs what became safe) or inside a nested region's leave. So do not wait here for the epoch to move on
    /// (a task of <see cref="LightEpoch.BumpCurrentEpochAsync(System.Action)"/>, a transition of a scheme on this epoch):
    /// the thread's own protection holds it back, and the wait never ends. Long work delays that thread's call too.
    /// For work that must wait, start it here (or in <see cref="GetNextStep"/>), return, let
    /// <see cref="GetNextStep"/> return false until it is done, and call
    /// <see cref="EpochProtectedVersionScheme.SignalStepAvailable"/> from the thread that completes it.
    /// </remarks>
    /// <param name="state">The state just entered.</param>
    public abstract void AfterEnteringState(VersionSchemeState state);

    /// <summary>Marks the machine as started exactly once.</summary>
    internal bool TryMarkStarted() => Interlocked.CompareExchange(ref started, 1, 0) == 0;

    /// <summary>Undoes <see cref="TryMarkStarted"/> when the machine could not be published (another one was active).</summary>
    internal void UnmarkStarted() => Volatile.Write(ref started, 0); // release: pairs with the CAS in TryMarkStarted

    /// <summary>Test-only: lets a second <see cref="Complete"/> overwrite the first (as before).</summary>
    internal static bool AllowSecondCompleteForTesting;

    internal void SetActualToVersion(long version) => Volatile.Write(ref actualToVersion, version);

    /// <summary>Completes the machine (the first call wins). Never throws.</summary>
    /// <returns>Null, unless the machine's task exists and could not be given <paramref name="exception"/> (out of
    /// memory): then the failure, for the caller to report (the task is canceled; <see cref="Fault"/> keeps the
    /// exception).</returns>
    internal Exception? Complete(Exception? exception)
    {
        // The first completion wins: a later one (e.g. a success after a fault) must not clear Fault. Full fence.
        if (Interlocked.Exchange(ref completing, 1) != 0 && !AllowSecondCompleteForTesting)
            return null;
        fault = exception;
        // Full fence: publishes fault, and orders the read of `completion` below after it (see Completion).
        Interlocked.Exchange(ref completed, 1);
        return Volatile.Read(ref completion) is { } tcs ? SetResult(tcs) : null;
    }

    /// <summary>Completes <paramref name="tcs"/> with the outcome; returns what kept it from faulting, if anything (see
    /// <see cref="TaskFaulting.Fault"/>: it is canceled then).</summary>
    private Exception? SetResult(TaskCompletionSource<bool> tcs)
    {
        if (fault is null)
        {
            tcs.TrySetResult(true); // allocates nothing
            return null;
        }
        return TaskFaulting.Fault(tcs, fault); // never throws; canceled if the fault cannot be given (Fault keeps it)
    }
}
