namespace Epvs;

public sealed partial class EpochProtectedVersionScheme
{
    /// <summary>
    /// Test-only: lets the scheme ask a machine that has reached its target for another step (in the window between
    /// publishing its final state and retiring it), so the regression test can show that it catches that. Read only
    /// on the cold stepping path.
    /// </summary>
    internal static bool DisableFinishedMachineGuardForTesting;

    /// <summary>
    /// Test-only: lets the next step be prepared while the current one is still in its AfterEnteringState (and before a
    /// machine whose callback threw is retired), as before, so the ownership tests can show that they catch that.
    /// Read only on the cold stepping path.
    /// </summary>
    internal static bool DisableStepOwnershipForTesting;

    /// <summary>
    /// Test-only: raises <see cref="StateMachineFaulted"/> while the faulted step is still owned (or the step lock held),
    /// as before, so the test of a handler that starts and waits for another transition can show that it catches that.
    /// </summary>
    internal bool RaiseFaultedInsideStepForTesting { get; set; }

    /// <summary>
    /// Test-only: every raise of <see cref="StateMachineFaulted"/> runs at once, however deep on the thread (as before), so
    /// the test of a handler that retries a failing machine can show that it catches the nesting. Read only on the fault path.
    /// </summary>
    internal static bool UnboundedFaultedNestingForTesting;

    /// <summary>
    /// Test-only: the callbacks a deep wait hands to another thread stay in force there after the wait has ended (as
    /// first written), so that thread refuses a blocking start on a scheme that no thread is inside any more, and an Enter
    /// that would only wait for the waiter.
    /// </summary>
    internal static bool HandedOffCallbacksNeverExpireForTesting;

    /// <summary>
    /// Test-only: a blocking start (<see cref="ExecuteStateMachine"/>) that gets Retry only spins, without stepping the
    /// active machine or draining (as before), so the test of a blocking start from inside a drain can show that it
    /// catches the wait that never ends. Read only on that retry path.
    /// </summary>
    internal bool RetryWithoutProgressForTesting { get; set; }

    /// <summary>
    /// Test hook: an Enter or Refresh waiting for a transition neither drains while stepped aside nor past the inline
    /// depth limit while nested (as before), so the test of Enters inside many queued actions can show it catches the
    /// spin that never ends. Read only on those wait paths.
    /// </summary>
    internal bool StepAsideWithoutDrainingForTesting { get; set; }

    /// <summary>
    /// Test-only: an Enter or Refresh whose wait for a transition throws (an interrupted wait) leaves protection as it
    /// was at the throw (as before): a nested Enter keeps the level it added, and a Refresh that stepped aside leaves
    /// its region, so the interrupted-wait tests can show that they catch that. Read only on those failure paths (a
    /// stepped-aside Refresh's wait is interrupted only with <see cref="InterruptibleStepAsideWaitForTesting"/>).
    /// </summary>
    internal static bool LegacyFailedWaitForTesting;

    /// <summary>
    /// Test-only: an outermost Refresh waits stepped aside with a plain <see cref="System.Threading.SpinWait"/>, whose
    /// sleeps <see cref="System.Threading.Thread.Interrupt"/> breaks (as before): the Refresh then comes back into its
    /// region while the transition is still pending and throws, so the interrupted-wait test can show that it catches the
    /// critical section running inside that region. Read only on that wait.
    /// </summary>
    internal bool InterruptibleStepAsideWaitForTesting { get; set; }

    /// <summary>Test hook: runs on a thread stepped aside inside Enter or Refresh on each turn of its wait, while the
    /// transition it waits for has not moved on.</summary>
    internal System.Action? SteppedAsideWaitHookForTesting { get; set; }

    /// <summary>Test hook: runs on the thread about to enter a callback of a running machine (GetNextStep,
    /// OnEnteringState, AfterEnteringState), where marking it may allocate; a hook that throws stands for an allocation
    /// failure there.</summary>
    internal static System.Action? EnterCallbackHookForTesting;

    /// <summary>Test hook: runs on the thread retiring a machine, before the fault's event data is allocated and the machine
    /// completed (completing the machine's task allocates too); a hook that throws stands for an allocation failure
    /// there.</summary>
    internal static System.Action? FinishMachineHookForTesting;

    /// <summary>Broken control for tests: a faulted machine's <see cref="VersionSchemeStateMachine.Completion"/> completes
    /// before its <see cref="StateMachineFaulted"/> handlers run (the old order: a caller that awaited it and then disposed
    /// the scheme could have a handler still running).</summary>
    internal bool CompleteBeforeFaultedForTesting { get; set; }

    /// <summary>Broken control for tests: a notice left to the thread's outermost raise (past the nesting bound) leaves its
    /// machine open until it is raised, so a waiter up the stack waits for ever.</summary>
    internal bool KeepQueuedMachinesOpenForTesting { get; set; }

    /// <summary>
    /// Test-only: the end of a step's ownership reads whether a machine is active before it clears the ownership (the
    /// order a release store allows the hardware), so the step-release test can show that it catches a machine started in
    /// between, which nobody steps. Read only on that path.
    /// </summary>
    internal bool LegacyReleaseStepForTesting { get; set; }

    /// <summary>
    /// Test-only: the end of a step's ownership clears it with a release store (<see cref="System.Threading.Volatile.Write(ref int, int)"/>)
    /// and then looks for the next step (as before the full fence): the hardware may let that look pass the store, so the
    /// step-release stress race can show that it catches a machine started meanwhile that nobody steps. Read only on that
    /// path.
    /// </summary>
    internal bool ReleaseStoreForTesting { get; set; }

    /// <summary>Test hook: runs on the thread ending a step's ownership (after a machine's callbacks, or its retirement),
    /// between clearing it and looking for the next step.</summary>
    internal System.Action? ReleaseStepHookForTesting { get; set; }

    /// <summary>
    /// Test-only: a Dispose that finds another one running returns at once (as before), before that one has disposed
    /// anything, so the concurrent-Dispose test can show that it catches a Dispose returning before the disposal is
    /// complete. Read only on that path.
    /// </summary>
    internal bool LegacyConcurrentDisposeForTesting { get; set; }

    /// <summary>
    /// Test-only: <see cref="AdvanceVersionAsync"/> that gets Retry while a Dispose holds the machine slot yields and tries
    /// again at once (as before), so the test of a start waiting for a Dispose can show that it catches the busy loop.
    /// Read only on that retry path.
    /// </summary>
    internal bool YieldWhileDisposingForTesting { get; set; }

    /// <summary>Test hook: runs in <see cref="AdvanceVersionAsync"/> each time a start attempt gets Retry.</summary>
    internal System.Action? AsyncRetryHookForTesting { get; set; }

    /// <summary>Test hook: runs in <see cref="AdvanceVersionAsync"/> before it awaits the end of a Dispose that holds the
    /// machine slot.</summary>
    internal System.Action? AsyncWaitsForDisposeHookForTesting { get; set; }

    /// <summary>Test hook: runs on a waiting thread that found the step in flight overdue, before it claims the step's
    /// stall report.</summary>
    internal System.Action? StallDueHookForTesting { get; set; }

    /// <summary>Test hook: runs on a thread whose Dispose waits for another thread's Dispose, on each turn.</summary>
    internal System.Action? DisposeWaitsHookForTesting { get; set; }

    /// <summary>Test hook: runs on the disposing thread after it marked the state, before the Dispose is complete.</summary>
    internal System.Action? DisposeMarkedHookForTesting { get; set; }

    /// <summary>Test hook: runs on a thread stepped aside inside Enter or Refresh, once the transition it waited for has
    /// moved on and before it takes its protection back.</summary>
    internal System.Action? BeforeComingBackHookForTesting { get; set; }

    /// <summary>Test hook: runs on a thread that has just stepped aside inside Enter or Refresh (its slot free), before
    /// it first looks whether the transition it waits for has moved on.</summary>
    internal System.Action? AfterStepAsideHookForTesting { get; set; }

    /// <summary>Test-only: <see cref="SignalStepAvailable"/> refuses on a closed epoch even with a machine in flight (as
    /// before), so a delayed step can never be taken once the epoch under the scheme is disposed.</summary>
    internal bool LegacySignalOnClosedEpochForTesting { get; set; }

    /// <summary>Test-only: an asynchronous start waiting for another machine does not wake when the epoch closes (as
    /// before): it waits for that machine's end, which may never come.</summary>
    internal bool LegacyAsyncWaitIgnoresEpochCloseForTesting { get; set; }

    /// <summary>Test-only: <see cref="Enter(System.Threading.CancellationToken)"/> waits as <see cref="Enter()"/> does,
    /// whatever its token (the broken control of the cancellable wait).</summary>
    internal static bool EnterIgnoresCancellationForTesting;

    /// <summary>Test-only: a nested <see cref="Enter(System.Threading.CancellationToken)"/> looks at its token before the
    /// pending step's epoch is published (the first version), so it may throw although the step waits for its outer
    /// region and it need not wait.</summary>
    internal static bool CancelledEnterThrowsBeforeThePriorIsKnownForTesting;
}
