using System;
using System.Collections.Generic;
using System.Runtime.CompilerServices;
using System.Threading;
using System.Threading.Tasks;

namespace Epvs;

/// <summary>
/// The Epoch-Protected Version Scheme (EPVS) of Li, Chandramouli and Madden (VLDB Journal 2024), after Microsoft
/// FASTER's: threads run latch-free inside protected regions (<see cref="Enter()"/> ... <see cref="Leave"/>) that each
/// observe one stable <see cref="VersionSchemeState"/>, and state machines move the scheme between states with
/// critical sections that run in mutual exclusion with every protected region.
/// </summary>
/// <remarks>
/// <para>Guarantees, each covered by tests:</para>
/// <list type="bullet">
/// <item><description>Mutual exclusion: <see cref="VersionSchemeStateMachine.OnEnteringState"/> runs only after every
/// region that observed the old state has left, and no region observes the new state before it has run.</description></item>
/// <item><description>Stable view: the state returned by <see cref="Enter()"/> or <see cref="Refresh"/> holds until the
/// matching <see cref="Leave"/> or the next <see cref="Refresh"/>.</description></item>
/// <item><description>Monotonic versions: a version is advanced to at most once; see
/// <see cref="StateMachineExecutionStatus"/>.</description></item>
/// <item><description>Self-stepping: a machine whose steps are available completes with no further calls by anyone; a
/// delayed step completes after <see cref="SignalStepAvailable"/>.</description></item>
/// <item><description>Advancing under protection: when a protected thread requests a transition, the critical section
/// waits until that thread leaves or refreshes (FASTER silently refreshes the caller instead).</description></item>
/// <item><description>Faults do not wedge: if <see cref="VersionSchemeStateMachine.OnEnteringState"/> throws, the scheme
/// returns to the state the step started from; if <see cref="VersionSchemeStateMachine.GetNextStep"/> or
/// <see cref="VersionSchemeStateMachine.AfterEnteringState"/> throws, it stays in the last state entered. Either way
/// the machine ends, the next machine can start, the exception faults the machine's
/// <see cref="VersionSchemeStateMachine.Completion"/>, is rethrown by
/// <see cref="ExecuteStateMachine"/>/<see cref="AdvanceVersionWithCriticalSection"/> with <c>spin: true</c>, and is
/// reported through <see cref="StateMachineFaulted"/>.</description></item>
/// <item><description>Re-entrant: regions nest, on one scheme or on several schemes sharing a <see cref="LightEpoch"/>. A
/// nested <see cref="Enter()"/> or <see cref="Refresh"/> never releases the outer region's protection.</description></item>
/// </list>
/// <para>Protection belongs to a thread: do not <c>await</c> inside a region.</para>
/// <para>Nesting is counted per <see cref="LightEpoch"/>, not per scheme: a region of scheme B inside a region of
/// scheme A on the same epoch is a nested level of that epoch, and <see cref="Leave"/> and <see cref="Refresh"/>
/// act on the innermost level whichever scheme they are called on.</para>
/// <para>Nest regions of schemes that share one <see cref="LightEpoch"/>. A thread that holds protection on one epoch
/// while it enters a scheme on another epoch can deadlock with a thread doing the opposite, exactly like two locks
/// taken in opposite orders: each transition waits for the other thread to leave. The same holds within one epoch for
/// a critical section (<see cref="VersionSchemeStateMachine.OnEnteringState"/>) that enters another scheme: a region of
/// that scheme nested into this one waits for the critical section, which waits for that scheme's transition, which
/// waits for the region.</para>
/// </remarks>
public sealed partial class EpochProtectedVersionScheme : IDisposable
{
    /// <summary>Value of <see cref="transitionPrior"/> while the stepping thread has published an intermediate
    /// state but not yet bumped the epoch.</summary>
    private const long UnknownPrior = long.MaxValue;

    private readonly LightEpoch epoch;
    private readonly bool ownsEpoch;

    /// <summary>The thread running <see cref="Dispose"/> (0: none): one at a time.</summary>
    private int disposingThread;

    /// <summary>Completed (and cleared) when a Dispose ends, disposed or refused; created by a waiter that found a Dispose
    /// holding the machine slot (<see cref="DisposeEndedOrNull"/>), so a Dispose nobody waits for allocates nothing.</summary>
    private TaskCompletionSource<bool>? disposeEnded;

    /// <summary>The <see cref="VersionSchemeState"/> word. Written by CAS (start of a step) or release store
    /// (end of a step); read with acquire.</summary>
    private long state;
    private VersionSchemeStateMachine? currentMachine;

    /// <summary>The epoch the current step waits on: every region that may have observed the step's starting state
    /// announced this epoch or an older one.</summary>
    private long transitionPrior = UnknownPrior;

    private int disposed;

    /// <summary>1 once a Dispose has completed (the epoch disposed, the state marked): only then do other calls return.</summary>
    private int disposeCompleted;

    /// <summary>Creates a scheme with its own <see cref="LightEpoch"/>, disposed with the scheme. Starts at rest,
    /// version 1.</summary>
    public EpochProtectedVersionScheme()
        : this(new LightEpoch(), ownsEpoch: true)
    {
    }

    /// <summary>
    /// Creates a scheme on a shared <see cref="LightEpoch"/>. Several schemes may share one epoch, and a thread may
    /// nest regions of all of them. The epoch is not disposed with the scheme. Starts at rest, version 1.
    /// </summary>
    /// <param name="epoch">The epoch to share.</param>
    /// <exception cref="ArgumentNullException"><paramref name="epoch"/> is null.</exception>
    public EpochProtectedVersionScheme(LightEpoch epoch)
        : this(epoch ?? throw new ArgumentNullException(nameof(epoch)), ownsEpoch: false)
    {
    }

    /// <summary>
    /// Creates a scheme that starts at rest at <paramref name="initialVersion"/>, for example the version a recovered
    /// checkpoint was taken at; on a shared <see cref="LightEpoch"/> if one is given, else on its own.
    /// </summary>
    /// <param name="epoch">The epoch to share, or null for one of its own (disposed with the scheme).</param>
    /// <param name="initialVersion">The first version, 0 to <see cref="VersionSchemeState.MaxVersion"/>.</param>
    /// <exception cref="ArgumentOutOfRangeException"><paramref name="initialVersion"/> is out of range.</exception>
    public EpochProtectedVersionScheme(LightEpoch? epoch, long initialVersion)
        : this(epoch ?? new LightEpoch(), ownsEpoch: epoch is null, initialVersion)
    {
    }

    private EpochProtectedVersionScheme(LightEpoch epoch, bool ownsEpoch, long initialVersion = 1)
    {
        if ((ulong)initialVersion > VersionSchemeState.MaxVersion)
        {
            // The epoch created for this scheme would otherwise wait for its finalizer. (TryDispose: never throws, so the
            // argument's exception is the one reported, also where a Dispose would refuse: deep inside drains.)
            if (ownsEpoch)
                epoch.TryDispose();
            ThrowHelper.ThrowArgumentOutOfRange(nameof(initialVersion), $"A version must be between 0 and {VersionSchemeState.MaxVersion}.");
        }

        LightEpoch.WaiterContext ??= CallbackContext.Instance;
        this.epoch = epoch;
        this.ownsEpoch = ownsEpoch;
        // An owned epoch is disposed with the scheme: its ObjectDisposedException (from Enter, say) names the scheme.
        if (ownsEpoch)
            epoch.DisposedObjectName = nameof(EpochProtectedVersionScheme);
        state = VersionSchemeState.Make(VersionSchemeState.Rest, initialVersion).Word;
        completeStep = CompleteStep;
    }

    /// <summary>The epoch under this scheme. For advanced uses only, such as sharing it with another scheme.</summary>
    /// <remarks>A region entered on this epoch directly (<see cref="LightEpoch.Resume"/>,
    /// <see cref="LightEpoch.EnterScope"/>) is not excluded by this scheme's critical sections: only one that began
    /// before a transition was requested holds it back, and one that begins during the transition may overlap its
    /// critical section. Guard whatever a critical section changes with this scheme's <see cref="Enter()"/>.</remarks>
    public LightEpoch Epoch => epoch;

    /// <summary>The current state, possibly intermediate. Outside a protected region it may change at any time. After
    /// <see cref="Dispose"/>, the last state, at rest.</summary>
    public VersionSchemeState CurrentState
    {
        get
        {
            // Acquire: if the intermediate bit is Dispose's, the disposed flag (set before it) is seen below.
            var current = new VersionSchemeState(Volatile.Read(ref state));
            // Dispose sets the bit only to send every Enter to its slow path (where it throws): not a transition.
            return Volatile.Read(ref disposed) != 0 ? current.WithoutIntermediate() : current;
        }
    }

    /// <summary>
    /// The state machine currently running, or null. A snapshot: it may finish (or another may start) at any time.
    /// Await its <see cref="VersionSchemeStateMachine.Completion"/> to wait for it, for example before
    /// <see cref="Dispose"/>.
    /// </summary>
    public VersionSchemeStateMachine? ActiveStateMachine =>
        Volatile.Read(ref currentMachine) is { } m && m != DisposedSentinel ? m : null;

    /// <summary>
    /// Enters a protected region (or nests one level deeper) and returns the state it observes, which holds until
    /// the matching <see cref="Leave"/>. Waits while a critical section is pending or running, unless the thread is
    /// already protected by the underlying epoch, in which case it never releases that protection.
    /// </summary>
    /// <remarks>An Enter that throws (also when its wait is broken by <see cref="Thread.Interrupt"/>) has entered
    /// nothing: do not <see cref="Leave"/> for it.</remarks>
    /// <returns>The stable state this region observes.</returns>
    /// <exception cref="ObjectDisposedException">The scheme (or its epoch) has been disposed.</exception>
    /// <exception cref="InvalidOperationException">The call would wait for a transition on a thread 512 or more drains
    /// deep (deferred actions inside deferred actions): the wait would run the transition's step, whose callbacks may wait
    /// again, deeper still, until the stack overflowed. Nothing was entered.</exception>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    public VersionSchemeState Enter() => Enter(CancellationToken.None);

    /// <summary>
    /// <see cref="Enter()"/>, with a wait for a pending transition that <paramref name="cancellationToken"/> can end: for a
    /// caller that must be able to give up on a transition that may never complete (a thread that exited inside a
    /// region of the old version, which nothing can make leave, holds it back for ever).
    /// </summary>
    /// <remarks>The token is observed only while the call waits: a call that need not wait (no transition pending) enters
    /// even when the token is cancelled, at the cost of <see cref="Enter()"/>. A cancelled call has entered nothing: do
    /// not <see cref="Leave"/> for it.</remarks>
    /// <param name="cancellationToken">Ends the wait for a pending transition.</param>
    /// <returns>The stable state this region observes.</returns>
    /// <exception cref="OperationCanceledException">The token was cancelled while the call waited.</exception>
    /// <exception cref="ObjectDisposedException">The scheme (or its epoch) has been disposed.</exception>
    /// <exception cref="InvalidOperationException">As for <see cref="Enter()"/>: it would wait 512 or more drains deep.</exception>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    public VersionSchemeState Enter(CancellationToken cancellationToken)
    {
        epoch.Resume();
        // Acquire: pairs with the release store that ends a step, so the critical section's writes are visible.
        // Ordered after the announcement by the outermost Resume's full fence (DESIGN §2.2).
        long s = Volatile.Read(ref state);
        if ((s & VersionSchemeState.IntermediateMask) == 0 && currentMachine is null)
            return new VersionSchemeState(s);
        return EnterSlow(cancellationToken);
    }

    [MethodImpl(MethodImplOptions.NoInlining)]
    private VersionSchemeState EnterSlow(CancellationToken cancellationToken)
    {
        int depth = epoch.ProtectionDepth; // with the level Resume just added
        bool waiting = false;
        try
        {
            ThrowIfDisposed();
            TryStepStateMachine(mustNotLose: false);
            waiting = true;
            return WaitForStableState(addedLevel: true, cancellationToken);
        }
        catch
        {
            // An Enter that throws adds no level: its caller will not Leave. Whatever failed (the scheme was disposed, an
            // interrupted wait, an allocation), take the level back unless the wait already gave it up (it steps aside
            // unprotected, and leaves before its own throws). A level kept here would keep the thread protected after its
            // outer regions have left, and every later transition would wait for it for ever.
            if (epoch.ProtectionDepth == depth && !(waiting && LegacyFailedWaitForTesting))
                epoch.Suspend();
            throw;
        }
    }

    /// <summary>
    /// Equivalent to <see cref="Leave"/> then <see cref="Enter()"/>, but cheaper: lets pending transitions pass and
    /// returns the new stable state. When nested, the outer regions' protection is kept: the call returns the state
    /// those regions observe.
    /// </summary>
    /// <remarks><see cref="Thread.Interrupt"/> does not break the wait of an outermost Refresh, which is stepped aside
    /// from its region while it waits: it returns as usual, at a stable state, and the interrupt stays pending for the
    /// thread's next interruptible wait. (Coming back early would put the region inside a transition that no longer
    /// waits for it.) Nested, the wait may throw <see cref="ThreadInterruptedException"/>; the outer regions' protection
    /// was never released, so the region still excludes the pending critical section. A Refresh that throws leaves the
    /// region entered: leave it as usual. The state the region observed before the call may no longer hold (the transition
    /// the call waited for may have completed meanwhile). Should an outermost Refresh fail while stepped aside for another
    /// reason (a drain it ran while waiting ran out of memory), the region it keeps may overlap the pending critical
    /// section: do nothing in it but <see cref="Leave"/>.</remarks>
    /// <returns>The stable state this region now observes.</returns>
    /// <exception cref="InvalidOperationException">The calling thread is not in a protected region.</exception>
    /// <exception cref="ObjectDisposedException">The scheme was disposed while the call waited for a transition (on a
    /// shared epoch; an owned epoch refuses to be disposed meanwhile). The region stays entered: leave it. Also when
    /// the calling thread is not protected and the scheme's own epoch has been disposed.</exception>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    public VersionSchemeState Refresh()
    {
        epoch.ProtectAndDrain();
        long s = Volatile.Read(ref state); // acquire, as in Enter
        if ((s & VersionSchemeState.IntermediateMask) == 0 && currentMachine is null)
            return new VersionSchemeState(s);
        return RefreshSlow();
    }

    [MethodImpl(MethodImplOptions.NoInlining)]
    private VersionSchemeState RefreshSlow()
    {
        TryStepStateMachine(mustNotLose: false);
        return WaitForStableState(addedLevel: false);
    }

    /// <summary>Leaves the protected region entered by the matching <see cref="Enter()"/>.</summary>
    /// <exception cref="InvalidOperationException">The calling thread is not in a protected region of the
    /// underlying epoch (unbalanced <see cref="Leave"/>, or a call from another thread than the one that
    /// entered).</exception>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    public void Leave() => epoch.Suspend();

    /// <summary>
    /// Enters a protected region and returns a guard whose <see cref="Scope.Dispose"/> leaves it; allocates nothing.
    /// </summary>
    /// <param name="state">The stable state the region observes.</param>
    /// <returns>The guard; use with <c>using</c>.</returns>
    /// <exception cref="ObjectDisposedException">The scheme has been disposed.</exception>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    public Scope EnterScope(out VersionSchemeState state)
    {
        state = Enter();
        return new Scope(this);
    }

    /// <summary><see cref="EnterScope(out VersionSchemeState)"/> with <see cref="Enter(CancellationToken)"/>'s cancellable wait.</summary>
    /// <param name="state">The stable state the region observes.</param>
    /// <param name="cancellationToken">Ends the wait for a pending transition.</param>
    /// <returns>The guard; use with <c>using</c>.</returns>
    /// <exception cref="OperationCanceledException">The token was cancelled while the call waited (nothing was entered).</exception>
    /// <exception cref="ObjectDisposedException">The scheme has been disposed.</exception>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    public Scope EnterScope(out VersionSchemeState state, CancellationToken cancellationToken)
    {
        state = Enter(cancellationToken);
        return new Scope(this);
    }

    /// <summary>
    /// Returns once the state is not intermediate, with the calling thread protected and the returned state stable
    /// for it. Called with the thread protected (depth ≥ 1); <paramref name="addedLevel"/> says whether the caller
    /// (Enter) added the innermost level, which a failure must then take away again (Refresh added none).
    /// </summary>
    private VersionSchemeState WaitForStableState(bool addedLevel, CancellationToken cancellationToken = default)
    {
        int handedOff = HandedOffMark;
        try
        {
            return WaitForStableStateCore(addedLevel, cancellationToken);
        }
        finally
        {
            EndWait(handedOff);
        }
    }

    private VersionSchemeState WaitForStableStateCore(bool addedLevel, CancellationToken cancellationToken)
    {
        var spinner = new SpinWait();
        while (true)
        {
            long s = Volatile.Read(ref state);
            if ((s & VersionSchemeState.IntermediateMask) == 0)
                return new VersionSchemeState(s);

            bool inCriticalSection = InCriticalSection();
            if (Volatile.Read(ref disposed) != 0 || inCriticalSection)
            {
                if (addedLevel)
                    epoch.Suspend();
                if (inCriticalSection)
                    ThrowHelper.ThrowInvalidOperation(
                        "Enter/Refresh was called from inside OnEnteringState (a critical section) of the same scheme: " +
                        "the critical section excludes every protected region, so it would wait for itself. Do that " +
                        "work without entering, or in AfterEnteringState.");
                ThrowHelper.ThrowObjectDisposed(nameof(EpochProtectedVersionScheme));
            }

            if (epoch.ProtectionDepth > 1)
            {
                // Nested inside another region of this epoch: dropping protection would break the outer region,
                // so decide whether this step waits for us. Read the step's epoch, then check the state did not
                // move on meanwhile, so the two belong together.
                long prior = Volatile.Read(ref transitionPrior);
                if (Volatile.Read(ref state) != s)
                    continue;
                // Our announcement is at or below the step's epoch: the critical section cannot run until we leave, so
                // the state the step started from holds for us (this is always the case for a nested Enter on the scheme
                // whose outer region observed that state).
                if (prior != UnknownPrior && epoch.AnnouncedEpoch <= prior)
                    return new VersionSchemeState(s).WithoutIntermediate();
                // Unknown: the stepping thread has published the intermediate state and not yet the step's epoch (a few
                // instructions): whether the call waits is not known yet, so the token is not looked at.
                if (prior != UnknownPrior || CancelledEnterThrowsBeforeThePriorIsKnownForTesting)
                {
                    ThrowIfCancelled(addedLevel, cancellationToken); // from here on the call waits
                    if (addedLevel)
                        ThrowIfTooDeepToWait();
                }
                if (prior != UnknownPrior)
                {
                    // The step does not wait for us. Wait for it, running its critical section if it is due (also
                    // deeper inside drains than the inline limit: the drain we would leave it to may be this thread's).
                    if (StepAsideWithoutDrainingForTesting)
                        epoch.DrainWithoutRefresh();
                    else
                        epoch.DrainWhileWaiting(completeStep);
                }
                // else: the stepping thread is between publishing the intermediate state and bumping the epoch.
                ReportStallIfDue();
                spinner.SpinOnce();
                continue;
            }

            if (addedLevel)
            {
                // Outermost Enter: it has no region yet, so it leaves, waits for the transition and enters again. A failure
                // anywhere here (an interrupted wait, a Resume that cannot claim a slot) is an Enter that throws having
                // entered nothing: EnterSlow finds the level gone. A Suspend that throws (its drain) has already left.
                ThrowIfCancelled(addedLevel, cancellationToken);
                ThrowIfTooDeepToWait();
                epoch.Suspend();
                AfterStepAsideHookForTesting?.Invoke();
                WaitWhileUnchanged(s, ref spinner, cancellationToken);
                BeforeComingBackHookForTesting?.Invoke();
                epoch.Resume();
                continue;
            }

            // Outermost Refresh: it stays inside its region. It steps aside with its slot parked (still its own, holding
            // nothing back), so it comes back without claiming a slot: that cannot fail (a claim could, every slot taken
            // meanwhile and the table unable to grow), and an epoch's Dispose meanwhile finds the slot taken and refuses
            // instead of closing under the region (G7).
            nint parked = epoch.StepAside();
            // Not interruptible: the region must not come back before the transition has moved on. Coming back announces
            // the current epoch, which the step (it bumped the epoch before we stepped aside) does not wait for, so a region
            // back early, with the state still intermediate, would be open while the critical section runs (G1, G2). The
            // interrupt is requested again once we are back, for the thread's next wait.
            var patient = new UninterruptibleSpinWait();
            try
            {
                epoch.DrainAfterStepAside();
                AfterStepAsideHookForTesting?.Invoke();
                if (InterruptibleStepAsideWaitForTesting)
                    WaitWhileUnchanged(s, ref spinner);
                else
                    WaitWhileUnchanged(s, ref patient);
                BeforeComingBackHookForTesting?.Invoke();
            }
            catch
            {
                // Something other than an interrupt failed while aside (a drain, out of memory). The Refresh throws with its
                // region entered, as when the scheme was disposed: its caller is still inside it and will Leave (which would
                // otherwise throw "not protected" and hide this exception). Documented: the region may overlap the pending
                // critical section, so the caller should only leave it.
                if (LegacyFailedWaitForTesting)
                    epoch.AbandonStepAside(parked);
                else
                    ComeBackKeepingTheFailure(parked);
                patient.End();
                throw;
            }
            epoch.ComeBack(parked);
            patient.End();
        }
    }

    /// <summary>Ends a step aside whose wait failed, without replacing the failure in flight: should coming back throw
    /// too (its drain), the thread is back in its region all the same (see <see cref="LightEpoch.ComeBack"/>).</summary>
    private void ComeBackKeepingTheFailure(nint parked)
    {
        try
        {
            epoch.ComeBack(parked);
        }
        catch (Exception)
        {
            // The failure in flight is the one to report (and the one the caller's catch expects); this later one, of the
            // drain that coming back ran, is dropped.
        }
    }

    /// <summary>
    /// Stepped aside (unprotected): waits until the state moves on from <paramref name="s"/>, or the scheme is disposed
    /// (Dispose's mark, the intermediate bit on the last state, can equal <paramref name="s"/> if that transition's
    /// critical section failed and restored it; the flag is set before the mark, so a read that sees the mark sees it).
    /// The outermost Enter's wait: <see cref="Thread.Interrupt"/> can make it throw (the Enter has entered nothing).
    /// </summary>
    private void WaitWhileUnchanged(long s, ref SpinWait spinner, CancellationToken cancellationToken = default)
    {
        while (StillUnchanged(s) && !Cancelled(cancellationToken))
            spinner.SpinOnce(); // sleeps at times: Thread.Interrupt can make it throw
    }

    /// <summary>An Enter about to wait (again) for a transition on a thread 512 drains deep: gives back the level it added
    /// and throws (see <see cref="LightEpoch"/>'s per-thread bound). A Refresh does not: an outermost one has moved its
    /// announcement past the step before it knows it must wait, so it may not come back early.</summary>
    private void ThrowIfTooDeepToWait()
    {
        if (!LightEpoch.TooDeepToWait || LightEpoch.EnterWaitsPastTheThreadBoundForTesting)
            return;
        int depth = LightEpoch.ThreadDrainDepth;
        epoch.Suspend();
        LightEpoch.ThrowTooDeep("Enter, waiting for a transition,", depth); // always: the level is given back
    }

    /// <summary>An <see cref="Enter(CancellationToken)"/> about to wait (again) whose token is cancelled: gives back the
    /// level it added, as for a disposed scheme, and throws, having entered nothing.</summary>
    private void ThrowIfCancelled(bool addedLevel, CancellationToken cancellationToken)
    {
        if (!Cancelled(cancellationToken))
            return;
        if (addedLevel)
            epoch.Suspend();
        cancellationToken.ThrowIfCancellationRequested();
    }

    /// <summary>Whether an <see cref="Enter(CancellationToken)"/>'s wait is to end (the broken control never ends it).</summary>
    private static bool Cancelled(CancellationToken cancellationToken) =>
        cancellationToken.IsCancellationRequested && !EnterIgnoresCancellationForTesting;

    /// <summary>The stepped-aside Refresh's wait: as <see cref="WaitWhileUnchanged(long, ref SpinWait, CancellationToken)"/>, but an
    /// interrupt is absorbed (see <see cref="UninterruptibleSpinWait.End"/>).</summary>
    private void WaitWhileUnchanged(long s, ref UninterruptibleSpinWait patient)
    {
        while (StillUnchanged(s))
            patient.SpinOnce();
    }

    /// <summary>One turn of a stepped-aside wait: whether the state is still <paramref name="s"/> (and the scheme not
    /// disposed), having run what became safe if so.</summary>
    private bool StillUnchanged(long s)
    {
        if (Volatile.Read(ref state) != s || Volatile.Read(ref disposed) != 0)
            return false;
        SteppedAsideWaitHookForTesting?.Invoke();
        // Unprotected here, so running what is safe is safe. The step may be queued behind actions this thread's own
        // drains (further up its stack, past the inline limit) left pending: nobody else may run it (an Enter inside
        // each of 16 queued actions, stepping aside in turn, used to spin for ever).
        if (!StepAsideWithoutDrainingForTesting)
            epoch.DrainWhileWaiting(completeStep);
        ReportStallIfDue();
        return true;
    }

    private void ThrowIfDisposed()
    {
        if (Volatile.Read(ref disposed) != 0)
            ThrowHelper.ThrowObjectDisposed(nameof(EpochProtectedVersionScheme));
    }

    /// <summary>
    /// For the calls that start or step a machine (cold paths): also throws when the epoch under the scheme is disposed (a
    /// shared one, or the owned one through <see cref="Epoch"/>), as <see cref="Enter()"/> does. Nothing can be protected on
    /// a disposed epoch, so a critical section started there would exclude nothing. Steps of a machine already in flight
    /// when the epoch closed still run (the epoch's final run, or its closed registrations, take them).
    /// </summary>
    private void ThrowIfDisposedOrEpochClosed()
    {
        ThrowIfDisposed();
        if (epoch.IsClosed)
            ThrowHelper.ThrowEpochDisposed(epoch.DisposedObjectName);
    }

    /// <summary>
    /// Retires the scheme: later calls throw <see cref="ObjectDisposedException"/>. Disposes the epoch if the scheme
    /// created it. Returns only once that is done: a call made while another Dispose is running waits for it, then does
    /// what a later call does. A call after a completed Dispose does nothing; a call after a refused one tries again.
    /// </summary>
    /// <remarks>A call that waited for a Dispose that was refused (see the exceptions) makes its own attempt, and is
    /// refused too while the reason stands. The wait is interruptible: <see cref="Thread.Interrupt"/> makes the waiting
    /// call throw <see cref="ThreadInterruptedException"/>, and the other Dispose carries on. A machine's
    /// <see cref="VersionSchemeStateMachine.Completion"/> completes after its <see cref="StateMachineFaulted"/> handlers
    /// have returned (but for a fault raised past 16 nested raises on one thread, see the event): awaited before Dispose,
    /// no handler of it runs after Dispose returned (a Dispose that did not wait may return while one still runs).</remarks>
    /// <exception cref="InvalidOperationException">A state machine is still running (wait for its
    /// <see cref="VersionSchemeStateMachine.Completion"/> first; from inside one of that machine's own callbacks, which it
    /// waits for, dispose from outside them instead), or a thread is still protected by the scheme's own
    /// epoch (a thread inside <see cref="Refresh"/>, stepped aside while a transition completes, counts as protected).
    /// Nothing is disposed. Or: called on the thread of a Dispose of this scheme that is still running (from a deferred
    /// action that the owned epoch's Dispose runs), which cannot complete before this call returns and so cannot be
    /// waited for; that Dispose completes regardless.</exception>
    /// <exception cref="ThreadInterruptedException">The call waited for another Dispose and was interrupted.</exception>
    public void Dispose()
    {
        // Acquire: pairs with the release at the end of DisposeCore (everything it did is visible to a caller that returns).
        if (Volatile.Read(ref disposeCompleted) != 0)
            return;
        // One Dispose at a time (no lock is held while the epoch runs actions: user code). A call that finds another one
        // running waits until it ends, then looks again: complete (return), or refused (make its own attempt). It used to
        // return at once, before the first had disposed anything (or with the first about to fail).
        int me = Environment.CurrentManagedThreadId;
        var spinner = new SpinWait();
        while (true)
        {
            // Full fence; the release below (or the completion) is what a waiter's next CAS or read sees.
            int holder = Interlocked.CompareExchange(ref disposingThread, me, 0);
            if (holder == 0)
                break;
            if (holder == me)
            {
                ThrowHelper.ThrowInvalidOperation(
                    "Dispose was called on a thread whose own Dispose of this scheme is still running (from a deferred " +
                    "action that the scheme's epoch runs while it is disposed): that Dispose cannot complete before this " +
                    "call returns, so this call cannot wait for it. It completes regardless; do not dispose the scheme " +
                    "from inside its own Dispose.");
            }
            if (LegacyConcurrentDisposeForTesting)
                return;
            DisposeWaitsHookForTesting?.Invoke();
            spinner.SpinOnce(); // sleeps at times: Thread.Interrupt makes this waiting call throw, having changed nothing
            if (Volatile.Read(ref disposeCompleted) != 0) // acquire, as above
                return;
        }
        try
        {
            DisposeCore();
        }
        finally
        {
            Volatile.Write(ref disposingThread, 0); // release: pairs with a waiter's CAS
            // Full fence, after the release above: pairs with an async start's publication of its task, then read of
            // disposingThread (DisposeEndedOrNull). Either we take its task here, or it sees us gone and does not wait.
            Interlocked.Exchange(ref disposeEnded, null)?.TrySetResult(true); // its continuations run asynchronously
        }
    }

    private void DisposeCore()
    {
        if (Volatile.Read(ref disposed) != 0)
            return;
        // Claim the machine slot so no machine can start from now on (TryExecuteStateMachine sees the sentinel).
        VersionSchemeStateMachine? active = Interlocked.CompareExchange(ref currentMachine, DisposedSentinel, null);
        if (active is not null)
        {
            // From inside that machine's own callback, waiting for its Completion would never end: say what works instead.
            if (InCallback())
            {
                ThrowHelper.ThrowInvalidOperation(
                    $"Dispose was called from inside a callback of this scheme's running state machine {active.GetType().Name} " +
                    "(OnEnteringState, AfterEnteringState or GetNextStep): the machine ends only after the callback returns, so the " +
                    "scheme cannot be disposed from there (an exception escaping the callback faults the machine). Dispose it from " +
                    "outside the machine's callbacks, once its Completion has completed.");
            }
            ThrowHelper.ThrowInvalidOperation($"Dispose was called while state machine {active.GetType().Name} is still running; wait for its Completion first.");
        }
        if (ownsEpoch)
        {
            try
            {
                // (Threads stepped aside inside Refresh count as protected: see WaitForStableState.)
                epoch.Dispose();
            }
            catch
            {
                Interlocked.CompareExchange(ref currentMachine, null, DisposedSentinel);
                throw;
            }
        }
        if (Interlocked.Exchange(ref disposed, 1) != 0)
            return;
        // Make every later Enter take the slow path, where it sees the flag (the hot path has no disposed check).
        long s;
        do
        {
            s = Volatile.Read(ref state);
        }
        while (Interlocked.CompareExchange(ref state, s | VersionSchemeState.IntermediateMask, s) != s);
        DisposeMarkedHookForTesting?.Invoke();
        Volatile.Write(ref disposeCompleted, 1); // release: pairs with the acquire at the top of Dispose
    }

    /// <summary>Occupies the machine slot of a disposed scheme.</summary>
    private static readonly VersionSchemeStateMachine DisposedSentinel = new CriticalSectionStateMachine((_, _) => { }, -1);

    /// <summary>
    /// The callbacks of running machines (OnEnteringState, AfterEnteringState, GetNextStep) this thread is inside,
    /// innermost last: a blocking start of another machine of any of their schemes would wait for ever (a callback of one
    /// scheme can run another's step inline, through a drain of an epoch they share), and so would an Enter or Refresh
    /// that waits for a scheme whose critical section is among them, however many other critical sections run inside it.
    /// </summary>
    [ThreadStatic] private static List<CallbackFrame>? t_callbacks;

    /// <summary>On a thread a deep wait handed its step to: the waiter's callbacks, as long as the waiter is inside them
    /// (see <see cref="CallbackContext"/>).</summary>
    [ThreadStatic] private static WaiterCallbacks? t_waiterCallbacks;

    /// <summary>On a waiting thread: the callbacks its waits handed to deep-wait threads, innermost wait last; each wait
    /// expires its own as it ends (<see cref="EndWait"/>).</summary>
    [ThreadStatic] private static List<WaiterCallbacks>? t_handedOff;

    /// <summary>Taken as a wait begins, for <see cref="EndWait"/>.</summary>
    private static int HandedOffMark => t_handedOff?.Count ?? 0;

    /// <summary>
    /// A wait that began at <paramref name="mark"/> ended (returned or threw): the threads it handed its step to no longer
    /// act for it, so they stop refusing what its callbacks held back (an Enter there may wait for this thread now, which
    /// no longer waits for them). They refused it for as long as they drained, and every deep wait inside one callback
    /// added a copy of its frames to this list.
    /// </summary>
    private static void EndWait(int mark)
    {
        if (t_handedOff is { } handedOff && handedOff.Count > mark && !HandedOffCallbacksNeverExpireForTesting)
        {
            for (int i = mark; i < handedOff.Count; i++)
                handedOff[i].Expire();
            handedOff.RemoveRange(mark, handedOff.Count - mark);
        }
    }

    /// <summary>The depth to go back to with <see cref="LeaveCallbacks"/> (idempotent, so a catch and its finally may both
    /// call it) after a callback marked by <see cref="EnterCallback"/>. Allocates nothing: taken before the try.</summary>
    private static int CallbackDepth => t_callbacks?.Count ?? 0;

    /// <summary>Marks this thread as inside a callback of this scheme's running machine (its critical section, if
    /// <paramref name="criticalSection"/>). May allocate, so it may throw: call it inside the try whose handlers go back to
    /// <see cref="CallbackDepth"/>, so that a failure here is handled as the callback's own (outside it, a failure before
    /// OnEnteringState left the step owned and the scheme intermediate for ever).</summary>
    private void EnterCallback(bool criticalSection = false)
    {
        EnterCallbackHookForTesting?.Invoke();
        (t_callbacks ??= new List<CallbackFrame>()).Add(new CallbackFrame(this, criticalSection));
    }

    private static void LeaveCallbacks(int depth)
    {
        List<CallbackFrame>? callbacks = t_callbacks;
        if (callbacks is not null && callbacks.Count > depth)
            callbacks.RemoveRange(depth, callbacks.Count - depth);
    }

    /// <summary>Whether the state is intermediate (a step in flight).</summary>
    private bool InTransition => (Volatile.Read(ref state) & VersionSchemeState.IntermediateMask) != 0;

    /// <summary>Whether this thread is inside a callback of this scheme's running machine (or, on a deep wait's hand-off
    /// thread, its waiter is).</summary>
    private bool InCallback() => Inside(criticalSectionOnly: false);

    /// <summary>Whether this thread is inside this scheme's critical section, at any depth of nested callbacks (or, on a deep
    /// wait's hand-off thread, its waiter is).</summary>
    private bool InCriticalSection() => Inside(criticalSectionOnly: true);

    private bool Inside(bool criticalSectionOnly) =>
        (t_callbacks is { Count: > 0 } callbacks && CallbackFrame.Find(callbacks, this, criticalSectionOnly, callbacks.Count)) ||
        (t_waiterCallbacks is { } waiter && waiter.Holds(this, criticalSectionOnly));

    /// <summary>One callback of a running machine that a thread is inside.</summary>
    private readonly struct CallbackFrame
    {
        internal CallbackFrame(EpochProtectedVersionScheme scheme, bool criticalSection)
        {
            Scheme = scheme;
            CriticalSection = criticalSection;
        }

        internal EpochProtectedVersionScheme Scheme { get; }

        internal bool CriticalSection { get; }

        /// <summary>Whether one of the first <paramref name="count"/> frames is <paramref name="scheme"/>'s (its critical section, if <paramref name="criticalSectionOnly"/>).</summary>
        internal static bool Find(IReadOnlyList<CallbackFrame> frames, EpochProtectedVersionScheme scheme, bool criticalSectionOnly, int count)
        {
            for (int i = 0; i < count; i++)
            {
                if (frames[i].Scheme == scheme && (frames[i].CriticalSection || !criticalSectionOnly))
                    return true;
            }
            return false;
        }
    }

    /// <summary>
    /// The schemes whose callbacks a waiting thread is inside, carried to the thread a deep wait hands its step to
    /// (<see cref="LightEpoch.WaiterContext"/>): that thread runs on the waiter's behalf, so what would be refused inline
    /// (a blocking start from inside one of those callbacks, or an Enter that waits for one of those critical sections,
    /// which would wait for ever) is refused there too, instead of waiting for the waiter, which waits for it. Only while
    /// the waiter is inside them: as it leaves a callback, the hand-off thread stops refusing what that callback held back.
    /// </summary>
    private sealed class CallbackContext : LightEpoch.IWaiterContext
    {
        internal static readonly CallbackContext Instance = new();

        public object? Capture(Action awaited)
        {
            WaiterCallbacks? parent = t_waiterCallbacks; // a hand-off thread that waits deep again hands on its waiter's too
            if (CallbackDepth == 0 && parent is null)
                return null;
            // The waiter waits for a scheme's step (its CompleteStep): in force while that scheme is in transition.
            var captured = new WaiterCallbacks(t_callbacks?.ToArray() ?? Array.Empty<CallbackFrame>(), parent, awaited.Target as EpochProtectedVersionScheme);
            (t_handedOff ??= new List<WaiterCallbacks>()).Add(captured);
            return captured;
        }

        public void Restore(object? context) => t_waiterCallbacks = context as WaiterCallbacks;
    }

    /// <summary>A waiter's callbacks as it handed them off, in force while the scheme whose step it waits for is in
    /// transition, and until the wait that handed them off ends.</summary>
    private sealed class WaiterCallbacks
    {
        private readonly CallbackFrame[] frames;
        private readonly WaiterCallbacks? parent;
        private readonly EpochProtectedVersionScheme? stepping;
        private int expired;

        internal WaiterCallbacks(CallbackFrame[] frames, WaiterCallbacks? parent, EpochProtectedVersionScheme? stepping)
        {
            this.frames = frames;
            this.parent = parent;
            this.stepping = stepping;
        }

        /// <summary>Whether the waiter (or the waiter it took over from) still waits inside a callback of
        /// <paramref name="scheme"/>: its wait has not ended (acquire: pairs with the release in <see cref="Expire"/>) and
        /// the step it waits for has not completed (its scheme is still intermediate: once the step publishes its state, the
        /// waiter's wait ends as soon as it looks, and what runs after it on the hand-off thread no longer acts for it).</summary>
        internal bool Holds(EpochProtectedVersionScheme scheme, bool criticalSectionOnly) =>
            (HandedOffCallbacksNeverExpireForTesting || (Volatile.Read(ref expired) == 0 && (stepping is null || stepping.InTransition))) &&
            (CallbackFrame.Find(frames, scheme, criticalSectionOnly, frames.Length) || (parent is not null && parent.Holds(scheme, criticalSectionOnly)));

        /// <summary>On the waiter: its wait ended (release: after what the wait did).</summary>
        internal void Expire() => Volatile.Write(ref expired, 1);
    }
}
