using System;
using System.Diagnostics.CodeAnalysis;
using System.Runtime.CompilerServices;
using System.Threading;
using System.Threading.Tasks;

namespace Epvs;

/// <summary>
/// Epoch protection with deferred actions, after Microsoft FASTER's <c>LightEpoch</c>: threads announce the
/// global epoch when they enter a protected region, and an action registered with
/// <see cref="BumpCurrentEpoch(Action)"/> runs only after every thread that was protected when it was
/// registered has left or refreshed.
/// </summary>
/// <remarks>
/// <para>Differences from FASTER, each a guarantee of this type:</para>
/// <list type="bullet">
/// <item><description>The outermost <see cref="Resume"/> announces with a full-fence compare-and-swap before the
/// caller can read shared state, so a protected region can never overlap an action that was registered after
/// it began (FASTER announces with a plain store, which x64 and Arm64 may reorder after later loads).</description></item>
/// <item><description>Re-entrant: protection nests per thread and per instance; only the outermost
/// <see cref="Resume"/> announces and only the outermost <see cref="Suspend"/> leaves. Several
/// <see cref="EpochProtectedVersionScheme"/> instances may share one epoch and nest.</description></item>
/// <item><description>Unbounded: the thread table and the list of pending actions grow instead of spinning when
/// full, so any number of threads may be protected and any number of actions may be pending.</description></item>
/// <item><description>A throwing deferred action never escapes into the unrelated thread that happened to run
/// it: the fault is reported through <see cref="DeferredActionFailed"/> and, for
/// <see cref="BumpCurrentEpochAsync(Action)"/>, through the returned task.</description></item>
/// </list>
/// <para>Protection belongs to a thread: do not <c>await</c> inside a protected region. Two regions that do can share a
/// thread's protection: if one flow's continuation lands on the thread where another flow's region is still open and leaves
/// (or refreshes) there, it ends (or moves on) that other region, and an action that region holds back can run while its
/// flow is still inside it; only that flow's own leave, later, on another thread, throws.</para>
/// <para>To find such misuse, set the <see cref="AppContext"/> switch <c>Epvs.LightEpoch.CheckAsyncFlow</c> (for example
/// <c>&lt;RuntimeHostConfigurationOption Include="Epvs.LightEpoch.CheckAsyncFlow" Value="true" /&gt;</c> in the project,
/// or <c>AppContext.SetSwitch</c> before the process's first epoch is created: it is read for the whole process then, and an
/// epoch created after it was turned on later throws <see cref="InvalidOperationException"/> saying so). An
/// <see cref="EpochProtectedVersionScheme"/> that creates its epoch inherits it; off, the check is compiled out of the
/// fast paths.
/// On, each outermost <see cref="Resume"/> tags the thread's protection and the calling async flow (an
/// <see cref="System.Threading.AsyncLocal{T}"/>, which allocates) with a fresh marker, and the outermost
/// <see cref="Suspend"/> and <see cref="ProtectAndDrain"/> throw <see cref="InvalidOperationException"/> when the calling
/// flow is not the one that entered the region open on the thread, before changing anything: that region stays open and
/// keeps protecting the flow that entered it. Deferred actions that enter and leave run on the draining thread's flow and
/// are never refused. Limits (it is a diagnostic, not a guard): a task or async call started inside a region carries the
/// region's marker (execution contexts flow to it), so its leave or refresh on the entering thread is not refused; two
/// correct patterns are refused — a region entered inside an <c>async</c> method and left by its caller (even with no
/// <c>await</c>, the method's return restores the caller's execution context, marker included), and a region held across
/// a <c>yield return</c> of an async iterator (each <c>MoveNextAsync</c> restores its caller's context); and a refused
/// region stays open until the flow that entered it leaves (never, if that flow already left a nested level for it).
/// Enter and leave in the same synchronous stretch of one method.</para>
/// </remarks>
public sealed unsafe partial class LightEpoch : IDisposable
{
    private const int DefaultInitialTableSize = 16;
    private const int DefaultInitialDrainListSize = 16;

    /// <summary>The global epoch. Starts at 1 so that a slot value of 0 can mean "free".</summary>
    private PaddedInt64 currentEpoch;

    /// <summary>The largest epoch known to be safe (monotonic); informational, every drain recomputes it.</summary>
    private PaddedInt64 safeToReclaimEpoch;

    /// <summary>Deferred actions published and not yet claimed: read on every leave and refresh, so it lives here, on
    /// a line of its own, rather than behind the drain list. May briefly run ahead of the list, never stays wrong.</summary>
    private PaddedInt64 pendingActions;

    /// <summary>
    /// Min-pending-epoch hint: never above the epoch of a published, unclaimed action (outside the windows argued in
    /// <see cref="RaisePendingHint"/> and <see cref="LowerPendingHint"/>), <see cref="long.MaxValue"/> when none is
    /// pending. A drain whose safe epoch is below it has nothing to run and does not scan the list, so that with a
    /// parked thread holding many actions back, every leave, refresh, bump and registration stays constant-time.
    /// Lowered by registrations (CAS-min), raised only by a drain that scanned the list, one raise at a time.
    /// </summary>
    private PaddedInt64 pendingHint;

    /// <summary>1 while a drain recomputes <see cref="pendingHint"/> (taken by CAS: one raise at a time).</summary>
    private int raisingHint;

    private readonly EpochSlotTable table;
    private readonly DrainList drainList;

    /// <summary>Closed by Dispose from just before the close until it has reserved what is pending for its final run (see
    /// <see cref="ClaimGate"/>), so none of the actions pending at the close runs on another thread after Dispose returns.</summary>
    private readonly ClaimGate claimGate = new();
    private readonly Action<Exception> reportFault; // cached: a method group would allocate on every drain
    private readonly int id;
    private readonly long token;

    /// <summary>Lifecycle: <see cref="Live"/> → <see cref="Closing"/> (a Dispose is checking for protected
    /// threads) → <see cref="Closed"/> (final), or back to <see cref="Live"/> when the Dispose cannot complete.
    /// Only <see cref="Closed"/> lets anything run every pending action; <see cref="Closing"/> is observable only
    /// as a short wait in the slow path of <see cref="Resume"/>.</summary>
    private int lifecycle;

    private const int Live = 0;
    private const int Closing = 1;
    private const int Closed = 2;

    /// <summary>The managed thread id of the Dispose that closed the epoch, written before <see cref="Closed"/> is
    /// published: a Dispose on that thread while the final run is in progress is re-entrant (an action it runs) and cannot
    /// wait for itself.</summary>
    private int closingThread;

    /// <summary>1 once the Dispose that closed the epoch has run every pending action and released the instance id: only
    /// then may another Dispose return (written with release, after both; read with acquire).</summary>
    private int closeCompleted;

    /// <summary>Creates an epoch with a thread table that starts at 16 slots and grows on demand.</summary>
    public LightEpoch()
        : this(DefaultInitialTableSize)
    {
    }

    /// <summary>Creates an epoch whose thread table starts with <paramref name="initialTableSize"/> slots.</summary>
    /// <param name="initialTableSize">Initial number of slots (at least 1). The table grows when more threads
    /// are protected at once; a smaller table makes each <see cref="BumpCurrentEpoch()"/> scan cheaper.</param>
    /// <exception cref="ArgumentOutOfRangeException"><paramref name="initialTableSize"/> is less than 1.</exception>
    public LightEpoch(int initialTableSize)
    {
        if (initialTableSize < 1)
            ThrowHelper.ThrowArgumentOutOfRange(nameof(initialTableSize), "The table needs at least one slot.");
        checkAsyncFlow = ReadCheckAsyncFlowSwitch(); // first: it may throw (the switch turned on too late)
        table = new EpochSlotTable(initialTableSize);
        drainList = new DrainList(DefaultInitialDrainListSize);
        reportFault = ReportFault;
        currentEpoch.Value = 1;
        pendingHint.Value = long.MaxValue;
        if (ChecksAsyncFlow)
            flow = new AsyncLocal<long>();
        id = AllocateId();
        token = Interlocked.Increment(ref s_nextToken);
    }

    /// <summary>Returns the instance id to the pool if the epoch was never disposed.</summary>
    ~LightEpoch()
    {
        // Unreachable, so no thread can be protected and nothing can race this. A constructor that threw (a bad
        // argument) never took an id: `id` is then the default 0, which may be a live epoch's, and `token` is still 0.
        if (token != 0 && Interlocked.Exchange(ref lifecycle, Closed) != Closed)
            ReleaseId(id);
    }

    /// <summary>The current global epoch.</summary>
    public long CurrentEpoch => Volatile.Read(ref currentEpoch.Value);

    /// <summary>The largest epoch that the most recent drain found no protected thread at or below.</summary>
    public long SafeToReclaimEpoch => Volatile.Read(ref safeToReclaimEpoch.Value);

    /// <summary>
    /// Raised when a deferred action throws. The action's slot is released and the epoch stays usable; the
    /// handler runs on the thread that ran the action and must not throw (exceptions from handlers are ignored). For an
    /// action of <see cref="BumpCurrentEpochAsync(Action)"/>, the task completes after the handlers have returned.
    /// </summary>
    public event EventHandler<DeferredActionFailedEventArgs>? DeferredActionFailed;

    /// <summary>
    /// Enters a protected region on the calling thread, or nests one level deeper if the thread is already
    /// protected by this instance.
    /// </summary>
    /// <remarks>
    /// The outermost call claims a slot and announces the current epoch with one full-fence compare-and-swap,
    /// so every later read of shared state by this thread is ordered after the announcement. Nested calls only
    /// count. Allocates nothing after the thread's first call on this instance, unless the table must grow. A Resume that
    /// throws (also <see cref="OutOfMemoryException"/> once it announced) has entered nothing: do not Suspend for it.
    /// </remarks>
    /// <exception cref="ObjectDisposedException">The epoch has been disposed.</exception>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    public void Resume()
    {
        ThreadRecord* r = FindRecord();
        if (r->Depth != 0)
        {
            r->Depth++;
            return;
        }

        EpochSlot* slot = r->Slot;
        if (slot != null)
        {
            // Before the announcement (a Resume that throws has entered nothing); never with the check off.
            if (ChecksAsyncFlow)
                r->Flow = NewFlowMarker();
            // Any epoch not newer than the current one is a valid announcement: an older one only holds back
            // more actions. Acquire pairs with the increment in BumpCurrentEpoch.
            long epoch = Volatile.Read(ref currentEpoch.Value);
            // Claim the slot used last time and announce in one full-fence CAS (DESIGN §2.2): the announcement
            // is globally visible before any later load of shared state. Pairs with the full fence between a
            // bumper's increment and its scan (EpochSlotTable.OldestAnnounced).
            if (Interlocked.CompareExchange(ref slot->Epoch, epoch, 0) == 0)
            {
                r->Depth = 1;
                slot->OwnerThreadId = r->ThreadId; // diagnostics only; another thread may have used the slot since
                // Keep "announced e" meaning "announced before the epoch moved past e": if a bump slipped in
                // between our read and our CAS, its scan may have missed us while our slot shows an epoch it
                // covers. Nested Enters rely on this (EpochProtectedVersionScheme.WaitForStableState).
                if (Volatile.Read(ref currentEpoch.Value) != epoch)
                    Reannounce(ref slot->Epoch, epoch, backOutOnFailure: true);
                return;
            }
        }
        ResumeSlow();
    }

    [MethodImpl(MethodImplOptions.NoInlining)]
    private void ResumeSlow()
    {
        while (!TryResumeSlow())
        {
            // A Dispose is checking for protected threads (it marked our free slot, or saw us claim one). It either
            // completes (we throw on the next try) or gives up and reverts to Live (we retry): wait for it, never fail
            // a Resume on an epoch that stays live. The window is one pass over the table. Not interruptible (an interrupt
            // stays pending for the thread's next wait): a wait this short is no place to fail a Resume that will succeed.
            if (InterruptibleClosingWaitForTesting)
            {
                WaitWhileClosingInterruptibly();
                continue;
            }
            var spinner = new UninterruptibleSpinWait();
            while (Volatile.Read(ref lifecycle) == Closing) // acquire: pairs with Dispose's final exchange
            {
                WaitWhileClosingHookForTesting?.Invoke();
                spinner.SpinOnce();
            }
            spinner.End();
        }
    }

    /// <summary>The control behind <see cref="InterruptibleClosingWaitForTesting"/>: the wait with a plain
    /// <see cref="SpinWait"/>, which an interrupt breaks.</summary>
    private void WaitWhileClosingInterruptibly()
    {
        var spinner = new SpinWait();
        while (Volatile.Read(ref lifecycle) == Closing)
        {
            WaitWhileClosingHookForTesting?.Invoke();
            spinner.SpinOnce();
        }
    }

    /// <summary>Returns false if a concurrent Dispose was closing (nothing was changed); throws if it closed.</summary>
    private bool TryResumeSlow()
    {
        ThrowIfDisposed();

        ThreadRecord* r = GetOrCreateRecord();
        if (r->Depth != 0)
        {
            r->Depth++;
            return true;
        }
        if (Volatile.Read(ref lifecycle) == Closing)
            return false; // every free slot is marked: do not grow the table for nothing

        if (ChecksAsyncFlow)
            r->Flow = NewFlowMarker(); // before the claim: a Resume that throws has entered nothing
        ResumeSlowBeforeClaimHookForTesting?.Invoke();
        // First use on this thread, or someone else took our last slot: probe for a free one (growing the
        // table if needed). The CAS inside Claim is the announcing full fence.
        long epoch = Volatile.Read(ref currentEpoch.Value);
        EpochSlot* slot = table.Claim(epoch, r->Slot == null ? r->ProbeStart : ++r->ProbeStart);
        slot->OwnerThreadId = r->ThreadId;
        r->Slot = slot;
        r->Depth = 1;
        ResumeSlowAfterClaimHookForTesting?.Invoke();

        // Dispose leaves Live with a full fence and then reads every slot of every segment, including one our Claim
        // may just have grown the table by. Our claim was a full fence too (a store-buffering pair): either Dispose
        // saw our slot taken (and reverts to Live), or we see here that it left Live. Checked before Reannounce,
        // which may drain and run actions that reallocate this thread's records: r is not used after a drain.
        if (Volatile.Read(ref lifecycle) != Live)
        {
            r->Depth = 0;
            // Forget the slot. Our Claim may have grown the table after Dispose's marking pass (Dispose's marks are what
            // made every older slot look taken), so nothing will ever mark this slot: kept as the record's hint, it
            // would let the next fast-path Resume claim it and succeed on a disposed epoch. Without a slot, the next
            // Resume takes this slow path, which checks lifecycle first. Written before the drain below, which may run
            // actions that reallocate this thread's records (r would then point into the discarded copy).
            if (!KeepSlotAfterClosedClaimForTesting && !ClearSlotAfterDrainForTesting)
                r->Slot = null;
            Volatile.Write(ref slot->Epoch, 0); // release: pairs with Dispose's scan
            if (ClearSlotAfterDrainForTesting)
            {
                BackOutUsingRecordAfterDrain(r);
                return false;
            }
            if (Volatile.Read(ref pendingActions.Value) != 0)
                FenceAndDrain();
            return false; // the caller waits while Closing, then retries (and throws if Closed)
        }
        if (Volatile.Read(ref currentEpoch.Value) != epoch)
            Reannounce(ref slot->Epoch, epoch, backOutOnFailure: true);
        return true;
    }

    /// <summary>
    /// Raises a fresh announcement to the current epoch until the epoch stays put across it, so that the slot's value
    /// e implies the announcement was globally visible before any increment past e; then drains.
    /// </summary>
    /// <param name="slot">The announcing slot of the calling thread, protected at its outermost level.</param>
    /// <param name="announced">The epoch announced in it.</param>
    /// <param name="backOutOnFailure">Whether a failure of the drain makes the caller's call fail having entered nothing (a
    /// Resume), so that the level is taken back here, or keeps the region (coming back from a step aside).</param>
    [MethodImpl(MethodImplOptions.NoInlining)]
    private void Reannounce(ref long slot, long announced, bool backOutOnFailure)
    {
        if (DisableReannounceForTesting)
            return;
        while (true)
        {
            long now = Volatile.Read(ref currentEpoch.Value);
            if (now == announced)
                break;
            // Full fence again: visible before the re-check above. Raising our own slot only releases epochs that
            // this thread has not read anything under yet (it is still inside Resume).
            Interlocked.Exchange(ref slot, now);
            announced = now;
        }
        // The bumper whose increment we raced may have seen our older value, given up on its action and left it
        // to us: we were the last to hold its epoch back. Our exchange was a full fence after our slot's first
        // value, which the bumper read, so this read of the count sees its registration.
        if (Volatile.Read(ref pendingActions.Value) == 0)
            return;
        if (!backOutOnFailure)
        {
            Drain();
            return;
        }
        try
        {
            Drain(); // allocates on a thread's first drain (its nesting entries): may throw OutOfMemoryException
        }
        catch when (!KeepLevelWhenResumeDrainFailsForTesting)
        {
            // The Resume throws, so it must have entered nothing: its caller will not Suspend, and a level kept here
            // would keep the slot announced for ever, holding back every later action (and every Dispose).
            BackOutOutermostLevel();
            throw;
        }
    }

    /// <summary>Takes back the outermost level a failing Resume had added (as a Suspend would, without throwing).</summary>
    [MethodImpl(MethodImplOptions.NoInlining)]
    private void BackOutOutermostLevel()
    {
        // A fresh lookup: the drain may have run actions that reallocated this thread's records. Those actions nested and
        // returned, so the depth is the Resume's 1 again (more only if one of them left a level behind: that one stays).
        ThreadRecord* r = FindRecord();
        if (r->Depth > 1)
        {
            r->Depth--;
            return;
        }
        r->Depth = 0;
        Volatile.Write(ref r->Slot->Epoch, 0); // release, as in Suspend
        try
        {
            // We held actions back for a moment: run what became safe, as any leave does.
            if (Volatile.Read(ref pendingActions.Value) != 0)
                FenceAndDrain();
        }
        catch (Exception)
        {
            // Out of memory again: what is pending runs at the next leave, refresh or bump on any thread. The Resume's own
            // failure is the one its caller sees.
        }
    }

    /// <summary>
    /// Leaves one level of protection; the outermost call withdraws the thread's announcement and, if actions
    /// are pending, runs those that have become safe (so the last thread to leave runs what is pending).
    /// </summary>
    /// <exception cref="InvalidOperationException">The calling thread is not protected by this instance.</exception>
    /// <exception cref="ObjectDisposedException">The calling thread is not protected, and the epoch has been disposed
    /// (for example while the thread stepped aside inside a refresh, whose <see cref="ObjectDisposedException"/> ended
    /// its protection).</exception>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    public void Suspend()
    {
        ThreadRecord* r = FindRecord();
        int depth = r->Depth;
        // One compare: the floor is 0 outside deferred actions, so this is the not-protected check.
        if (depth <= r->ActionFloor && (depth == 0 || !LeaveBelowActionFloorForTesting))
            ThrowBelowTheActionFloor(depth, nameof(Suspend));
        if (depth != 1)
        {
            r->Depth = depth - 1;
            return;
        }
        // Before anything changes: a region another async flow entered stays open (it still protects that flow).
        if (ChecksAsyncFlow)
            CheckFlow(r, nameof(Suspend));
        r->Depth = 0;

        // Release: every access the region made happens-before the slot reads 0 to a scanner.
        Volatile.Write(ref r->Slot->Epoch, 0);
        // This load may pass the store above (store buffering). That is fine: a bumper that registers an action we
        // do not see here takes a second look behind a process-wide barrier before giving up, or relies on an earlier
        // one that an action still pending followed (Defer).
        if (Volatile.Read(ref pendingActions.Value) != 0)
            FenceAndDrain();
    }

    /// <summary>
    /// A <see cref="Suspend"/> or <see cref="ProtectAndDrain"/> with no level of the caller's own: not protected, or
    /// inside a deferred action that a protected thread's drain runs (its Refresh, Resume or bump), at the level that
    /// thread was at. Leaving there would end the region of the thread that runs the action, and refreshing would move
    /// it on, while that thread still believes itself inside it (a critical section could then run under it: G1),
    /// silently; both are refused like any unbalanced call.
    /// </summary>
    [MethodImpl(MethodImplOptions.NoInlining)]
    [DoesNotReturn]
    private void ThrowBelowTheActionFloor(int depth, string operation)
    {
        // Named by both APIs that reach it: a scheme's Leave and Refresh call Suspend and ProtectAndDrain (its message
        // named only those, which the scheme's caller never called).
        string call = operation == nameof(Suspend) ? "Leave (Suspend)" : "Refresh (ProtectAndDrain)";
        if (depth == 0)
            ThrowNotProtectedOrDisposed(call);
        ThrowHelper.ThrowInvalidOperation(
            $"{call} was called inside a deferred action with no level of the action's own: the action runs in a drain of a " +
            "protected thread (its Refresh or Enter, or a BumpCurrentEpoch inside its region), whose region it would end or " +
            "move on under it. Enter within the action first, and leave only the levels it entered (a state machine's callback " +
            "run there, such as a critical section in OnEnteringState, may neither Enter nor Refresh at all).");
    }

    [MethodImpl(MethodImplOptions.NoInlining)]
    private void FenceAndDrain()
    {
        // Full fence: of two threads leaving or refreshing at once, at least one sees the other's slot change, so
        // the last one to let an epoch go always runs what became safe (FASTER's SuspendDrain has the same barrier).
        Interlocked.MemoryBarrier();
        Drain();
        // A fresh lookup: the drain may have run actions that reallocated this thread's records.
        ThreadRecord* r = FindRecord();
        long owed = r->OwedLook;
        if (owed != 0 && (r->Depth == 0 || Volatile.Read(ref r->Slot->Epoch) > owed))
        {
            r->OwedLook = 0;
            SecondLook(owed);
        }
    }

    /// <summary>
    /// Refreshes the calling thread's protection to the current epoch and runs pending actions that have
    /// become safe. Equivalent to <see cref="Suspend"/> then <see cref="Resume"/>, but cheaper.
    /// </summary>
    /// <remarks>
    /// Only the outermost level refreshes: when nested, the outer regions' guarantees must hold, so the
    /// announcement is kept and only the drain runs. The refresh is a release store, not a fence: the older
    /// announcement keeps protecting until the new one lands.
    /// </remarks>
    /// <exception cref="InvalidOperationException">The calling thread is not protected by this instance.</exception>
    /// <exception cref="ObjectDisposedException">The calling thread is not protected, and the epoch has been
    /// disposed.</exception>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    public void ProtectAndDrain()
    {
        ThreadRecord* r = FindRecord();
        int depth = r->Depth;
        // As in Suspend: not protected, or a deferred action's refresh of the running thread's own level (it re-announced
        // that thread's slot, so what waited for the thread's region could run while the thread believed itself inside).
        if (depth <= r->ActionFloor && (depth == 0 || !LeaveBelowActionFloorForTesting))
            ThrowBelowTheActionFloor(depth, nameof(ProtectAndDrain));
        if (depth == 1)
        {
            // As in Suspend: re-announcing a region another async flow entered would release what it holds back.
            if (ChecksAsyncFlow)
                CheckFlow(r, nameof(ProtectAndDrain));
            // Acquire: everything published before the epoch we read is visible to this thread's later loads.
            long epoch = Volatile.Read(ref currentEpoch.Value);
            // Release store, no fence needed: until it lands the older (smaller) announcement still protects.
            Volatile.Write(ref r->Slot->Epoch, epoch);
        }
        if (Volatile.Read(ref pendingActions.Value) != 0)
            FenceAndDrain();
    }

    /// <summary>Whether the calling thread is protected by this instance.</summary>
    public bool ThisInstanceProtected()
    {
        return FindRecord()->Depth != 0;
    }

    /// <summary>
    /// Whether the calling thread is running deferred actions of this instance: inside one of its drains (a
    /// <see cref="Suspend"/>, <see cref="ProtectAndDrain"/>, bump or wait that runs the actions made safe). Code that an
    /// action calls must not wait there for another pending action of this instance (a version transition's critical
    /// section, say), which may be queued behind the running one in the same drain.
    /// </summary>
    /// <returns><see langword="true"/> inside a drain of this instance on the calling thread.</returns>
    public bool ThisInstanceDraining()
    {
        DrainStack? stack = t_drains;
        return stack is not null && DrainDepthOn(stack) != 0;
    }

    /// <summary>Whether the calling thread runs a deferred action in a drain it made while protected by this instance, and
    /// the action has not entered itself: the protection it sees is the thread's only (see <see cref="ThreadRecord.ActionFloor"/>).</summary>
    internal bool ProtectedOnlyByTheThreadRunningThisAction()
    {
        ThreadRecord* r = FindRecord();
        return r->ActionFloor != 0 && r->Depth == r->ActionFloor;
    }

    /// <summary>
    /// Enters a protected region and returns a guard whose <see cref="Scope.Dispose"/> leaves it; allocates
    /// nothing. Use with <c>using</c>.
    /// </summary>
    /// <exception cref="ObjectDisposedException">The epoch has been disposed.</exception>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    public Scope EnterScope()
    {
        Resume();
        return new Scope(this);
    }

    /// <summary>Increments the global epoch and runs pending actions that have become safe.</summary>
    /// <returns>The new epoch.</returns>
    /// <exception cref="ObjectDisposedException">The epoch has been disposed.</exception>
    public long BumpCurrentEpoch()
    {
        ThrowIfDisposed();
        // Full fence (pairs with announcing CASes): see EpochSlotTable.Claim.
        long next = Interlocked.Increment(ref currentEpoch.Value);
        if (Volatile.Read(ref pendingActions.Value) != 0)
            Drain();
        return next;
    }

    /// <summary>
    /// Increments the global epoch and runs <paramref name="onDrain"/> once every thread that was protected at
    /// the old epoch has left or refreshed. May run it before returning (when no such thread exists) or later on
    /// any thread that leaves, refreshes or bumps.
    /// </summary>
    /// <remarks>
    /// Unlike FASTER, this never refreshes the caller's own protection: if the caller is protected, the action
    /// waits until the caller leaves or refreshes. Any number of actions may be pending. If the action throws,
    /// <see cref="DeferredActionFailed"/> is raised. If this method itself throws once the action is registered (the
    /// calling thread was interrupted while it waited, or ran out of memory), the action still runs when safe: do not
    /// register it again.
    /// </remarks>
    /// <param name="onDrain">The action to run once the old epoch is safe.</param>
    /// <returns>The epoch after which <paramref name="onDrain"/> may run (the epoch before the increment).</returns>
    /// <exception cref="ArgumentNullException"><paramref name="onDrain"/> is null.</exception>
    /// <exception cref="ObjectDisposedException">The epoch has been disposed.</exception>
    public long BumpCurrentEpoch(Action onDrain)
    {
        if (onDrain is null)
            ThrowHelper.ThrowArgumentNull(nameof(onDrain));
        ThrowIfDisposed();
        long prior = IncrementEpoch();
        Defer(prior, onDrain, null);
        return prior;
    }

    /// <summary>
    /// Like <see cref="BumpCurrentEpoch(Action)"/>, returning a task that completes when the action has run,
    /// or faults with the action's exception.
    /// </summary>
    /// <remarks>A faulted action's task completes after the <see cref="DeferredActionFailed"/> handlers for its exception have
    /// returned, so a caller that awaits the task and then disposes the epoch never has such a handler still running (a
    /// handler must therefore not wait for that task). Giving the task the action's exception allocates. Should that fail
    /// for lack of memory, the task is canceled instead, never left incomplete, and the failure is reported through
    /// <see cref="DeferredActionFailed"/> after the action's exception, once the task completed.</remarks>
    /// <param name="onDrain">The action to run once the old epoch is safe.</param>
    /// <exception cref="ArgumentNullException"><paramref name="onDrain"/> is null.</exception>
    /// <exception cref="ObjectDisposedException">The epoch has been disposed.</exception>
    public Task BumpCurrentEpochAsync(Action onDrain)
    {
        if (onDrain is null)
            ThrowHelper.ThrowArgumentNull(nameof(onDrain));
        ThrowIfDisposed();
        var completion = new TaskCompletionSource<bool>(TaskCreationOptions.RunContinuationsAsynchronously);
        long prior = IncrementEpoch();
        Defer(prior, onDrain, completion);
        return completion.Task;
    }

    /// <summary>Increments the global epoch; returns the epoch before the increment. Full fence.</summary>
    internal long IncrementEpoch() => Interlocked.Increment(ref currentEpoch.Value) - 1;

    /// <summary>
    /// Registers <paramref name="action"/> to run once <paramref name="prior"/> is safe, then tries to run it.
    /// Never refreshes the caller's own announcement.
    /// </summary>
    internal void Defer(long prior, Action action, TaskCompletionSource<bool>? completion) => Defer(prior, action, completion, out _);

    /// <summary>
    /// <see cref="Defer(long, Action, TaskCompletionSource{bool})"/>, telling a caller that catches an exception from it
    /// whether the action was registered before the exception (then it runs, or ran, once eligible: do not undo what it
    /// stands for) or not (it never runs).
    /// </summary>
    internal void Defer(long prior, Action action, TaskCompletionSource<bool>? completion, out bool registered)
    {
        registered = false;
        // Ends with a full fence, so the registration is visible before the scans below. `mine` stays pending until a
        // drainer claims the action.
        DrainList.Registration mine = drainList.Add(prior, action, completion, ref pendingActions.Value);
        registered = true;
        // After publishing, before this registrar's own scan of the table (inside Drain): see LowerPendingHint.
        LowerPendingHint(prior);
        // Only Closed is final: while a Dispose is Closing it may still find a protected thread and revert, so the
        // ordinary rules apply. Add ended with a full fence and Dispose writes Closed with a full fence before it runs
        // the list: either it sees our registration, or we see Closed here (then nobody is protected, ever again).
        int now = Volatile.Read(ref lifecycle);
        if (now == Closed || (LegacyDisposeForTesting && now != Live))
        {
            RunClosed(final: false);
            return;
        }
        // Read before our scan of the table, after our count was published (Add): see below.
        bool covered = drainList.CoveredStillPending();
        // Refused deep inside drains on this thread: a drain further up (this instance's outermost, or the thread's)
        // scans again before it returns, after everything below, the barrier included.
        bool drained = Drain();
        if (!drained && DeepDeferSkipsLeaveRaceGuardForTesting)
            return;
        if (!mine.IsPending || DisableLeaveRaceGuardForTesting)
            return; // claimed: run, or running

        // Still pending. A thread may have left just before we registered, with its cleared slot still in its
        // store buffer and its check of the pending count made before our registration (Suspend does not
        // fence), so that neither of us runs the action.
        //
        // No barrier is needed while an earlier registration X0 that was followed by a process-wide barrier B0 is still
        // unclaimed when we looked (`covered`, read after our count was published and before our scan). Such a leaver
        // either checked the count before B0 reached it - then its cleared slot was visible after B0, and so to our
        // scan, which follows our acquire read of the mark written after B0 - or after B0 - then it saw X0 counted, or,
        // if X0 was claimed since, our count (we saw X0 unclaimed after our increment, so X0's decrement comes after
        // our increment): it saw a nonzero count, fenced and drained, and of its drain and our scan one sees the
        // other's write. Only actions left pending need this, so with a thread parked inside protection one barrier
        // serves every registration behind it.
        if (covered)
            return;

        // Otherwise, if anyone but the caller still seems to hold the epoch back, force every core's buffered stores
        // out; then look again, whatever the answer: after the barrier either we see that slot cleared, or its owner's
        // later check of the count sees our registration. (When only the caller holds it back, the caller drains when
        // it leaves or refreshes.)
        ThreadRecord* r = FindRecord();
        EpochSlot* own = r->Depth != 0 ? r->Slot : null;
        if (own != null && Volatile.Read(ref own->Epoch) <= prior)
        {
            // The caller holds the action back itself: it cannot run before the caller leaves or refreshes, so the
            // second look is owed then (FenceAndDrain), when a thread that left just before us has long published its
            // cleared slot and the look rarely needs the barrier. Written before any drain (r stays valid).
            if (prior > r->OwedLook)
                r->OwedLook = prior;
            // Remembered so that the look can mark it covered if it still needs the barrier (see SecondLook).
            t_owedRegistration = new OwedRegistration(drainList, mine);
            return;
        }
        if (table.AnyOtherAtOrBelow(prior, own))
        {
            // Threads that are still active refresh or leave within moments and run the action themselves; give
            // them that moment before paying for the barrier, which is only needed for one that already left. (Deep
            // inside drains this thread's own drains are refused: it only watches.)
            for (int i = 0; i < HelpSpins; i++)
            {
                Thread.SpinWait(16);
                if (drained)
                    Drain();
                if (!mine.IsPending)
                    return;
            }
            // Deep inside drains the second look is the drain further up, after the barrier: it used to be skipped there,
            // so an action registered just as the last thread holding it back left could stay pending until someone
            // else drained this epoch.
            Interlocked.MemoryBarrierProcessWide();
            Drain();
            // Still pending after a barrier that followed it: later registrations can rely on it (see above).
            if (mine.IsPending)
                drainList.MarkCovered(mine);
            return;
        }
        Drain();
    }

    /// <summary>
    /// The second look that <see cref="Defer(long, Action, TaskCompletionSource{bool}, out bool)"/> owes for actions up to <paramref name="prior"/> registered while the
    /// caller held them back, taken once the caller no longer does (after its fence and drain in FenceAndDrain): the
    /// same reasoning as in Defer, with our registrations' counts published long before.
    /// </summary>
    [MethodImpl(MethodImplOptions.NoInlining)]
    private void SecondLook(long prior)
    {
        if (Volatile.Read(ref pendingActions.Value) == 0)
            return; // acquire: nothing pending, nothing to strand
        // Read before the scans below, after our counts were published: see Defer.
        if (drainList.CoveredStillPending())
        {
            Drain();
            return;
        }
        // As in Defer: give active holders a moment, and pay for the barrier only if someone still seems to hold.
        bool held = table.AnyOtherAtOrBelow(prior, null);
        for (int i = 0; i < HelpSpins && held; i++)
        {
            Thread.SpinWait(16);
            Drain();
            held = table.AnyOtherAtOrBelow(prior, null);
        }
        if (!held)
        {
            t_owedRegistration = default; // do not keep the list alive
            Drain();
            return;
        }
        Interlocked.MemoryBarrierProcessWide();
        Drain();
        // Our latest owed registration was counted before the barrier: if it is still pending, later registrations can
        // rely on this barrier (see Defer). Only if it belongs to this epoch (the thread may use several).
        OwedRegistration owedRegistration = t_owedRegistration;
        t_owedRegistration = default;
        if (owedRegistration.List == drainList && owedRegistration.Registration.IsPending)
            drainList.MarkCovered(owedRegistration.Registration);
    }

    /// <summary>The latest registration this thread left pending behind its own protection (any epoch): lets the second
    /// look it owes mark that registration covered after a barrier.</summary>
    [ThreadStatic] private static OwedRegistration t_owedRegistration;

    private readonly struct OwedRegistration
    {
        public OwedRegistration(DrainList list, DrainList.Registration registration)
        {
            List = list;
            Registration = registration;
        }

        public DrainList? List { get; }

        public DrainList.Registration Registration { get; }
    }

    /// <summary>
    /// Makes <see cref="pendingHint"/> at most <paramref name="epoch"/>, the epoch of an action this thread has just
    /// published with a full fence.
    /// </summary>
    /// <remarks>
    /// A raise (<see cref="RaisePendingHint"/>) sets <see cref="raisingHint"/> with a full fence and then reads the count
    /// and the list; we counted and published with full fences and then read the flag (a store-buffering pair): either
    /// the raise sees our action (so what it writes is not above our epoch), or we see the flag and lower only after
    /// the raise has written. Our lowering is always a CAS, a full fence before our own scan of the table (in Drain): a
    /// thread that read a raised hint, with its slot cleared before that read, is then seen cleared by our scan, so we
    /// run the action ourselves.
    /// </remarks>
    private void LowerPendingHint(long epoch)
    {
        if (OverwritePendingHintForTesting)
        {
            Volatile.Write(ref pendingHint.Value, epoch);
            return;
        }
        // Acquire; after Add's full fence (see above). A raise is a scan with no user code in it: wait it out (a raise
        // that starts after this read sees our action).
        if (Volatile.Read(ref raisingHint) != 0 && !IgnoreRaisingHintForTesting)
            WaitForRaise();
        LowerPendingHintCore(epoch);
        LoweredPendingHintHookForTesting?.Invoke();
    }

    /// <remarks>
    /// Runs after our action was published, so it must not throw: returning early would leave the hint above the action,
    /// and no drain would look at it until a later registration lowered the hint (an interrupted registration must still
    /// run its action, as <see cref="BumpCurrentEpoch(Action)"/> documents). <see cref="SpinWait.SpinOnce()"/> sleeps,
    /// and <see cref="Thread.Interrupt"/> breaks a sleep, so this absorbs the interrupt and keeps it pending for the
    /// thread's next wait. It still sleeps: a loop of spins and yields alone lets a raiser of lower priority, preempted
    /// and queued on another core, wait behind the spinning registrars (a yield only offers this core).
    /// </remarks>
    [MethodImpl(MethodImplOptions.NoInlining)]
    private void WaitForRaise()
    {
        LowerHintWaitsForRaiseHookForTesting?.Invoke();
        if (InterruptibleRaiseWaitForTesting)
        {
            var spinner = new SpinWait();
            while (Volatile.Read(ref raisingHint) != 0)
                spinner.SpinOnce();
            return;
        }
        var patient = new UninterruptibleSpinWait();
        while (Volatile.Read(ref raisingHint) != 0) // acquire: pairs with the raise's release of the flag
            patient.SpinOnce();
        patient.End();
    }

    private void LowerPendingHintCore(long epoch)
    {
        long seen = Volatile.Read(ref pendingHint.Value);
        while (true)
        {
            // Full fence, even when the hint is already low enough (then it writes the same value): see above.
            long witnessed = Interlocked.CompareExchange(ref pendingHint.Value, Math.Min(seen, epoch), seen);
            if (witnessed == seen)
                return;
            seen = witnessed;
        }
    }

    /// <summary>
    /// Recomputes <see cref="pendingHint"/> as the smallest epoch still pending, after a drain scanned the list (so the
    /// hint may be below every remaining action, which only costs scans). One raise at a time: a drain that finds another
    /// raise in progress leaves it to that one (which may write a lower value than needed: only more scans).
    /// </summary>
    [MethodImpl(MethodImplOptions.NoInlining)]
    private void RaisePendingHint()
    {
        // Full fence: the flag is visible before the count and the list are read below. Pairs with a registrar's
        // full-fence count and publication before its read of the flag (LowerPendingHint): either we see its action,
        // or it sees the flag and lowers after our write.
        if (Interlocked.CompareExchange(ref raisingHint, 1, 0) != 0)
            return;
        // No action counted: none can be published unseen either (the registrar counts before publishing, and one that
        // counts after this read sees the flag), so the list need not be scanned. Acquire.
        long min = Volatile.Read(ref pendingActions.Value) == 0 ? long.MaxValue : drainList.MinPendingEpoch();
        RaisePendingHintHookForTesting?.Invoke();
        // Release. A registrar lowering at the same time read the flag clear before we set it, so we saw its action and
        // min is not above its epoch: overwriting its value loses nothing.
        Volatile.Write(ref pendingHint.Value, min);
        Volatile.Write(ref raisingHint, 0); // release: a registrar that reads 0 here reads min or later
    }

    /// <summary>How many short spins a bumper waits for active holders before issuing a process-wide barrier.</summary>
    private const int HelpSpins = 8;

    /// <summary>
    /// How deep a waiting drain (<see cref="DrainWhileWaiting"/>) still runs every eligible action; past it, only what its
    /// waiter waits for. Each level takes well under 1 KB of stack (about 3,000 levels overflowed a 1.5 MB thread stack),
    /// so this bounds the recursion far below that, while a wait that depends on another eligible action (a step a user's
    /// action signals, another scheme's step) still makes progress at any realistic nesting.
    /// </summary>
    private const int MaxWaitingDrainDepth = 256;

    /// <summary>
    /// How many drains (of all instances together) may be on a thread's stack when it starts a blocking wait of its own
    /// making (a blocking state-machine start: <see cref="ThrowIfTooDeepToBlock"/>) or disposes an epoch, whose final run
    /// runs the pending actions one level deeper; past it, a wait already in progress hands what became safe to a drain on a
    /// new thread (<see cref="HandOffDeepDrain"/>), or, when it cannot, runs only what it waits for. A chain
    /// of deferred actions that each make a blocking start on another scheme, whose wait ran the next action, nested one
    /// waiting drain per scheme (<see cref="MaxWaitingDrainDepth"/> bounds each instance only), and about 2,000 levels
    /// overflowed a 1.5 MB thread stack: the process died; so did a chain of actions that each dispose the next epoch.
    /// Such a call this deep throws <see cref="InvalidOperationException"/> before it starts anything (an action's drain
    /// reports it through <see cref="DeferredActionFailed"/>). Above <see cref="MaxWaitingDrainDepth"/> plus
    /// <see cref="MaxThreadDrainDepth"/>, so that the per-instance bound acts first.
    /// </summary>
    private const int MaxThreadWaitingDepth = 512;

    /// <summary>
    /// For a call about to start a blocking wait of its own (a scheme's blocking machine start): throws if this thread is
    /// <see cref="MaxThreadWaitingDepth"/> drains deep (see there). Nothing has started when it throws.
    /// </summary>
    internal static void ThrowIfTooDeepToBlock(string what)
    {
        if (TooDeepToWait)
            ThrowTooDeep(what, t_drains!.Depth);
    }

    /// <summary>Whether this thread is <see cref="MaxThreadWaitingDepth"/> drains deep: a blocking start, a Dispose, or an
    /// Enter that would wait refuses there.</summary>
    internal static bool TooDeepToWait => t_drains is { } stack && stack.Depth >= MaxThreadWaitingDepth && !UnboundedWaitingNestingForTesting;

    /// <summary>How many drains (of all instances) are on the calling thread's stack.</summary>
    internal static int ThreadDrainDepth => t_drains?.Depth ?? 0;

    [MethodImpl(MethodImplOptions.NoInlining)]
    [DoesNotReturn]
    internal static void ThrowTooDeep(string what, int depth) =>
        throw new InvalidOperationException(
            $"{what} was called {depth} drains deep on this thread (deferred actions inside deferred actions): it would run pending " +
            $"actions one level deeper still (a blocking wait runs them while it waits, a Dispose runs its epoch's), and past " +
            $"{MaxThreadWaitingDepth} levels the thread's stack could overflow. Nothing was started or disposed. From an action, " +
            "start machines with TryExecuteStateMachine or AdvanceVersionAsync, and dispose epochs outside deferred actions.");

    /// <summary>
    /// Computes the safe epoch from a scan of the table and runs the actions it allows. Returns false if it was too
    /// deep inside other drains on this thread to run now (the outermost drain will).
    /// </summary>
    private bool Drain() => Drain(waiting: false);

    /// <summary>
    /// Runs what is eligible with the thread's own levels of protection as the actions' floor (see
    /// <see cref="ThreadRecord.ActionFloor"/>): an action may enter and leave, never leave the region of the thread that
    /// runs it. The thread's record is written only when it is protected (an unprotected thread may have none but the
    /// shared empty one), and looked up afresh afterwards (the actions may have reallocated the records, or disposed
    /// this epoch: then there is nothing to restore).
    /// </summary>
    private void RunEligibleAboveTheThreadsLevels(long safe, Action? only)
    {
        ThreadRecord* r = FindRecord();
        int floor = r->Depth;
        int saved = r->ActionFloor;
        if (floor != 0)
            r->ActionFloor = floor;
        try
        {
            drainList.RunEligible(safe, ref pendingActions.Value, reportFault, only, claimGate);
        }
        finally
        {
            if (floor != 0)
            {
                ThreadRecord* after = FindRecord();
                if (after != s_noRecord)
                    after->ActionFloor = saved;
            }
        }
    }

    /// <summary>
    /// <see cref="Drain()"/>; with <paramref name="waiting"/>, also past the inline depth limit, for a thread that waits
    /// in a loop for an action to run: the outermost drain it would leave the action to is further up its own stack,
    /// stopped until the wait ends. Past <see cref="MaxWaitingDrainDepth"/> such a drain runs only
    /// <paramref name="awaited"/>'s registrations (the action the waiter waits for): running any action there could start
    /// another wait, which would drain again, one level deeper for every pending action (thousands of waiting actions
    /// overflowed the stack). Everything else is then left to the drains within that depth.
    /// </summary>
    private bool Drain(bool waiting, Action? awaited = null, bool onlyAwaited = false)
    {
        // The entry at our index may still count drains of a disposed instance that had our id: we may be running inside
        // one of its actions (an action may dispose its epoch and create another, which takes the id back). Its depth is
        // not ours: counted as ours, our first drain would not be outermost, would never look again, and would strand our
        // actions past the depth limit until another thread drained (G4). Drains nest as calls on one thread, so a
        // foreign entry that is in use is set aside here and put back when this outermost frame of ours returns; one
        // that is not in use (depth 0) is simply taken over. Touched only on the drain path, never by Resume/Suspend.
        DrainStack stack = Drains;
        ref DrainNesting entry = ref ClaimNesting(stack, out DrainNesting displaced, out bool restore);
        int depth = entry.Depth;
        if (depth >= MaxInlineDrainDepth && (!waiting || WaitingDrainHonoursDepthLimitForTesting))
        {
            LeaveToOuterDrains(stack, ref entry);
            return false;
        }
        if (!waiting && LeftPastThreadDepth(stack, ref entry, depth, displaced, restore))
            return false;
        Action? only = (onlyAwaited || depth >= (WaitingDrainFiltersAtInlineLimitForTesting ? MaxInlineDrainDepth : MaxWaitingDrainDepth)) && !WaitingDrainRunsEverythingForTesting ? awaited : null;
        entry.Depth = ++depth;
        if (RecordDrainDepthForTesting && depth > t_maxDrainDepthForTesting)
            t_maxDrainDepthForTesting = depth;
        EnterThreadDrain(stack);
        try
        {
            do
            {
                if (depth == 1)
                    NestingIn(stack).Again = false;
                // Acquire: pairs with the increment; the scan below reads slots after it.
                long current = Volatile.Read(ref currentEpoch.Value);
                long safe = table.OldestAnnounced(current) - 1;
                PublishSafeEpoch(safe);
                // Acquire, after the caller's full fence (FenceAndDrain, a bump's increment, Reannounce's exchange, a
                // registrar's lowering CAS): pairs with the lowering CAS of a registration (see LowerPendingHint). Below
                // the hint nothing is eligible, so the list is not scanned: constant time however many actions wait.
                if (Volatile.Read(ref pendingActions.Value) != 0 && safe >= Volatile.Read(ref pendingHint.Value))
                {
                    RunEligibleAboveTheThreadsLevels(safe, only);
                    // A filtered pass leaves the other eligible actions to the outermost drain: make it look again. If this
                    // is that drain (a waiting drain past the per-thread bound can be its instance's first), it must not
                    // loop on them (it would never run them: a livelock); the thread's outermost drain runs them instead.
                    if (only is not null)
                    {
                        if (depth > 1 || FilteredOutermostDrainLoopsForTesting)
                            NestingIn(stack).Again = true;
                        else
                            LeaveToOutermostDrain(stack, this);
                    }
                    // Whether we ran something or found the hint stale (another drain ran it, or a raise that lost to
                    // ours computed its value before our claims): recompute it, so later drains skip again.
                    RaisePendingHint();
                }
            }
            while (depth == 1 && NestingIn(stack).Again);
        }
        finally
        {
            // Indexed afresh (an action may have grown the array). Every frame that nested inside ours has put back what
            // it set aside, so this is our entry again.
            ref DrainNesting mine = ref NestingIn(stack);
            mine.Depth--;
            if (restore)
                mine = displaced;
            LeaveThreadDrain(stack);
        }
        return true;
    }

    /// <summary>Every epoch is safe once the epoch is Closed (nobody can be protected any more): runs every published action.</summary>
    private const long AllPublished = DrainList.AllPublished;

    /// <summary>
    /// Runs every pending action of a Closed epoch, inside the same per-thread nesting as <see cref="Drain(bool, Action?, bool)"/>:
    /// past the inline depth limit a registration made by an action of this run (a scheme's next step, registered by
    /// the step before it) only asks the outermost level to look again, and returns. Each such registration used to run
    /// the list itself, one stack level deeper than the last: a state machine in flight when its epoch closed ran every
    /// step nested inside the one before, and a long one overflowed the stack. Never throws.
    /// </summary>
    /// <param name="final">Dispose's final run: runs whatever the depth (Dispose returns only once every pending action
    /// has run; its thread may be deep inside drains of this epoch), and loops until no registration nested in it asked
    /// for another look. Otherwise (a registration that found the epoch Closed) it runs only within the inline limit.</param>
    private void RunClosed(bool final)
    {
        // The nesting entry may have to be allocated (this thread's first drain of an epoch with this id): should that fail,
        // run the list here, unbounded, as before, rather than leave actions pending on an epoch nobody drains any more.
        int index = NestingIndex;
        if ((t_drains is not { } stack || stack.Entries.Length <= index) && !TryGrowDrainNesting(index, out stack))
        {
            drainList.RunEligible(AllPublished, ref pendingActions.Value, reportFault, only: null, final ? null : claimGate, includeReserved: final);
            return;
        }

        // As in Drain: an entry of a disposed instance that had our id is set aside, and put back when we return.
        ref DrainNesting entry = ref ClaimNesting(stack, out DrainNesting displaced, out bool restore);
        int depth = entry.Depth;
        if (!final && depth >= MaxInlineDrainDepth && !UnboundedClosedRunForTesting)
        {
            // An outer level on this thread (a Drain, or a RunClosed) loops while Again. A Drain's safe epoch on a Closed
            // epoch covers every registration: every slot is marked, or was grown after the marking pass and holds at most a
            // Resume's claim until it backs out (ResumeSlow), which drains after clearing it. A Closed epoch has no other
            // thread to drain it: a wait below that level must find it on the thread's list (LeaveToOuterDrains).
            LeaveToOuterDrains(stack, ref entry);
            return;
        }
        if (!final && !UnboundedClosedRunForTesting && LeftPastThreadDepth(stack, ref entry, depth, displaced, restore))
            return;
        bool outerAgain = entry.Again;
        bool loops = final || depth == 1;
        entry.Depth = ++depth;
        if (RecordDrainDepthForTesting && depth > t_maxDrainDepthForTesting)
            t_maxDrainDepthForTesting = depth;
        EnterThreadDrain(stack);
        try
        {
            do
            {
                if (loops)
                    NestingIn(stack).Again = false;
                // Only the final run claims what was reserved for it (and needs no gate: the reservation is over).
                drainList.RunEligible(AllPublished, ref pendingActions.Value, reportFault, only: null, final ? null : claimGate, includeReserved: final); // never throws
            }
            while (loops && NestingIn(stack).Again);
        }
        finally
        {
            // Indexed afresh, as in Drain. A request of an outer level that our loop cleared is put back (a final run nested
            // in drains of this epoch); it costs that level one more look.
            ref DrainNesting mine = ref NestingIn(stack);
            mine.Depth--;
            if (outerAgain)
                mine.Again = true;
            if (restore)
                mine = displaced;
            LeaveThreadDrain(stack);
        }
    }

    /// <summary><see cref="GrowDrainNesting"/>, reporting a failure (out of memory) instead of throwing.</summary>
    private static bool TryGrowDrainNesting(int index, out DrainStack stack)
    {
        try
        {
            stack = GrowDrainNesting(index);
            return true;
        }
        catch (Exception)
        {
            stack = null!;
            return false;
        }
    }

    private void PublishSafeEpoch(long safe)
    {
        long seen = Volatile.Read(ref safeToReclaimEpoch.Value);
        while (safe > seen)
        {
            long witnessed = Interlocked.CompareExchange(ref safeToReclaimEpoch.Value, safe, seen);
            if (witnessed == seen)
                break;
            seen = witnessed;
        }
    }

    private void ReportFault(Exception ex)
    {
        EpochDiagnostics.RecordActionFault();
        EventHandler<DeferredActionFailedEventArgs>? handler = DeferredActionFailed;
        if (handler is null)
            return;
        try
        {
            handler(this, new DeferredActionFailedEventArgs(ex));
        }
        catch
        {
            // A handler that throws must not break the drain of an unrelated thread (documented), nor may a failure to
            // allocate the event data (the actions after this one would stay pending).
        }
    }

    /// <summary>Nesting depth of the calling thread on this instance (0 when not protected).</summary>
    internal int ProtectionDepth
    {
        get
        {
            return FindRecord()->Depth;
        }
    }

    /// <summary>The epoch the calling thread announced, or 0 when it is not protected.</summary>
    internal long AnnouncedEpoch
    {
        get
        {
            ThreadRecord* r = FindRecord();
            return r->Depth == 0 ? 0 : Volatile.Read(ref r->Slot->Epoch);
        }
    }

    /// <summary>Runs pending actions that are safe without changing the caller's announcement (cheap when none are
    /// pending).</summary>
    internal void DrainWithoutRefresh()
    {
        if (Volatile.Read(ref pendingActions.Value) != 0)
            Drain();
    }

    /// <summary>
    /// <see cref="DrainWithoutRefresh"/> for a thread that waits in a loop for an action of this epoch to run (a blocking
    /// state-machine start or wait): also runs when the thread is deeper inside drains than the inline limit, where
    /// nothing else would run the action until the wait ends (see <see cref="Drain(bool, Action?, bool)"/>).
    /// </summary>
    /// <param name="awaited">The action the caller waits for (a scheme's step): past the inline depth limit, only its
    /// registrations run (see <see cref="Drain(bool, Action?, bool)"/>).</param>
    internal void DrainWhileWaiting(Action awaited)
    {
        // This deep inside drains on this thread (of all instances: see MaxThreadWaitingDepth), a wait runs only what it
        // waits for, and not the drains left to the outermost one: running anything else could nest further.
        if (t_drains is { } stack && stack.Depth >= MaxThreadWaitingDepth && !UnboundedWaitingNestingForTesting)
        {
            if (DeepWaitThrowsForTesting)
                ThrowTooDeep("A wait", stack.Depth);
            if (Volatile.Read(ref pendingActions.Value) != 0 && !HandOffDeepDrain(awaited))
                Drain(waiting: true, awaited, onlyAwaited: true);
            return;
        }
        // Acquire, as in DrainWithoutRefresh; the caller loops, so a registration this read misses is seen next time.
        if (Volatile.Read(ref pendingActions.Value) != 0)
            Drain(waiting: true, awaited);
        if (!WaitIgnoresDrainsLeftToTheOutermostForTesting)
            RunDrainsLeftWhileWaiting();
    }

    /// <summary>Whether the epoch is disposed (Closed, final; a Dispose that is still deciding does not count). Acquire:
    /// pairs with Dispose's exchange to Closed.</summary>
    internal bool IsClosed => Volatile.Read(ref lifecycle) == Closed;

    /// <summary>Completed once the epoch is Closed; created by the first <see cref="WhenClosed"/>.</summary>
    private TaskCompletionSource<bool>? closedSignal;

    /// <summary>
    /// A task that completes (asynchronously) once the epoch is Closed: for a wait that must end when the epoch under it
    /// is disposed (the scheme's asynchronous start, waiting for another machine that may never end once nothing can
    /// be protected).
    /// </summary>
    internal Task WhenClosed()
    {
        TaskCompletionSource<bool>? signal = Volatile.Read(ref closedSignal);
        if (signal is null)
        {
            var created = new TaskCompletionSource<bool>(TaskCreationOptions.RunContinuationsAsynchronously);
            // Full fence: published before the read of lifecycle below. Pairs with Dispose's exchange to Closed, then
            // read of this field: either it completes our task, or we see Closed here.
            signal = Interlocked.CompareExchange(ref closedSignal, created, null) ?? created;
        }
        if (IsClosed)
            signal.TrySetResult(true);
        return signal.Task;
    }

    /// <summary>Whether any protected thread announced <paramref name="epoch"/> or older.</summary>
    internal bool IsHeldBack(long epoch) => table.AnyOtherAtOrBelow(epoch, null);

    [MethodImpl(MethodImplOptions.NoInlining)]
    private void ThrowNotProtectedOrDisposed(string operation)
    {
        ThrowIfDisposed();
        ThrowHelper.ThrowNotProtected(operation);
    }

    /// <summary>The object name of this epoch's <see cref="ObjectDisposedException"/>: the owning scheme's for an epoch a scheme created (and disposes).</summary>
    internal string DisposedObjectName { get; set; } = nameof(LightEpoch);

    private void ThrowIfDisposed()
    {
        // Acquire: pairs with Dispose's exchange to Closed. Closing is not disposed: that Dispose may still fail.
        int now = Volatile.Read(ref lifecycle);
        if (now == Closed || (LegacyDisposeForTesting && now != Live))
            ThrowHelper.ThrowObjectDisposed(DisposedObjectName);
    }

    /// <summary>
    /// Runs every pending action (none can be unsafe once no thread is protected) and retires the instance.
    /// Returns only once that is done: a call made while another Dispose is running waits for it, then does what a later
    /// call does. A call after a completed Dispose does nothing.
    /// </summary>
    /// <remarks>
    /// <para>Disposing while a thread is protected is the one unsafe case (running the pending actions then could overlap a
    /// region that still holds their epoch back), so it is refused loudly and changes nothing observable: no held
    /// action runs early, and <see cref="Resume"/>/<see cref="BumpCurrentEpoch()"/> on other threads never see the
    /// epoch as disposed. <see cref="TryDispose"/> answers the same question without an exception. A call that waited
    /// for a Dispose that was refused makes its own attempt (and is refused too while a thread is still protected).</para>
    /// <para>The wait for another Dispose is interruptible: <see cref="Thread.Interrupt"/> makes the waiting call throw
    /// <see cref="ThreadInterruptedException"/>, and the other Dispose carries on. An action that a drain on another
    /// thread claimed before the epoch closed may still be running when Dispose returns (it was not the Dispose's to
    /// run); every action still pending when the epoch closes is reserved for the final run, so it has run when Dispose
    /// returns (one registered on another thread after the close runs there, as usual, and may still be running). The
    /// final run runs those actions one after another on the disposing thread: one of them that waits for another of them
    /// without draining this epoch (a <see cref="Task"/> wait, a machine's <c>Completion</c>) waits for ever, as it would
    /// inside any single drain; a drain on another thread that began before the close no longer runs the other one for it.</para>
    /// </remarks>
    /// <exception cref="InvalidOperationException">A thread is still protected by this instance (a thread inside an
    /// <see cref="EpochProtectedVersionScheme.Refresh"/> on it counts, also while it has stepped aside for a transition);
    /// nothing is disposed, so the caller can make the threads leave and try again (called from a deferred action that a
    /// protected thread runs, the message says so: that thread cannot leave from inside the action). Or: called from inside an action that
    /// this epoch's own Dispose is running (on the thread of that Dispose, which cannot wait for itself); that Dispose
    /// completes regardless. Or: called 512 or more drains deep on the calling thread (deferred actions inside deferred
    /// actions): its final run would run the pending actions deeper still, and a chain of them overflowed the stack;
    /// nothing is disposed.</exception>
    /// <exception cref="ThreadInterruptedException">The call waited for another Dispose and was interrupted.</exception>
    public void Dispose()
    {
        // The action's own case first: the advice for a protected caller (Suspend first) is refused inside the action.
        if (ProtectedOnlyByTheThreadRunningThisAction())
            ThrowHelper.ThrowInvalidOperation(
                "Dispose was called from a deferred action that a protected thread runs (in its ProtectAndDrain/Refresh or " +
                "Resume/Enter, or a BumpCurrentEpoch inside its region): that thread stays protected while the action runs, so " +
                "the epoch cannot close, and the action may not end the region for it. Dispose from outside the deferred " +
                "action, once the thread has left (TryDispose returns false here). The epoch was not disposed.");
        if (ThisInstanceProtected())
            ThrowHelper.ThrowInvalidOperation("Dispose was called by a thread that is still protected by this epoch; call Suspend()/Leave() first.");
        if (!DisposeCompleted)
            ThrowIfTooDeepToBlock("LightEpoch.Dispose"); // (a Dispose after a completed one does nothing, however deep)
        int stillProtected = CloseIfUnprotected(fromDispose: true);
        if (stillProtected != 0)
            ThrowHelper.ThrowInvalidOperation(
                $"Dispose was called while {stillProtected} thread(s) are still protected by this epoch; " +
                "make them call Suspend()/Leave() first (or use TryDispose). The epoch was not disposed.");
    }

    /// <summary>
    /// Disposes the epoch if no thread (the caller included) is protected by it; otherwise changes nothing and
    /// returns false (also when called 512 or more drains deep on the calling thread: see <see cref="Dispose"/>). Never throws.
    /// </summary>
    /// <remarks>Like <see cref="Dispose"/>, waits for a Dispose running on another thread; unlike it, not interruptibly:
    /// an interrupt stays pending for the thread's next wait (it used to escape while another Dispose was deciding). Called
    /// from inside an action that this epoch's own Dispose is running, it returns false: that Dispose is not complete, and
    /// the call cannot wait for it.</remarks>
    /// <returns>True if the epoch is disposed (by this call or an earlier one).</returns>
    public bool TryDispose() => !ThisInstanceProtected() && (DisposeCompleted || !TooDeepToWait) && CloseIfUnprotected(fromDispose: false) == 0;

    /// <summary>Whether a Dispose has completed (acquire: pairs with the release that marks it complete).</summary>
    private bool DisposeCompleted => Volatile.Read(ref lifecycle) == Closed && Volatile.Read(ref closeCompleted) != 0;

    /// <summary>Live → Closing → Closed, or back to Live; returns the number of protected threads found (0: Closed, and
    /// the Dispose that closed it complete; -1: closed by a Dispose further up this thread's stack, for a TryDispose). The
    /// only place that leaves Live. A Dispose's waits are interruptible and its re-entrant call throws; a TryDispose's
    /// are not, and it does not.</summary>
    private int CloseIfUnprotected(bool fromDispose)
    {
        var spinner = new SpinWait();
        var patient = new UninterruptibleSpinWait();
        try
        {
            while (true)
            {
                // Full fence: ordered before the slot reads below (pairs with ResumeSlow's claim, then read of lifecycle).
                int was = Interlocked.CompareExchange(ref lifecycle, Closing, Live);
                if (was == Closed)
                    return WaitForClose(fromDispose, ref spinner, ref patient);
                if (was == Live)
                    break;
                // Another Dispose is deciding: take its answer, or try again.
                DisposeWaitsHookForTesting?.Invoke();
                if (fromDispose || InterruptibleTryDisposeForTesting)
                    spinner.SpinOnce();
                else
                    patient.SpinOnce();
            }
        }
        finally
        {
            patient.End();
        }
        return CloseCore();
    }

    /// <summary>The part of <see cref="CloseIfUnprotected"/> that runs once this call moved the epoch to Closing.</summary>
    private int CloseCore()
    {
        // Mark every free slot so no fast-path Resume can claim it; a slot already taken means a protected thread.
        // A slot in a segment grown after this pass is covered by ResumeSlow's check of lifecycle after its claim.
        int stillProtected = 0;
        for (Segment<EpochSlot>? s = table.First; s is not null; s = Volatile.Read(ref s.Next))
        {
            EpochSlot[] slots = s.Items;
            for (int i = 0; i < slots.Length; i++)
            {
                if (Interlocked.CompareExchange(ref slots[i].Epoch, EpochSlotTable.DisposedMarker, 0) != 0)
                    stillProtected++;
            }
        }
        // A thread stepped aside inside a region keeps its slot, parked (StepAside): the pass above found it taken.
        ClosingHookForTesting?.Invoke();

        if (stillProtected != 0)
        {
            for (Segment<EpochSlot>? s = table.First; s is not null; s = Volatile.Read(ref s.Next))
            {
                EpochSlot[] slots = s.Items;
                for (int i = 0; i < slots.Length; i++)
                    Interlocked.CompareExchange(ref slots[i].Epoch, 0, EpochSlotTable.DisposedMarker);
            }
            // Full fence: the unmarked slots are visible to a Resume that sees Live again.
            Interlocked.Exchange(ref lifecycle, Live);
            return stillProtected;
        }

        // Final. Full fence: pairs with Defer's read of lifecycle after its registration (either we run it below, or it
        // sees Closed and runs the list itself). Also publishes closingThread to a Dispose that sees Closed.
        Volatile.Write(ref closingThread, Environment.CurrentManagedThreadId);
        // What is pending at the close is the final run's, so it has run when Dispose returns: every other claim waits from
        // before the close until it is reserved (a drain that began before the close may still be inside an action it
        // claimed before). Registrations from the close on are claimed as usual (another thread's runs there, even while
        // an action of the final run waits for it).
        bool reserve = !FinalRunReservesNothingForTesting;
        if (reserve)
            claimGate.Close(); // never throws; no claim can fall between the close below and the reservation
        Interlocked.Exchange(ref lifecycle, Closed);
        try
        {
            if (reserve)
            {
                try
                {
                    ReservingHookForTesting?.Invoke();
                    drainList.ReserveAll(); // no user code
                }
                finally
                {
                    claimGate.Open(); // whatever happens: a gate left closed would hold every later claim for ever
                }
            }
            ClosedHookForTesting?.Invoke();
            RunClosed(final: true); // never throws
        }
        finally
        {
            ReleaseId(id); // never throws
            GC.SuppressFinalize(this);
            // Release: the final run and the id's release happen-before a waiting Dispose returns (WaitForClose).
            Volatile.Write(ref closeCompleted, 1);
            // After the exchange to Closed above (full fence): see WhenClosed. Its continuations run asynchronously.
            Volatile.Read(ref closedSignal)?.TrySetResult(true);
        }
        return 0;
    }

    /// <summary>
    /// The epoch is Closed: returns 0 once the Dispose that closed it has completed. On that Dispose's own thread (an
    /// action of its final run calling Dispose again) it cannot complete first: throws, or returns -1.
    /// </summary>
    [MethodImpl(MethodImplOptions.NoInlining)]
    private int WaitForClose(bool fromDispose, ref SpinWait spinner, ref UninterruptibleSpinWait patient)
    {
        // Acquire: pairs with the release at the end of the closing Dispose.
        if (Volatile.Read(ref closeCompleted) != 0 || LegacyConcurrentDisposeForTesting)
            return 0;
        // closingThread was written before the exchange to Closed that the caller's CAS saw (full fences both).
        if (Volatile.Read(ref closingThread) == Environment.CurrentManagedThreadId)
        {
            if (!fromDispose)
                return -1;
            ThrowHelper.ThrowInvalidOperation(
                "Dispose was called from inside an action that this epoch's own Dispose is running (on the same thread): " +
                "that Dispose cannot complete before the action returns, so this call cannot wait for it. It completes " +
                "regardless; do not dispose the epoch from its own actions.");
        }
        // User actions may run for long: spin, then sleep; a Dispose interruptibly (a waiting Dispose has changed nothing).
        while (Volatile.Read(ref closeCompleted) == 0)
        {
            DisposeWaitsHookForTesting?.Invoke();
            if (fromDispose || InterruptibleTryDisposeForTesting)
                spinner.SpinOnce();
            else
                patient.SpinOnce();
        }
        return 0;
    }
}
