using System.Threading;

namespace Epvs;

public sealed unsafe partial class LightEpoch
{
    /// <summary>Test-only: the list of deferred actions (its scan counter and flags).</summary>
    internal DrainList DrainListForTesting => drainList;

    /// <summary>
    /// Test-only: skips the second look (and its process-wide barrier) that a bumper takes when its action is left
    /// pending, which turns the lost-wakeup race it closes back on, so the self-stepping test can show that its
    /// checker catches it. Read only on that cold path.
    /// </summary>
    internal static bool DisableLeaveRaceGuardForTesting;

    /// <summary>
    /// Test-only: a registration whose drain is refused deep inside drains skips the second look and its barrier (as
    /// before), so the deep-drain test can show that it sees the look missing. Read only on that cold path.
    /// </summary>
    internal static bool DeepDeferSkipsLeaveRaceGuardForTesting;

    /// <summary>
    /// Test-only: skips the re-announcement after a bump slipped between reading the epoch and announcing it, which
    /// lets a nested Enter trust a stale announcement, so the randomized stress test can show that it catches that.
    /// Read only on that cold path.
    /// </summary>
    internal static bool DisableReannounceForTesting;

    /// <summary>
    /// Test-only: restores the old Dispose, which treated an epoch as disposed as soon as a Dispose began (so a
    /// registration ran every pending action, and Resume/Bump threw, while a Dispose that would fail was still
    /// checking), so the lifecycle test can show that it catches that. Read only on cold paths.
    /// </summary>
    internal static bool LegacyDisposeForTesting;

    /// <summary>
    /// Test-only: keeps drain nesting per thread across all instances (as before), so the nested-drain test can show
    /// that it catches an action stranded on another epoch. Read only on the drain path.
    /// </summary>
    internal static bool SharedDrainDepthForTesting;

    /// <summary>
    /// Test-only: drain nesting is keyed by the reusable instance id alone (as before), so a drain of an epoch created
    /// inside an action of a disposed epoch that had its id counts that action's drain depth as its own, and the id-reuse
    /// test can show that it catches the actions this strands. Read only on the drain path.
    /// </summary>
    internal static bool DrainNestingByIdForTesting;

    /// <summary>
    /// Test-only: a thread waiting in a loop for an action (<see cref="DrainWhileWaiting"/>) stops at the inline depth
    /// limit like any other drain (as before), so the deep-nesting test of a blocking start can show that it catches the
    /// wait that never ends. Read only on the drain path.
    /// </summary>
    internal static bool WaitingDrainHonoursDepthLimitForTesting;

    /// <summary>Test-only (the broken control): a deferred action may leave the level of the protected thread whose drain
    /// runs it, as before (its region ended silently under it).</summary>
    internal static bool LeaveBelowActionFloorForTesting;

    /// <summary>
    /// Test-only: a waiting drain past the inline depth limit runs every eligible action, not only the one its waiter
    /// waits for (the behaviour that let each pending blocking start nest one more drain: unbounded recursion).
    /// </summary>
    internal static bool WaitingDrainRunsEverythingForTesting;

    /// <summary>
    /// Test-only: a waiting drain runs only what its waiter waits for from the inline depth limit on (a first version of
    /// the bound), so the test of a wait that depends on another pending action can show that it catches the hang. Alone it
    /// hangs nothing any more: the wait also runs the drains left to the outermost one, so that control sets
    /// <see cref="WaitIgnoresDrainsLeftToTheOutermostForTesting"/> too.
    /// </summary>
    internal static bool WaitingDrainFiltersAtInlineLimitForTesting;

    /// <summary>
    /// Test-only: a registration that finds the epoch Closed runs the pending actions itself at any depth (as before), one
    /// stack level deeper per registration, so the test of a machine in flight when its epoch closes can show that it
    /// catches the stack growing with every step. Read only on that path.
    /// </summary>
    internal static bool UnboundedClosedRunForTesting;

    /// <summary>Test-only: record <see cref="t_maxDrainDepthForTesting"/> (read only on the drain path).</summary>
    internal static bool RecordDrainDepthForTesting;

    /// <summary>Test-only: the deepest drain nesting (of any epoch) seen on the calling thread while recording.</summary>
    [System.ThreadStatic] internal static int t_maxDrainDepthForTesting;

    /// <summary>Test-only: with <see cref="RecordDrainDepthForTesting"/>, the deepest nesting of drains of all instances together on this thread.</summary>
    [System.ThreadStatic] internal static int t_maxThreadDrainDepthForTesting;

    /// <summary>Test-only: drains are bounded per instance only (as before), so a chain of actions across many epochs
    /// nests 16 levels per epoch on one thread's stack.</summary>
    internal static bool PerInstanceDrainDepthOnlyForTesting;

    /// <summary>Test-only: a thread that waits in a loop inside drains does not run the drains it left to its outermost one
    /// (the first version of the per-thread bound), so a wait for another epoch's action left there never ends.</summary>
    internal static bool WaitIgnoresDrainsLeftToTheOutermostForTesting;

    /// <summary>Test-only: a drain refused by a depth bound while its instance has a drain further up the thread only asks
    /// that drain to look again (as before the fix), so a thread that then waits in a loop below it, for one of the
    /// actions it refused, spins until another thread drains the instance (for ever when nobody else does).</summary>
    internal static bool RefusedDrainOnlyAsksTheOuterOneForTesting;

    /// <summary>Test-only: a wait that runs the drains left to the outermost one drops an instance already
    /// MaxWaitingDrainDepth deep instead of keeping it on the list (the first version of the skip), so a shallower wait
    /// for one of its actions spins until another thread drains the instance.</summary>
    internal static bool SkippedLeftDrainDroppedForTesting;

    /// <summary>Test-only: waits nest inside drains without the per-thread bound (as before), so a chain of blocking
    /// starts across many schemes grows the stack until it overflows.</summary>
    internal static bool UnboundedWaitingNestingForTesting;

    /// <summary>Test-only: a wait past the per-thread bound throws from inside the wait (the first version of the bound),
    /// so an outermost Refresh stepped aside comes back into its region with the critical section free to run.</summary>
    internal static bool DeepWaitThrowsForTesting;

    /// <summary>Test-only: a wait past the per-thread bound runs the step it waits for on its own stack (as before), one
    /// level deeper for every link of a chain of critical sections that each Refresh inside the next scheme's region.</summary>
    internal static bool DeepWaitDrainsInlineForTesting;

    /// <summary>Test-only: the thread a deep wait hands its step to starts without the waiter's context (the version
    /// scheme callbacks it is inside), as first written, so a blocking start there that would be refused inline waits for
    /// the waiter, which waits for it.</summary>
    internal static bool HandOffWithoutWaiterContextForTesting;

    /// <summary>Test-only: the hand-off thread's stack size when not 0 (first written, it got the runtime's default, 1.5 to
    /// 8 MB, which held fewer than 512 levels of an action with a 16 KB frame).</summary>
    internal static int HandOffStackSizeForTesting;

    /// <summary>Test-only: a deep wait starts hand-off threads without the bound on those still draining, and they drain in
    /// list order (as first written): behind slow actions, a wait started another 64 MB-stack thread every 10 ms.</summary>
    internal static bool UnboundedHandOffsForTesting;

    /// <summary>Test-only: past the bound on hand-off threads the waiter runs its step itself, one level deeper (as first
    /// written), so a chain of such steps nests on its stack again.</summary>
    internal static bool HandOffCapRunsInlineForTesting;

    /// <summary>Test-only: Dispose reserves nothing for its final run (as before), so a drain that began before the close
    /// goes on claiming actions pending at the close, and Dispose may return while one of them still runs.</summary>
    internal static bool FinalRunReservesNothingForTesting;

    /// <summary>Test-only: runs on the disposing thread once the epoch is Closed, while every other claim waits at the gate
    /// and before the actions pending at the close are reserved for the final run.</summary>
    internal System.Action? ReservingHookForTesting { get; set; }

    /// <summary>Test-only: the claims waiting at the gate of Dispose's reservation (see <see cref="ClaimGate"/>).</summary>
    internal int ClaimsWaitingForTesting => claimGate.WaitingForTesting;


    /// <summary>Test-only: an Enter that must wait past the per-thread bound waits (the first version), running the step,
    /// whose callbacks may start another such wait, one level deeper each time.</summary>
    internal static bool EnterWaitsPastTheThreadBoundForTesting;

    /// <summary>Test-only: a filtered waiting drain that is its instance's outermost drain loops on the actions it filters
    /// out (the first version), which it never runs: a livelock.</summary>
    internal static bool FilteredOutermostDrainLoopsForTesting;

    /// <summary>Test-only: how many drains (of all instances) are on the calling thread's stack.</summary>
    internal static int ThreadDrainDepthForTesting => ThreadDrainDepth;

    /// <summary>
    /// Test-only: a Resume that claimed a slot and then found the epoch no longer Live keeps the slot as its record's
    /// hint (as before the fix), so the Dispose-versus-growth test can show that it catches a later fast-path Resume
    /// succeeding on a disposed epoch. Read only on that cold path.
    /// </summary>
    internal static bool KeepSlotAfterClosedClaimForTesting;

    /// <summary>
    /// Test-only: the same back-out forgets the slot through its record pointer only after draining, so the test can
    /// show that it catches a write through a record pointer that a drained action made stale (it reallocated this
    /// thread's records). Read only on that cold path.
    /// </summary>
    internal static bool ClearSlotAfterDrainForTesting;

    /// <summary>Test-only: runs on a thread in Resume's slow path, after its lifecycle check, before it claims a slot.</summary>
    internal System.Action? ResumeSlowBeforeClaimHookForTesting;

    /// <summary>Test-only: runs on a thread in Resume's slow path on each turn of its wait while a Dispose is Closing.</summary>
    internal System.Action? WaitWhileClosingHookForTesting;

    /// <summary>
    /// Test-only: a Resume waits for a Dispose that is Closing with a plain <see cref="SpinWait"/>, whose sleeps
    /// <see cref="Thread.Interrupt"/> breaks (as before), so the interrupted-Resume test can show that it catches a Resume
    /// failed on an epoch that stays live. Read only on that wait.
    /// </summary>
    internal static bool InterruptibleClosingWaitForTesting;

    /// <summary>
    /// Test-only: coming back from a step aside (<see cref="ComeBack"/>) ignores a level that an action run on the thread
    /// meanwhile left behind (misuse) and takes the parked slot over it, so the unwinding test can show that it catches the
    /// left-behind level's slot held for ever. Read only on that path.
    /// </summary>
    internal bool IgnoreLevelLeftBehindForTesting { get; set; }

    /// <summary>
    /// Test-only: a Resume whose drain after raising its announcement throws keeps the level it added and its slot
    /// announced (as before), so the Resume-fault test can show that it catches the slot held for ever. Read only on that
    /// failure path.
    /// </summary>
    internal static bool KeepLevelWhenResumeDrainFailsForTesting;

    /// <summary>
    /// Test-only: a region that steps aside (<see cref="StepAside"/>) frees its slot and claims one again to come back
    /// (as before; the broken control): coming back can then fail to allocate, and a Dispose meanwhile finds no slot
    /// taken and closes the epoch under the region. Read only on the step-aside path.
    /// </summary>
    internal bool LegacyStepAsideForTesting { get; set; }

    /// <summary>
    /// Test-only: a thread's drain-nesting array is not sized when its record is created, only by its first drain (as
    /// before), so the Suspend-fault test can show that it catches that drain's allocation failure, and the Resume-fault
    /// test can reach the back-out of a Resume whose drain fails. Read only on the record-creation path.
    /// </summary>
    internal static bool LazyDrainNestingForTesting;

    /// <summary>Test hook: runs on a thread whose drain is about to grow its per-thread drain-nesting array (which
    /// allocates); a hook that throws stands for an allocation failure there.</summary>
    internal static System.Action? DrainNestingGrowHookForTesting;

    /// <summary>Test-only: runs on a thread in Resume's slow path after it claimed a slot, before it checks lifecycle.</summary>
    internal System.Action? ResumeSlowAfterClaimHookForTesting;

    /// <summary>Test-only: the address of the calling thread's record array (changes when the array is reallocated).</summary>
    internal static nint RecordStorageForTesting => (nint)t_records;

    /// <summary>The control behind <see cref="ClearSlotAfterDrainForTesting"/>: drains, then writes through
    /// <paramref name="r"/>. Keeps the old record array alive so the stale write cannot corrupt the heap.</summary>
    private void BackOutUsingRecordAfterDrain(ThreadRecord* r)
    {
        PinnedRecords? keep = t_recordStorage;
        if (Volatile.Read(ref pendingActions.Value) != 0)
            FenceAndDrain();
        r->Slot = null;
        System.GC.KeepAlive(keep);
    }

    /// <summary>
    /// Test-only: a registration stores its epoch into the min-pending-epoch hint instead of lowering it with a CAS-min
    /// (so it can raise the hint above an older pending action), so the hint test can show that it catches an action
    /// stranded that way. Read only on the registration path.
    /// </summary>
    internal static bool OverwritePendingHintForTesting;

    /// <summary>
    /// Test-only: a registration lowers the hint without looking at a raise in progress (so a raise whose scan missed it
    /// can overwrite its lowering), so the hint test can show that it catches that. Read only on the registration path.
    /// </summary>
    internal static bool IgnoreRaisingHintForTesting;

    /// <summary>
    /// Test-only: a registration waits for a raise of the hint in progress with <see cref="SpinWait"/>, whose sleeps
    /// <see cref="System.Threading.Thread.Interrupt"/> breaks (as before), so the interrupted-registration test can show
    /// that it catches the action this strands. Read only on that wait.
    /// </summary>
    internal static bool InterruptibleRaiseWaitForTesting;

    /// <summary>Test-only: runs while the hint is being raised, after the scan, before the new value is written.</summary>
    internal System.Action? RaisePendingHintHookForTesting;

    /// <summary>Test-only: runs on a registrar that saw a raise in progress, before it waits for the raise to end.</summary>
    internal System.Action? LowerHintWaitsForRaiseHookForTesting;

    /// <summary>Test-only: runs on a registrar after it lowered the hint.</summary>
    internal System.Action? LoweredPendingHintHookForTesting;

    /// <summary>Test-only: the min-pending-epoch hint.</summary>
    internal long PendingHintForTesting => Volatile.Read(ref pendingHint.Value);

    /// <summary>Test-only: runs on the disposing thread while Dispose is Closing (free slots marked, not decided).</summary>
    internal System.Action? ClosingHookForTesting;

    /// <summary>Test-only: runs on the disposing thread once the epoch is Closed, before its final run of the pending
    /// actions (the Dispose is not complete yet).</summary>
    internal System.Action? ClosedHookForTesting;

    /// <summary>Test-only: runs on a thread whose Dispose (or TryDispose) waits for another thread's Dispose to decide or to
    /// complete, on each turn.</summary>
    internal System.Action? DisposeWaitsHookForTesting;

    /// <summary>
    /// Test-only: TryDispose waits for another Dispose interruptibly (as before), so the interrupt test can show that it
    /// catches a TryDispose that throws. Read only on those waits.
    /// </summary>
    internal bool InterruptibleTryDisposeForTesting { get; set; }

    /// <summary>
    /// Test-only: a Dispose that finds the epoch Closed returns at once (as before), also while the Dispose that closed it
    /// is still running the pending actions, so the concurrent-Dispose test can show that it catches a Dispose returning
    /// before the disposal is complete. Read only on that path.
    /// </summary>
    internal bool LegacyConcurrentDisposeForTesting { get; set; }

    /// <summary>Test-only: the lock that guards the pool of instance ids (a test holds it to contend a release).</summary>
    internal static object IdLockForTesting => s_idLock;

    /// <summary>Test-only: whether <paramref name="id"/> is back in the pool of free instance ids.</summary>
    internal static bool IsIdFreeForTesting(int id)
    {
        lock (s_idLock)
            return System.Array.IndexOf(s_freeIds, id, 0, s_freeCount) >= 0;
    }

    /// <summary>Test-only: the instance id used to index per-thread records.</summary>
    internal int DebugId => id;
}
