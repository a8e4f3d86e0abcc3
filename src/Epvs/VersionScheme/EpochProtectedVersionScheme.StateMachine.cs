using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Runtime.ExceptionServices;
using System.Threading;
using System.Threading.Tasks;

namespace Epvs;

public sealed partial class EpochProtectedVersionScheme
{
    /// <summary>1 while a thread is deciding and publishing a step (short: <see cref="VersionSchemeStateMachine.GetNextStep"/>
    /// plus a CAS and an increment). Other threads never wait on it; they leave a request instead.</summary>
    private int stepLock;

    /// <summary>Set by a thread that wanted to step while <see cref="stepLock"/> was held; the holder looks again.</summary>
    private int stepRequested;

    /// <summary>The step in flight (one at a time: the state stays intermediate until it completes). Written under
    /// <see cref="stepLock"/> before the step is deferred; the epoch's publication of the deferred action (release)
    /// and its claim (CAS) order these writes before <see cref="CompleteStep"/> reads them.</summary>
    private VersionSchemeStateMachine? stepMachine;
    private VersionSchemeState stepFrom, stepTo;

    /// <summary>1 from the moment a step is published as intermediate until its <see cref="CompleteStep"/> has
    /// returned from <see cref="VersionSchemeStateMachine.AfterEnteringState"/> and, if the machine ended, retired it.
    /// Set under <see cref="stepLock"/>, read under it by <see cref="PrepareStep"/>: while it is set no next step is
    /// prepared, so AfterEnteringState never overlaps the next OnEnteringState, and a machine that faulted or finished
    /// is retired before anyone can ask it for another step. The owner asks for the next step after clearing it (with a
    /// full fence: see <see cref="ReleaseStep"/>). Read with acquire under the lock.</summary>
    private int stepOwned;

    /// <summary>Cached (created with the scheme), so a step allocates nothing and cannot fail to allocate it.</summary>
    private readonly Action completeStep;

    /// <summary>
    /// Raised when a state machine ends because one of its callbacks threw, once the faulted step is released (the
    /// scheme is usable again: a handler may start another machine). Runs on the thread that ran the callback, which
    /// may be inside a protected region (then a blocking start from the handler throws); exceptions from handlers are
    /// ignored. A handler that starts a machine which faults at once is raised again inside its own call; past 16 such
    /// raises on a thread, the event for a further fault is raised once the outermost handler has returned (so, from
    /// there on, not always in the order of the faults, and such a machine completes before its handlers run, so that a
    /// handler up the stack waiting for it returns). Otherwise the machine's
    /// <see cref="VersionSchemeStateMachine.Completion"/> completes once the handlers have returned: a caller that awaits
    /// it and then disposes the scheme never has a handler still running. A handler must not wait for that Completion,
    /// and should read the fault from the event data: the machine's <see cref="VersionSchemeStateMachine.IsCompleted"/>
    /// is still false there (so its <see cref="VersionSchemeStateMachine.Fault"/> is null). Should giving that task the exception fail (out of memory: the task is
    /// canceled instead, and <see cref="VersionSchemeStateMachine.Fault"/> keeps the exception), the event is raised again
    /// with that failure, after the task completed.
    /// </summary>
    public event EventHandler<StateMachineFaultedEventArgs>? StateMachineFaulted;

    /// <summary>
    /// Tries to start <paramref name="stateMachine"/>; never blocks. The machine then steps itself to completion.
    /// </summary>
    /// <param name="stateMachine">A machine that has not been started (or refused) before.</param>
    /// <returns><see cref="StateMachineExecutionStatus.Ok"/> if started; <see cref="StateMachineExecutionStatus.Retry"/>
    /// if another machine is active (try again after leaving or refreshing protection; the machine is not started and
    /// may be passed again); <see cref="StateMachineExecutionStatus.Fail"/> if its target version has been reached or is
    /// the target of the active machine: the machine is then completed without running (its
    /// <see cref="VersionSchemeStateMachine.Completion"/> completes successfully, its
    /// <see cref="VersionSchemeStateMachine.ActualToVersion"/> stays -1) and cannot be passed again.</returns>
    /// <exception cref="ArgumentNullException"><paramref name="stateMachine"/> is null.</exception>
    /// <exception cref="InvalidOperationException"><paramref name="stateMachine"/> has already been started, or refused
    /// with <see cref="StateMachineExecutionStatus.Fail"/>; or it
    /// targets the next version and the version is at <see cref="VersionSchemeState.MaxVersion"/> (the machine is then
    /// completed with this exception as its <see cref="VersionSchemeStateMachine.Fault"/>).</exception>
    /// <exception cref="ObjectDisposedException">The scheme has been disposed, or the <see cref="LightEpoch"/> under it (a
    /// shared one, or its own through <see cref="Epoch"/>), as <see cref="Enter()"/> reports it.</exception>
    public StateMachineExecutionStatus TryExecuteStateMachine(VersionSchemeStateMachine stateMachine)
    {
        if (stateMachine is null)
            ThrowHelper.ThrowArgumentNull(nameof(stateMachine));
        ThrowIfDisposedOrEpochClosed();

        // Mark before publishing: a machine that ran before (here or on another scheme) must never be visible as
        // currentMachine, where a concurrent stepper would ask it for steps towards its old target. Marked before the
        // first look at the target too, so that a refusal (Fail) is final for the instance on every path.
        if (!stateMachine.TryMarkStarted())
        {
            ThrowHelper.ThrowInvalidOperation(
                "This state machine has already been started, or refused with Fail (its target version reached or claimed); " +
                "create a new instance for each transition.");
        }
        long target = stateMachine.ToVersion;
        if (target != -1 && target <= CurrentState.Version)
            return Refuse(stateMachine);

        VersionSchemeStateMachine? active = Interlocked.CompareExchange(ref currentMachine, stateMachine, null);
        if (active is not null)
        {
            if (active != DisposedSentinel && StatusAgainst(active, target) == StateMachineExecutionStatus.Fail)
                return Refuse(stateMachine); // its target is claimed: final, as for a target reached
            stateMachine.UnmarkStarted(); // not started after all: the caller may retry with the same instance
            if (active == DisposedSentinel)
                return DisposingStatus();
            return StateMachineExecutionStatus.Retry;
        }

        // No machine was active, so no step is in flight and the state is settled.
        VersionSchemeState current = CurrentState;
        if (target != -1 && target <= current.Version)
        {
            Volatile.Write(ref currentMachine, null);
            return Refuse(stateMachine); // reached by the machine that ended since our first look
        }
        if (target == -1 && current.Version == VersionSchemeState.MaxVersion)
        {
            Volatile.Write(ref currentMachine, null);
            // Completed with the refusal, so that nobody awaiting its Completion waits for ever: it can never run.
            var atMaximum = new InvalidOperationException("The version is at its maximum and cannot advance.");
            // The caller gets the exception below; a task that could not be given it is canceled (Fault keeps it).
            _ = stateMachine.Complete(atMaximum);
            throw atMaximum;
        }

        stateMachine.SetActualToVersion(target == -1 ? current.Version + 1 : target);
        TryStepStateMachine(mustNotLose: true);
        return StateMachineExecutionStatus.Ok;
    }

    /// <summary>
    /// Ends a machine refused with <see cref="StateMachineExecutionStatus.Fail"/> (marked started, never published, or no
    /// longer): completed, successfully and without having run (<see cref="VersionSchemeStateMachine.ActualToVersion"/>
    /// stays -1), so that nobody awaiting its <see cref="VersionSchemeStateMachine.Completion"/> waits for ever, as for the
    /// refusal at <see cref="VersionSchemeState.MaxVersion"/>; it stays marked started, so passing it again throws.
    /// </summary>
    private static StateMachineExecutionStatus Refuse(VersionSchemeStateMachine stateMachine)
    {
        _ = stateMachine.Complete(null); // a success: completing a task with a result allocates nothing, cannot fail
        return StateMachineExecutionStatus.Fail;
    }

    /// <summary>The machine slot holds the sentinel: disposed (throws), or a Dispose is in progress that may still fail
    /// and give the slot back (<see cref="StateMachineExecutionStatus.Retry"/>, not a false ObjectDisposedException).</summary>
    private StateMachineExecutionStatus DisposingStatus()
    {
        ThrowIfDisposedOrEpochClosed();
        // On the disposing thread itself: a deferred action the epoch's Dispose runs once the epoch is closed, so that
        // Dispose can no longer fail, and nobody else can finish it while this thread waits.
        if (Volatile.Read(ref disposingThread) == Environment.CurrentManagedThreadId)
            ThrowHelper.ThrowObjectDisposed(nameof(EpochProtectedVersionScheme));
        return StateMachineExecutionStatus.Retry;
    }

    private static StateMachineExecutionStatus StatusAgainst(VersionSchemeStateMachine active, long target)
    {
        // The active machine claims its target; -1 means it is still being started (spurious Retry is allowed).
        long activeTarget = active.ActualToVersion;
        return target != -1 && activeTarget >= target ? StateMachineExecutionStatus.Fail : StateMachineExecutionStatus.Retry;
    }

    /// <summary>
    /// Starts <paramref name="stateMachine"/>, retrying while another machine is active, and with
    /// <paramref name="spin"/> waits until it has completed.
    /// </summary>
    /// <param name="stateMachine">A machine that has not been started (or refused) before.</param>
    /// <param name="spin">Whether to wait for the machine to complete (rethrowing its fault, if any).</param>
    /// <returns>False if the target version had already been reached or claimed (<see cref="StateMachineExecutionStatus.Fail"/>:
    /// the machine is then completed without running; see <see cref="TryExecuteStateMachine"/>).</returns>
    /// <remarks>
    /// While it waits (for another machine to end, or with <paramref name="spin"/> for this one), the calling thread
    /// takes the active machine's available steps and runs the epoch's deferred actions that have become safe, so the
    /// call also returns when made from a deferred action, a <see cref="LightEpoch.DeferredActionFailed"/> handler or a
    /// callback of another scheme on the same epoch, with the step it waits for queued behind it on its own thread.
    /// </remarks>
    /// <exception cref="InvalidOperationException">The calling thread is protected by the underlying epoch: waiting
    /// for a machine that waits for this thread would never end. Leave first, or use
    /// <see cref="TryExecuteStateMachine"/> and <see cref="Refresh"/> between attempts. Likewise from inside a callback
    /// of this scheme's running machine (OnEnteringState, AfterEnteringState, GetNextStep), which ends only after the
    /// callback returns. Also when the machine targets the next version and the version is at
    /// <see cref="VersionSchemeState.MaxVersion"/>. Also when called 512 or more drains deep on the calling thread
    /// (deferred actions inside deferred actions, each waiting): the wait would run pending actions deeper still, until
    /// the stack overflowed. Nothing has started then.</exception>
    /// <exception cref="ObjectDisposedException">The scheme has been disposed, or the <see cref="LightEpoch"/> under it (a
    /// shared one, or its own through <see cref="Epoch"/>), as <see cref="Enter()"/> reports it.</exception>
    /// <exception cref="ThreadInterruptedException">The calling thread was interrupted (<see cref="Thread.Interrupt"/>)
    /// while it waited. If it waited for another machine to end, <paramref name="stateMachine"/> has not started and
    /// may be passed again; if it waited with <paramref name="spin"/> for <paramref name="stateMachine"/> to complete,
    /// the machine has started and carries on without the caller (its <see cref="VersionSchemeStateMachine.ActualToVersion"/>
    /// is set): await its <see cref="VersionSchemeStateMachine.Completion"/> for the outcome.</exception>
    public bool ExecuteStateMachine(VersionSchemeStateMachine stateMachine, bool spin = false)
    {
        ThrowIfProtected();
        LightEpoch.ThrowIfTooDeepToBlock("ExecuteStateMachine (or AdvanceVersionWithCriticalSection)");
        if (InCallback())
        {
            ThrowHelper.ThrowInvalidOperation(
                "ExecuteStateMachine (or AdvanceVersionWithCriticalSection) was called from inside a callback of this scheme's running " +
                "state machine (OnEnteringState, AfterEnteringState or GetNextStep): the running machine ends only after the callback " +
                "returns, so waiting for it here would never end. Start the new machine with TryExecuteStateMachine instead.");
        }

        int handedOff = HandedOffMark;
        try
        {
            return ExecuteStateMachineWaiting(stateMachine, spin);
        }
        finally
        {
            EndWait(handedOff);
        }
    }

    /// <summary>The waits of <see cref="ExecuteStateMachine"/>, once its checks passed.</summary>
    private bool ExecuteStateMachineWaiting(VersionSchemeStateMachine stateMachine, bool spin)
    {
        var spinner = new SpinWait();
        StateMachineExecutionStatus status;
        while ((status = TryExecuteStateMachine(stateMachine)) == StateMachineExecutionStatus.Retry)
        {
            if (!RetryWithoutProgressForTesting)
            {
                // Make the active machine progress ourselves, as the wait for completion below does: the one thing it
                // waits for may be this thread. A deferred action (or a DeferredActionFailed handler, or a callback of
                // another scheme on this epoch) runs inside a drain, and the machine's next step may be queued in that
                // drain behind it, where no other thread need ever run it (G4). Safe inside a drain: the action we are in
                // was claimed before it ran, so no drain runs it again; drains nest (DrainWhileWaiting even past the
                // inline limit, whose outermost drain is stopped under us); and we are not protected (checked above), so
                // we only run what is safe for everyone, as any thread that leaves would.
                TryStepStateMachine(mustNotLose: false);
                epoch.DrainWhileWaiting(completeStep);
            }
            ReportStallIfDue();
            spinner.SpinOnce();
        }
        if (status == StateMachineExecutionStatus.Fail)
            return false;

        if (spin)
        {
            spinner.Reset();
            while (!stateMachine.IsCompleted)
            {
                // Polls GetNextStep, so a delayed step is taken as soon as it is available, and runs a critical
                // section that has become safe rather than leave it to others.
                TryStepStateMachine(mustNotLose: false);
                epoch.DrainWhileWaiting(completeStep);
                ReportStallIfDue();
                spinner.SpinOnce();
            }
            if (stateMachine.Fault is { } fault)
                ExceptionDispatchInfo.Capture(fault).Throw();
        }
        return true;
    }

    /// <summary>
    /// Tries to advance the version with one critical section, run in mutual exclusion with every protected region;
    /// never blocks. May be called inside a protected region: the critical section then waits until this thread
    /// leaves or refreshes.
    /// </summary>
    /// <param name="criticalSection">Called with the old and the new version.</param>
    /// <param name="targetVersion">The version to reach, or -1 for the next one.</param>
    /// <returns>See <see cref="TryExecuteStateMachine"/>. A fault of the critical section is reported through
    /// <see cref="StateMachineFaulted"/> and leaves the version unchanged.</returns>
    /// <exception cref="ArgumentNullException"><paramref name="criticalSection"/> is null.</exception>
    /// <exception cref="ArgumentOutOfRangeException"><paramref name="targetVersion"/> is below -1 or above
    /// <see cref="VersionSchemeState.MaxVersion"/>.</exception>
    /// <exception cref="InvalidOperationException"><paramref name="targetVersion"/> is -1 (next) and the version is at
    /// <see cref="VersionSchemeState.MaxVersion"/>.</exception>
    /// <exception cref="ObjectDisposedException">The scheme has been disposed, or the <see cref="LightEpoch"/> under it (a
    /// shared one, or its own through <see cref="Epoch"/>), as <see cref="Enter()"/> reports it.</exception>
    public StateMachineExecutionStatus TryAdvanceVersionWithCriticalSection(Action<long, long> criticalSection, long targetVersion = -1)
    {
        if (criticalSection is null)
            ThrowHelper.ThrowArgumentNull(nameof(criticalSection));
        // Checked first: the answers below would otherwise call a target that can never be reached "reached" or "retry".
        VersionSchemeStateMachine.ThrowIfInvalidTarget(targetVersion, nameof(targetVersion));
        ThrowIfDisposedOrEpochClosed();
        // Answer the common losing cases without allocating a machine (many threads asking for the same version).
        if (targetVersion != -1 && targetVersion <= CurrentState.Version)
            return StateMachineExecutionStatus.Fail;
        if (Volatile.Read(ref currentMachine) is { } active)
        {
            if (active == DisposedSentinel)
                return DisposingStatus();
            return StatusAgainst(active, targetVersion);
        }
        return TryExecuteStateMachine(new CriticalSectionStateMachine(criticalSection, targetVersion));
    }

    /// <summary>
    /// Advances the version with one critical section, retrying while another machine is active, and with
    /// <paramref name="spin"/> waits for it (rethrowing the critical section's exception, if any).
    /// </summary>
    /// <param name="criticalSection">Called with the old and the new version.</param>
    /// <param name="targetVersion">The version to reach, or -1 for the next one.</param>
    /// <param name="spin">Whether to wait until the transition has completed.</param>
    /// <returns>False if the target version had already been reached or claimed.</returns>
    /// <exception cref="ArgumentNullException"><paramref name="criticalSection"/> is null.</exception>
    /// <exception cref="ArgumentOutOfRangeException"><paramref name="targetVersion"/> is below -1 or above
    /// <see cref="VersionSchemeState.MaxVersion"/>.</exception>
    /// <exception cref="InvalidOperationException">The calling thread is protected, or the version is at
    /// <see cref="VersionSchemeState.MaxVersion"/> (see <see cref="ExecuteStateMachine"/>).</exception>
    /// <exception cref="ObjectDisposedException">The scheme has been disposed, or the <see cref="LightEpoch"/> under it (a
    /// shared one, or its own through <see cref="Epoch"/>), as <see cref="Enter()"/> reports it.</exception>
    /// <exception cref="ThreadInterruptedException">The calling thread was interrupted while it waited (see
    /// <see cref="ExecuteStateMachine"/>): either the transition has not started, or, with <paramref name="spin"/>, it
    /// has started and carries on without the caller (a fault of its critical section is then reported only through
    /// <see cref="StateMachineFaulted"/>). <see cref="CurrentState"/> and <see cref="ActiveStateMachine"/> tell which.</exception>
    public bool AdvanceVersionWithCriticalSection(Action<long, long> criticalSection, long targetVersion = -1, bool spin = false)
    {
        if (criticalSection is null)
            ThrowHelper.ThrowArgumentNull(nameof(criticalSection));
        return ExecuteStateMachine(new CriticalSectionStateMachine(criticalSection, targetVersion), spin);
    }

    /// <summary>
    /// Advances the version with one critical section and returns a task that completes when the transition has
    /// completed: the awaitable form of <see cref="AdvanceVersionWithCriticalSection"/> with <c>spin: true</c>.
    /// </summary>
    /// <remarks>
    /// While another machine is active, waits (asynchronously) for it to end and tries again; likewise while a
    /// <see cref="Dispose"/> of the scheme is in progress (it may be refused, and the transition then runs). The task's result is
    /// false if the target version had already been reached or claimed; it faults with the critical section's
    /// exception if that threw (the version is then unchanged), or is canceled if that exception could not be given to the
    /// machine's <see cref="VersionSchemeStateMachine.Completion"/> for lack of memory. <paramref name="cancellationToken"/> cancels only
    /// the waiting before the transition starts; once started, a transition runs to its end and the task reports it.
    /// Call it outside protected regions: the transition waits for every protected thread, the caller included, and
    /// protection must not be held across an <c>await</c>.
    /// </remarks>
    /// <param name="criticalSection">Called with the old and the new version.</param>
    /// <param name="targetVersion">The version to reach, or -1 for the next one.</param>
    /// <param name="cancellationToken">Cancels waiting for another machine before this transition starts.</param>
    /// <returns>True once the transition has completed; false if its target was already reached or claimed. The task
    /// faults with <see cref="InvalidOperationException"/> if <paramref name="targetVersion"/> is -1 and the version is at
    /// <see cref="VersionSchemeState.MaxVersion"/>, and with <see cref="ObjectDisposedException"/> if the scheme (or its
    /// epoch) is disposed while the call waits for another machine.</returns>
    /// <exception cref="ArgumentNullException"><paramref name="criticalSection"/> is null.</exception>
    /// <exception cref="ArgumentOutOfRangeException"><paramref name="targetVersion"/> is below -1 or above
    /// <see cref="VersionSchemeState.MaxVersion"/>.</exception>
    /// <exception cref="InvalidOperationException">The calling thread is protected.</exception>
    /// <exception cref="ObjectDisposedException">The scheme has been disposed, or the <see cref="LightEpoch"/> under it (a
    /// shared one, or its own through <see cref="Epoch"/>), as <see cref="Enter()"/> reports it.</exception>
    public Task<bool> AdvanceVersionAsync(Action<long, long> criticalSection, long targetVersion = -1, CancellationToken cancellationToken = default)
    {
        if (criticalSection is null)
            ThrowHelper.ThrowArgumentNull(nameof(criticalSection));
        ThrowIfProtected();
        ThrowIfDisposedOrEpochClosed(); // at the call, as documented (inside the async method it would only fault the task)
        return AdvanceVersionCoreAsync(new CriticalSectionStateMachine(criticalSection, targetVersion), cancellationToken);
    }

    /// <summary>
    /// Runs <paramref name="machine"/> as <see cref="AdvanceVersionAsync"/> documents it. The machine's outcome is copied
    /// into a task of our own rather than rethrown from an async method: an async method's task reports an
    /// <see cref="OperationCanceledException"/> that escapes it as a cancellation, so a critical section that threw one
    /// (honouring a token of its own, say) read as a transition that never started. What happens before the start (the
    /// caller's cancellation, with its own exception; a fault) is the async method's task itself, as it always was.
    /// </summary>
    private Task<bool> AdvanceVersionCoreAsync(VersionSchemeStateMachine machine, CancellationToken cancellationToken)
    {
        Task<bool> started = StartAndWaitAsync(machine, cancellationToken);
        return started.IsCompleted
            ? Outcome(started, machine)
            : started.ContinueWith(static (t, m) => Outcome(t, (VersionSchemeStateMachine)m!), machine, CancellationToken.None, TaskContinuationOptions.ExecuteSynchronously | TaskContinuationOptions.DenyChildAttach, TaskScheduler.Default).Unwrap();
    }

    /// <summary>The task <see cref="AdvanceVersionAsync"/> returns once <paramref name="started"/> has completed.</summary>
    private static Task<bool> Outcome(Task<bool> started, VersionSchemeStateMachine machine)
    {
        // Canceled by the caller's token, faulted before the start, or the target already reached or claimed.
        if (!started.IsCompletedSuccessfully || !started.Result)
            return started;
        Task done = machine.Completion;
        if (done.IsCompletedSuccessfully)
            return started; // true
        var result = new TaskCompletionSource<bool>();
        if (done.IsCanceled)
            result.TrySetCanceled(); // the critical section's fault could not be given for lack of memory
        else
            TaskFaulting.Fault(result, done.Exception!.InnerException ?? done.Exception); // whatever its type
        return result.Task;
    }

    /// <summary>Starts <paramref name="machine"/> (waiting for others to end) and waits for it to complete, without
    /// rethrowing its fault. False if its target was already reached or claimed.</summary>
    private async Task<bool> StartAndWaitAsync(VersionSchemeStateMachine machine, CancellationToken cancellationToken)
    {
        while (true)
        {
            cancellationToken.ThrowIfCancellationRequested();
            StateMachineExecutionStatus status = TryExecuteStateMachine(machine);
            if (status == StateMachineExecutionStatus.Fail)
                return false;
            if (status == StateMachineExecutionStatus.Ok)
                break;
            AsyncRetryHookForTesting?.Invoke();
            // Retry: wait for the active machine to end (its fault is its requester's, not ours), or for a Dispose that
            // holds the machine slot to end (it may be refused and give the slot back), then try again.
            VersionSchemeStateMachine? active = Volatile.Read(ref currentMachine);
            Task? ended = active is null ? null
                : active != DisposedSentinel ? active.Completion
                : YieldWhileDisposingForTesting ? null
                : DisposeEndedOrNull();
            if (ended is null)
            {
                await Task.Yield(); // the active machine (or the Dispose) ended between our try and the read: try again now
            }
            else if (!ended.IsCompleted)
            {
                if (active == DisposedSentinel)
                    AsyncWaitsForDisposeHookForTesting?.Invoke();
                var cancelled = new TaskCompletionSource<bool>(TaskCreationOptions.RunContinuationsAsynchronously);
                // Or for the epoch under the scheme to close (a shared one, or the owned one through Epoch): the next try
                // then faults the task with ObjectDisposedException, as documented, instead of waiting for a machine
                // that may never end (one whose delayed step nobody signals any more).
                Task closed = LegacyAsyncWaitIgnoresEpochCloseForTesting ? cancelled.Task : epoch.WhenClosed();
                using (cancellationToken.Register(static c => ((TaskCompletionSource<bool>)c!).TrySetResult(true), cancelled))
                    await Task.WhenAny(ended, cancelled.Task, closed).ConfigureAwait(false);
            }
        }
        Task done = machine.Completion;
        if (!done.IsCompleted)
            await WaitReportingStallsAsync(done).ConfigureAwait(false);
        return true;
    }

    /// <summary>
    /// Awaits <paramref name="done"/> (a started machine's completion), checking every <see cref="StallThreshold"/> whether
    /// its step in flight is overdue (<see cref="ReportStallIfDue"/>): with no thread blocked in a wait, nothing else
    /// would report a step held back by a parked reader. A report may come up to one threshold late.
    /// </summary>
    private async Task WaitReportingStallsAsync(Task done)
    {
        using var stopTimer = new CancellationTokenSource();
        while (true)
        {
            // Task.Delay takes at most int.MaxValue - 1 milliseconds (about 24 days); a threshold below 1 ms polls every 1 ms.
            double threshold = StallThreshold.TotalMilliseconds;
            int period = threshold >= int.MaxValue - 1 ? int.MaxValue - 1 : Math.Max(1, (int)Math.Ceiling(threshold));
            Task timer = Task.Delay(period, stopTimer.Token);
            if (await Task.WhenAny(done, timer).ConfigureAwait(false) == done)
            {
                stopTimer.Cancel(); // release the timer now rather than when it would have fired
                return;
            }
            ReportStallIfDue();
        }
    }

    /// <summary>
    /// For a start that got <see cref="StateMachineExecutionStatus.Retry"/> because a Dispose holds the machine slot: a task
    /// that completes when the Dispose running now ends (disposed or refused), or null if none is running any more. The
    /// Dispose may run the epoch's pending actions, and wait for another Dispose of the epoch: polling it kept a thread
    /// busy for all that time (it used to yield and try again at once).
    /// </summary>
    private Task? DisposeEndedOrNull()
    {
        TaskCompletionSource<bool>? ended = Volatile.Read(ref disposeEnded);
        if (ended is null)
        {
            var created = new TaskCompletionSource<bool>(TaskCreationOptions.RunContinuationsAsynchronously);
            // Full fence: published before the read of disposingThread below. Pairs with Dispose's release of
            // disposingThread and then exchange of this field (see Dispose): either it takes our task and completes it,
            // or we see it gone below.
            ended = Interlocked.CompareExchange(ref disposeEnded, created, null) ?? created;
        }
        return Volatile.Read(ref disposingThread) != 0 ? ended.Task : null;
    }

    private void ThrowIfProtected()
    {
        if (epoch.ProtectedOnlyByTheThreadRunningThisAction())
            ThrowHelper.ThrowInvalidOperation(
                "ExecuteStateMachine/AdvanceVersionWithCriticalSection/AdvanceVersionAsync was called from a deferred action that a " +
                "protected thread runs (its Refresh or Enter, or a BumpCurrentEpoch inside its region): that thread's region stays " +
                "open while the action runs, and the machine waits for it, so the call would never return. From a deferred " +
                "action, start machines with TryExecuteStateMachine or TryAdvanceVersionWithCriticalSection.");
        if (epoch.ThisInstanceProtected())
            ThrowHelper.ThrowInvalidOperation(
                "ExecuteStateMachine/AdvanceVersionWithCriticalSection/AdvanceVersionAsync was called by a protected thread: it " +
                "waits for state machines that wait for this thread to leave, so it would never return. Call Leave() first, " +
                "or use TryExecuteStateMachine/TryAdvanceVersionWithCriticalSection and Refresh() between attempts.");
    }

    /// <summary>
    /// Tells the scheme that the active machine's next step may have become available (after
    /// <see cref="VersionSchemeStateMachine.GetNextStep"/> returned false), so it can proceed without any thread
    /// entering or leaving. Unnecessary for machines whose steps are always available.
    /// </summary>
    /// <remarks>Called from inside <see cref="VersionSchemeStateMachine.GetNextStep"/> on the thread deciding the step (an
    /// inline continuation, say), it makes that thread ask again as soon as GetNextStep returns, so no signal is lost; a
    /// GetNextStep that signals every time it declines therefore keeps its thread asking. After the <see cref="LightEpoch"/> under the scheme was disposed (a shared one, or its own through
    /// <see cref="Epoch"/>), a machine already in flight still takes its steps here: nobody can be protected any more, so
    /// each is safe at once, and nothing else would take a delayed one (its <see cref="VersionSchemeStateMachine.Completion"/>
    /// would never come, and <see cref="Dispose"/> refuses while the machine runs). A signal from a thread of your own
    /// can race the end of the machine and a Dispose that awaited its <see cref="VersionSchemeStateMachine.Completion"/>
    /// (another thread may take the step before your signal): join that thread before disposing, or catch
    /// <see cref="ObjectDisposedException"/> there.</remarks>
    /// <exception cref="ObjectDisposedException">The scheme has been disposed; or the <see cref="LightEpoch"/> under it was,
    /// and no machine is in flight (as <see cref="Enter()"/> reports it).</exception>
    public void SignalStepAvailable()
    {
        if (LegacySignalOnClosedEpochForTesting)
            ThrowIfDisposedOrEpochClosed();
        ThrowIfDisposed();
        if (epoch.IsClosed)
        {
            VersionSchemeStateMachine? active = Volatile.Read(ref currentMachine);
            if (active is null || active == DisposedSentinel)
                ThrowHelper.ThrowEpochDisposed(epoch.DisposedObjectName);
        }
        TryStepStateMachine(mustNotLose: true);
    }

    /// <summary>
    /// Takes the active machine's next step if one is available and none is in flight. Never waits. If another
    /// thread is deciding a step: with <paramref name="mustNotLose"/> (a signal, a completed step, a start) leave a
    /// request that the holder honours before it lets go; without (an opportunistic try from Enter or a wait loop)
    /// just return, so a stream of entering threads cannot keep the holder looping.
    /// </summary>
    internal void TryStepStateMachine(bool mustNotLose)
    {
        while (Volatile.Read(ref currentMachine) is not null)
        {
            if (Interlocked.CompareExchange(ref stepLock, 1, 0) != 0)
            {
                if (!mustNotLose)
                    return;
                // Full fence, then look again: either the holder reads our request after it lets go (its release
                // is an exchange, ordered before its read of the request), or our second CAS sees the lock free.
                Interlocked.Exchange(ref stepRequested, 1);
                if (Interlocked.CompareExchange(ref stepLock, 1, 0) != 0)
                    return;
            }

            // Full fence: whatever GetNextStep reads is read after every request we are about to serve.
            Interlocked.Exchange(ref stepRequested, 0);
            Action? step;
            long prior;
            FaultNotice? faulted;
            try
            {
                step = PrepareStep(out prior, out faulted);
            }
            finally
            {
                // Full fence: pairs with a requester's exchange-then-CAS above.
                Interlocked.Exchange(ref stepLock, 0);
            }

            // Outside the lock: a handler may start and wait for another transition.
            RaiseFaulted(faulted);

            // Outside the lock: the action may run right here (nobody protected) and step again.
            if (step is not null)
            {
                bool registered = false;
                try
                {
                    epoch.Defer(prior, step, null, out registered);
                }
                catch (Exception) when (registered)
                {
                    // Registered, then something failed (a drain on this thread, an allocation in the wait for
                    // stragglers): the step runs, or ran, when eligible and completes itself. Not undone (that could move
                    // the version back, or let another step reuse its fields while it is still queued), and not passed
                    // to the starter, which would take the machine for not started and could advance twice. Defer's own
                    // drain may not have run: run what is eligible now, so the step does not wait for another thread's.
                    try
                    {
                        epoch.DrainWithoutRefresh();
                    }
                    catch (Exception)
                    {
                        // Still pending: the next drain on any thread runs it.
                    }
                }
                catch (Exception ex) when (!registered)
                {
                    // Registering failed (out of memory growing the list): the step never happened. Undo it so the
                    // scheme is not left intermediate, and end the machine with the fault.
                    VersionSchemeStateMachine machine = stepMachine!;
                    VersionSchemeState from = stepFrom;
                    stepMachine = null;
                    Volatile.Write(ref state, from.Word);
                    RetireThenReleaseStep(machine, ex);
                    return;
                }
            }

            if (Volatile.Read(ref stepRequested) == 0)
                return;
        }
    }

    /// <summary>Under <see cref="stepLock"/>: publishes the intermediate state of the next step and returns the
    /// critical section to defer, or null if no step can be taken now.</summary>
    private Action? PrepareStep(out long prior, out FaultNotice? faulted)
    {
        prior = 0;
        faulted = null;
        if (Volatile.Read(ref stepOwned) != 0 && !DisableStepOwnershipForTesting)
            return null; // the step in flight (or its AfterEnteringState) still runs; its owner asks again when done
        VersionSchemeStateMachine? machine = Volatile.Read(ref currentMachine);
        if (machine is null || machine.IsCompleted)
            return null;
        long target = machine.ActualToVersion;
        if (target < 0)
            return null; // still being started; its starter steps it
        VersionSchemeState from = CurrentState;
        if (from.IsIntermediate)
            return null; // a step is in flight; it asks for the next one when it ends
        if (from.Phase == VersionSchemeState.Rest && from.Version == target && !DisableFinishedMachineGuardForTesting)
            return null; // finished: its last step is running AfterEnteringState and will clear it (never ask again)

        VersionSchemeState to;
        int outerCallback = CallbackDepth;
        try
        {
            EnterCallback();
            if (!machine.GetNextStep(from, out to))
                return null;
        }
        catch (Exception ex)
        {
            LeaveCallbacks(outerCallback);
            faulted = FinishMachine(machine, ex);
            return null;
        }
        finally
        {
            LeaveCallbacks(outerCallback);
        }

        if (to.IsIntermediate || to == from || to.Version < from.Version || to.Version > target)
        {
            faulted = FinishMachine(machine, new InvalidOperationException(
                $"State machine {machine.GetType().Name} asked to move from {from} to {to}. A next state must differ from the " +
                $"current one, have a phase below 128, and a version between the current version and the target {target}."));
            return null;
        }

        // Re-check under the lock after the user's GetNextStep: the machine may have been retired meanwhile.
        if (Volatile.Read(ref currentMachine) != machine || machine.IsCompleted)
            return null;

        // Readers that see the intermediate state must not pair it with the previous step's epoch. Release, before the
        // step's start (a stall check that reads the previous step's epoch, then this start, then sees this reset).
        Volatile.Write(ref transitionPrior, UnknownPrior);
        // Before the state goes intermediate (the CAS below is a full fence): a waiter that sees the intermediate state
        // then reads this step's start, never the previous step's (a stall report timed from it).
        RecordStepStart();
        // Full fence. From here no thread can begin a region in `from` (Enter backs off on intermediate states).
        if (Interlocked.CompareExchange(ref state, VersionSchemeState.MakeIntermediate(from).Word, from.Word) != from.Word)
            return null;
        Volatile.Write(ref stepOwned, 1); // release; we hold stepLock, whose release publishes it too
        // Every region that may have observed `from` announced before reading it, so before our CAS, so at most the
        // epoch this increment leaves behind (the increment is a full fence after the CAS).
        prior = epoch.IncrementEpoch();
        Volatile.Write(ref transitionPrior, prior);
        stepMachine = machine;
        stepFrom = from;
        stepTo = to;
        return completeStep;
    }

    /// <summary>The deferred part of the step in flight: runs once every region that may have observed its starting
    /// state has left. Never throws.</summary>
    private void CompleteStep()
    {
        // Read before publishing anything: once the state leaves the intermediate form, the next step may be prepared.
        VersionSchemeStateMachine machine = stepMachine!;
        VersionSchemeState from = stepFrom, to = stepTo;
        stepMachine = null;

        int outerCallback = CallbackDepth;
        try
        {
            EnterCallback(criticalSection: true);
            machine.OnEnteringState(from, to);
        }
        catch (Exception ex)
        {
            // Out of the critical section first: what follows (retiring the machine, the next step, the handlers) is not in it.
            LeaveCallbacks(outerCallback);
            // The step did not happen: back to where it started (release, as below).
            Volatile.Write(ref state, from.Word);
            RetireThenReleaseStep(machine, ex); // retired while we still own the step: nobody can step it again
            return;
        }
        finally
        {
            LeaveCallbacks(outerCallback);
        }

        EpochDiagnostics.RecordTransition(Volatile.Read(ref stepStartTimestamp));
        // Release: the critical section's writes are visible to every region that observes `to` (pairs with the
        // acquire read in Enter/Refresh).
        Volatile.Write(ref state, to.Word);

        // Still owned: AfterEnteringState finishes before the next step is prepared (documented), and a fault is
        // retired before anyone else can ask the machine for another step.
        outerCallback = CallbackDepth;
        try
        {
            EnterCallback();
            machine.AfterEnteringState(to);
        }
        catch (Exception ex)
        {
            LeaveCallbacks(outerCallback);
            RetireThenReleaseStep(machine, ex);
            return;
        }
        finally
        {
            LeaveCallbacks(outerCallback);
        }

        if (to.Phase == VersionSchemeState.Rest && to.Version == machine.ActualToVersion)
            RetireThenReleaseStep(machine, null);
        else
            ReleaseStep();
    }

    /// <summary>Retires <paramref name="machine"/> while owning its step, then releases the step and raises
    /// <see cref="StateMachineFaulted"/> for a fault. The step is released even if retiring throws (it allocates: the
    /// machine's task, the event data), which then escapes to the caller: a step left owned would stop every later
    /// machine at its first step.</summary>
    private void RetireThenReleaseStep(VersionSchemeStateMachine machine, Exception? fault)
    {
        FaultNotice? notice = null;
        try
        {
            notice = FinishMachine(machine, fault);
        }
        finally
        {
            ReleaseStepThenRaise(notice);
        }
    }

    /// <summary>Ends ownership of the step (see <see cref="stepOwned"/>) and asks for the next one: of this machine,
    /// or of one started while we owned the step (its starter's request found the step owned and left it to us).</summary>
    private void ReleaseStep()
    {
        if (LegacyReleaseStepForTesting)
        {
            LegacyReleaseStep();
            return;
        }
        if (ReleaseStoreForTesting)
        {
            Volatile.Write(ref stepOwned, 0); // the control: a release store, which the read below may pass
            TryStepStateMachine(mustNotLose: true);
            return;
        }
        // Full fence, not a release store. With a starter this is a store-buffering pair: it publishes its machine (CAS, a
        // full fence) and then reads stepOwned (PrepareStep, under stepLock); we clear stepOwned and then read
        // currentMachine (TryStepStateMachine). A release store may still sit in the store buffer when that read runs (x64
        // lets a load pass an earlier store, Arm64 more so): we saw no machine and the starter saw the step owned, so
        // neither stepped, and the new machine never took a step (G4; found by a race of TryAdvance against
        // AdvanceVersionAsync). Fenced on both sides, at least one of us sees the other's write.
        Interlocked.Exchange(ref stepOwned, 0);
        ReleaseStepHookForTesting?.Invoke();
        TryStepStateMachine(mustNotLose: true);
    }

    /// <summary>The control behind <see cref="LegacyReleaseStepForTesting"/>: the release store as the hardware may order
    /// it, after the read of <see cref="currentMachine"/> that follows it in program order.</summary>
    private void LegacyReleaseStep()
    {
        bool machineSeen = Volatile.Read(ref currentMachine) is not null;
        ReleaseStepHookForTesting?.Invoke();
        Volatile.Write(ref stepOwned, 0);
        if (machineSeen)
            TryStepStateMachine(mustNotLose: true);
    }

    /// <summary>Retires <paramref name="machine"/>; for a fault with a <see cref="StateMachineFaulted"/> handler, returns
    /// what to raise it with once the step is released (<see cref="RaiseFaulted"/>), so that a handler may start and wait
    /// for another transition. Such a machine's <see cref="VersionSchemeStateMachine.Completion"/> completes only after the
    /// handlers have returned (<see cref="RaiseFaultedNow(FaultNotice)"/>): a caller that awaits it and then disposes the
    /// scheme never has a handler still running after Dispose returned.</summary>
    private FaultNotice? FinishMachine(VersionSchemeStateMachine machine, Exception? fault)
    {
        Interlocked.CompareExchange(ref currentMachine, null, machine);
        FaultNotice? notice = null;
        try
        {
            FinishMachineHookForTesting?.Invoke();
            if (fault is not null)
            {
                EpochDiagnostics.RecordTransitionFault();
                if (StateMachineFaulted is not null)
                    notice = new FaultNotice(new StateMachineFaultedEventArgs(machine, fault, CurrentState));
            }
        }
        catch
        {
            // Out of memory making the event data: completed without its event; the failure escapes (see
            // RetireThenReleaseStep), and is reported as a drain reports a faulted action's.
            _ = machine.Complete(fault);
            throw;
        }

        if (notice is null || CompleteBeforeFaultedForTesting)
        {
            // Not null only for a fault whose task could not be given it (out of memory): the task is canceled then, and
            // the failure is raised after the fault, as a drain reports a faulted action's (DrainList.RunEligible).
            Exception? notGiven = machine.Complete(fault);
            if (notGiven is not null && notice is not null)
                notice.TaskNotFaulted = notGiven;
        }
        if (notice is not null && RaiseFaultedInsideStepForTesting)
            RaiseFaultedNow(notice);
        return notice;
    }

    /// <summary>What to raise <see cref="StateMachineFaulted"/> with for a retired machine, which completes its machine
    /// once raised.</summary>
    private sealed class FaultNotice
    {
        public FaultNotice(StateMachineFaultedEventArgs fault) => Fault = fault;

        /// <summary>The machine's fault.</summary>
        public StateMachineFaultedEventArgs Fault { get; }

        /// <summary>The exception that kept the machine's <see cref="VersionSchemeStateMachine.Completion"/> from
        /// faulting (it is canceled instead), or null.</summary>
        public Exception? TaskNotFaulted { get; set; }
    }

    /// <summary>Retired a faulted machine while owning its step: releases the step, then raises the event (even if the
    /// release throws), so that a handler never runs while the step is owned.</summary>
    private void ReleaseStepThenRaise(FaultNotice? notice)
    {
        try
        {
            ReleaseStep();
        }
        finally
        {
            RaiseFaulted(notice);
        }
    }

    /// <summary>
    /// Raises <see cref="StateMachineFaulted"/>; called with no step owned and no lock held. A handler may start another
    /// machine, and a machine that faults at once (its first <see cref="VersionSchemeStateMachine.GetNextStep"/> throws)
    /// raises the event again inside that handler's call, with no drain in between for a drain bound to stop: a handler
    /// that retried such a machine nested one level per retry until the stack overflowed (about 1,800 levels on a 1 MB
    /// stack). Past <see cref="MaxFaultedNesting"/> raises on a thread, a notice waits for the thread's outermost raise,
    /// which raises it once the handlers above have returned.
    /// </summary>
    private void RaiseFaulted(FaultNotice? notice)
    {
        if (notice is null || RaiseFaultedInsideStepForTesting)
            return;
        if (t_faultedDepth >= MaxFaultedNesting && !UnboundedFaultedNestingForTesting && TryLeaveToOutermostRaise(notice))
            return;
        t_faultedDepth++;
        try
        {
            RaiseFaultedNow(notice);
            while (t_faultedDepth == 1 && t_faultedLeft is { Count: > 0 } left)
            {
                (EpochProtectedVersionScheme scheme, FaultNotice next) = left.Dequeue();
                scheme.RaiseFaultedNow(next);
            }
        }
        finally
        {
            t_faultedDepth--;
        }
    }

    /// <summary>Leaves <paramref name="notice"/> to this thread's outermost raise; false when that fails (out of memory:
    /// the caller raises it at once, one level deeper: never dropped).</summary>
    private bool TryLeaveToOutermostRaise(FaultNotice notice)
    {
        try
        {
            (t_faultedLeft ??= new Queue<(EpochProtectedVersionScheme, FaultNotice)>()).Enqueue((this, notice));
        }
        catch (OutOfMemoryException)
        {
            return false;
        }

        // Completed now, before its handlers run: a caller up this thread's stack (a handler that started the machine and
        // waits for it, spin: true) waits for it inside the outermost raise that is to raise it, and would wait for ever.
        // Raising it later completes nothing more (the first completion wins).
        if (!KeepQueuedMachinesOpenForTesting)
            notice.TaskNotFaulted ??= notice.Fault.StateMachine.Complete(notice.Fault.Exception);
        return true;
    }

    /// <summary>How many <see cref="StateMachineFaulted"/> raises may nest on a thread before a notice waits for the outermost one.</summary>
    private const int MaxFaultedNesting = 16;

    /// <summary>This thread's raises of <see cref="StateMachineFaulted"/> in progress (allocates nothing: raising never fails for want of memory).</summary>
    [ThreadStatic] private static int t_faultedDepth;

    /// <summary>The notices this thread's raises past <see cref="MaxFaultedNesting"/> left to its outermost raise, in the order they were left.</summary>
    [ThreadStatic] private static Queue<(EpochProtectedVersionScheme Scheme, FaultNotice Notice)>? t_faultedLeft;

    /// <summary>Raises the fault, then completes the machine (never throws past the raise: the machine is completed even
    /// if the raise fails), then raises the failure to give its task the fault, if any.</summary>
    private void RaiseFaultedNow(FaultNotice notice)
    {
        StateMachineFaultedEventArgs fault = notice.Fault;
        try
        {
            RaiseFaultedNow(fault);
        }
        finally
        {
            // A second Complete (the control's, which completed first) changes nothing and returns null.
            notice.TaskNotFaulted ??= fault.StateMachine.Complete(fault.Exception);
        }
        if (notice.TaskNotFaulted is { } notGiven)
        {
            StateMachineFaultedEventArgs? args = null;
            try
            {
                args = new StateMachineFaultedEventArgs(fault.StateMachine, notGiven, fault.State);
            }
            catch (OutOfMemoryException)
            {
                // Out of memory again: the task is canceled and Fault keeps the exception; only this report is lost.
            }
            if (args is not null)
                RaiseFaultedNow(args);
        }
    }

    private void RaiseFaultedNow(StateMachineFaultedEventArgs notice)
    {
        EventHandler<StateMachineFaultedEventArgs>? handler = StateMachineFaulted;
        if (handler is null)
            return;
        try
        {
            handler(this, notice);
        }
        catch
        {
            // Documented: a throwing handler must not break the thread that happened to run the step.
        }
    }
}
