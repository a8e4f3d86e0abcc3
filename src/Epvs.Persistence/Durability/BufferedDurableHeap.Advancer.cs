using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Diagnostics.CodeAnalysis;
using System.Linq;
using System.Runtime.CompilerServices;
using System.Runtime.InteropServices;
using System.Threading;
using System.Threading.Tasks;
using Epvs;

namespace Epvs.Persistence;

// The advancer: moves the version, writes back the completed version's payloads, persists the frontier, reclaims;
// and Sync, which runs (helps with) the same cycle until the frontier covers the caller's version.
public sealed unsafe partial class BufferedDurableHeap
{
    /// <summary>Bytes kept ready beyond two cycles' demand, for each size class in use (see <see cref="StockAfterCycle"/>): one segment's worth.</summary>
    private const long StockReserveBytes = HeapLayout.SegmentSize;

    /// <summary>How many advance periods a version may run, by default, before threads beginning an operation end it themselves (see <see cref="HelpOldVersion"/> and <see cref="BufferedDurableHeapOptions.MaxVersionAge"/>).</summary>
    internal const double LagBoundPeriods = 1.25;

    /// <summary>How many operations a thread begins between two looks at the current version's age.</summary>
    internal const int LagCheckInterval = 256;

    private readonly object _cycleGate = new();
    private readonly object _waitersGate = new();
    private readonly List<(long Target, TaskCompletionSource Completion)> _waiters = new();

    /// <summary>Set (under <see cref="_waitersGate"/>) when Dispose fails the waiters: a SyncAsync then refuses to wait.</summary>
    private bool _waitersClosed;
    private AdvanceStateMachine? _inflight;
    private long _frontier;
    private Thread? _advancer;
    private TimeSpan _period;

    /// <summary>When the current version began (a <see cref="Now"/> timestamp, written in the transition's critical section).</summary>
    private long _versionStartedAt;

    /// <summary><see cref="BufferedDurableHeapOptions.MaxVersionAge"/> in timestamp ticks; 0 when versions have no age bound (no background advancer, not <see cref="DurabilityMode.Buffered"/>, or no bound asked for).</summary>
    private long _lagBound;

    /// <summary>1 while a thread runs <see cref="HelpOldVersion"/>'s advance.</summary>
    private int _lagHelper;
    private Exception? _advancerFault;
    private long[] _scratch = new long[1024];
    private long[] _sealScratch = new long[1024];
    private long[] _sortScratch = new long[1024];
    private readonly List<long> _largeScratch = new();
    private long _statCycles;
    private long _statBlocks;
    private long _statWriteBackTicks;
    private long _statSealTicks;
    private long _statReclaimTicks;

    /// <summary>Of <see cref="_statWriteBackTicks"/>, the time the cycles waited on their fences (the version's, the frontier's).</summary>
    private long _statFenceTicks;

    /// <summary>Times an operation's thread was held back at its start (see <see cref="ApplyBackPressure"/>); written with Interlocked by any thread.</summary>
    private long _statBackPressureWaits;
    private long _statBackPressureTicks;

    /// <summary>Periods the background advancer found nothing to advance (see <see cref="NothingToAdvance"/>); written under the cycle gate.</summary>
    private long _statIdlePeriods;

    /// <summary>Test hook: how many periods the background advancer has woken for so far (each ran a cycle, or found the heap idle, or failed to).</summary>
    internal long BackgroundPeriodsForTesting => Volatile.Read(ref _backgroundPeriods);

    private long _backgroundPeriods;

    /// <summary>Where the advance cycles have spent their time since the heap opened (see <see cref="AdvancerStatistics"/>).</summary>
    /// <returns>The counters, each read atomically.</returns>
    public AdvancerStatistics GetAdvancerStatistics()
    {
        // Volatile.Read: atomic 64-bit loads; pairs with the Volatile.Write in AfterTransition.
        return new AdvancerStatistics(
            Volatile.Read(ref _statCycles),
            Volatile.Read(ref _statBlocks),
            Stopwatch.GetElapsedTime(0, Volatile.Read(ref _statWriteBackTicks)),
            Stopwatch.GetElapsedTime(0, Volatile.Read(ref _statSealTicks)),
            Stopwatch.GetElapsedTime(0, Volatile.Read(ref _statReclaimTicks)),
            _heap.AllocatorRefills,
            Stopwatch.GetElapsedTime(0, Volatile.Read(ref _statFenceTicks)),
            Volatile.Read(ref _statBackPressureWaits),
            Stopwatch.GetElapsedTime(0, Volatile.Read(ref _statBackPressureTicks)),
            Volatile.Read(ref _statIdlePeriods));
    }

    /// <summary>Test hook: runs in reclamation once the version's frees are handed to the heap (deferred: see <see cref="PersistentHeap.AfterSweepMarkedForTesting"/> for the window in which an early reuse would race the free to the file).</summary>
    internal Action? AfterReclaimMarkedForTesting { get; set; }

    /// <summary>Test hook: with <see cref="DurabilityFaults.PersistFrontierBeforeWriteBack"/>, runs once the broken order has persisted the frontier (the version) and before it writes the version back.</summary>
    internal Action<long>? AfterFrontierPersistedFirstForTesting { get; set; }

    /// <summary>Test hook: runs in a cycle once the version's (the argument's) cut has passed, before its blocks are sealed (in <see cref="DurabilityMode.Buffered"/>, in the pass that writes them back; in <see cref="DurabilityMode.Strict"/> or the broken control's order, after their write-back) and before its frontier is persisted (unless a broken control persists it first).</summary>
    internal Action<long>? BeforeSealForTesting { get; set; }

    /// <summary>Test hook (<see cref="DurabilityMode.Buffered"/>): runs in a cycle once the version (the argument) is sealed, written back and fenced, before its frontier is persisted.</summary>
    internal Action<long>? SealedBeforeTheFrontierForTesting { get; set; }

    /// <summary>Test hook: runs in a hash map update or remove once it holds the key's index slot, before it allocates the new payload (or the anti-payload).</summary>
    internal Action? InsideSlotLockForTesting { get; set; }

    /// <summary>Test hook: runs under the cycle gate as a cycle begins to wait for its version's operations to end.</summary>
    internal Action? WaitingForTheCutForTesting { get; set; }

    /// <summary>Test hook: runs in <see cref="DurableOperation.Replace(PayloadRef, int)"/> when a same-version replace has allocated and filled its copy (with its offset), before it deletes the original.</summary>
    internal Action<long>? AfterReplaceCopiedForTesting { get; set; }

    /// <summary>Test hook: runs in the eager free path (large blocks, anti-payloads) once its blocks are marked free, before the frees are written back: the window in which an early reuse would race the free to the file.</summary>
    internal Action? AfterEagerFreesMarkedForTesting { get; set; }

    /// <summary>
    /// Makes every operation that completed before the call durable: returns once <see cref="DurableFrontier"/> has
    /// reached the version current at the call. Runs the advance itself if needed (it does not wait for the
    /// background period); other threads keep operating meanwhile. Waits at most
    /// <see cref="BufferedDurableHeapOptions.SyncTimeout"/>.
    /// </summary>
    /// <exception cref="InvalidOperationException">The calling thread is inside an operation of this heap (the version
    /// cannot advance until it ends) or of another buffered heap (a thread nesting the two in the other order could
    /// hold this heap's version for ever), or it runs a deferred action of this heap's epoch (<see cref="VersionScheme"/>'s
    /// epoch: the transition may be pending behind that action in the same drain), the heap is
    /// <see cref="DurabilityMode.Transient"/>, the version transition failed, or the advancer failed earlier.</exception>
    /// <exception cref="TimeoutException">Another thread stayed inside an operation for the whole timeout; the message names it.</exception>
    /// <exception cref="System.IO.IOException">The cycle this call ran failed to write the version back (the medium's
    /// error). Nothing of that version or any later one becomes durable in this heap any more: later calls throw
    /// <see cref="InvalidOperationException"/>, and a reopen recovers up to <see cref="DurableFrontier"/>.</exception>
    /// <exception cref="ObjectDisposedException">The heap has been disposed; or Dispose began on another thread while
    /// this call waited, and its last advance could not make the operations durable (when it could, this call returns
    /// normally: as soon as that advance made them durable if it was waiting for the cycle gate, else once Dispose has
    /// completed — a Sync that holds the gate gives it up to Dispose, which closes within its own timeout).</exception>
    public void Sync() => Sync(_syncTimeout);

    /// <summary>Like <see cref="Sync()"/>, with an explicit bound on the wait.</summary>
    /// <param name="timeout">How long to wait at most (up to int.MaxValue milliseconds); <see cref="Timeout.InfiniteTimeSpan"/> to wait for ever.</param>
    /// <exception cref="ArgumentOutOfRangeException"><paramref name="timeout"/> is negative (other than <see cref="Timeout.InfiniteTimeSpan"/>) or longer than int.MaxValue milliseconds.</exception>
    /// <exception cref="InvalidOperationException">See <see cref="Sync()"/>.</exception>
    /// <exception cref="TimeoutException">See <see cref="Sync()"/>.</exception>
    /// <exception cref="System.IO.IOException">See <see cref="Sync()"/>.</exception>
    /// <exception cref="ObjectDisposedException">See <see cref="Sync()"/>.</exception>
    public void Sync(TimeSpan timeout)
    {
        ValidateTimeout(timeout);
        ThrowIfDisposed();
        long target = SyncTarget();
        SyncCore(target, timeout);
    }

    /// <summary>Test hook: runs in <see cref="SyncAsync"/> once it found the heap not disposed, before it reads its target.</summary>
    internal Action? SyncAsyncCheckedForTesting { get; set; }

    /// <summary>Test hook: runs in <see cref="SyncAsync"/> after its wait is registered, before it wakes the advancer.</summary>
    internal Action? SyncAsyncWakingForTesting { get; set; }

    /// <summary>
    /// The asynchronous <see cref="Sync()"/>: completes once every operation that completed before the call is
    /// durable. The background advancer (or, without one, a pool thread) does the work.
    /// </summary>
    /// <param name="cancellationToken">Cancels the wait (not the advance).</param>
    /// <returns>A task that completes when durable, or faults with <see cref="TimeoutException"/> after
    /// <see cref="BufferedDurableHeapOptions.SyncTimeout"/>. A Dispose on another thread meanwhile completes it with its last
    /// advance (which covers every operation completed before the Dispose), or faults it with
    /// <see cref="ObjectDisposedException"/> when that advance failed or could not run.</returns>
    /// <exception cref="InvalidOperationException">The calling thread is inside an operation of this heap or of another
    /// buffered heap (as for <see cref="Sync()"/>: the task could not complete before the operation ends, so a caller
    /// that waited for it there would wait for ever; end the operation first), the heap is
    /// <see cref="DurabilityMode.Transient"/>, or the advancer failed.</exception>
    /// <exception cref="ObjectDisposedException">The heap has been disposed.</exception>
    public Task SyncAsync(CancellationToken cancellationToken = default)
    {
        ThrowIfDisposed();
        SyncAsyncCheckedForTesting?.Invoke();
        ThrowIfProtected(nameof(SyncAsync));
        RefuseWaitInsideAnotherHeapsOperation(nameof(SyncAsync));

        // Refused on a transient heap whatever the token (a canceled one used to give a canceled task there).
        long target = SyncTarget();
        if (cancellationToken.IsCancellationRequested)
        {
            // Canceled whatever the state (it used to complete when nothing was pending and a background advancer ran).
            return Task.FromCanceled(cancellationToken);
        }

        if (Frontier >= target)
        {
            return Task.CompletedTask;
        }

        var completion = new TaskCompletionSource(TaskCreationOptions.RunContinuationsAsynchronously);
        using (InterruptShield.Hold(_waitersGate))
        {
            if (Frontier >= target)
            {
                return Task.CompletedTask;
            }

            // After a failed cycle the background advancer has stopped (or is stopping) and nobody would complete the
            // wait. Read under the gate: a failure is recorded before FailWaiters takes it, so a wait added before that
            // is failed there, and one added after sees the failure here.
            if (_advancerFault is { } fault)
            {
                ThrowHelper.ThrowInvalidOperation($"The heap's advancer failed, so nothing more can become durable: {fault.Message}", fault);
            }

            // Dispose failed the waiters already (this call passed its disposed check before Dispose began): nothing
            // would complete a wait added now (with an infinite SyncTimeout it hung).
            if (_waitersClosed)
            {
                ThrowHelper.ThrowObjectDisposed(this);
            }

            _waiters.Add((target, completion));

            // Held strongly while a SyncAsync waits: its task may be all that references the heap, and the advancer holds
            // the heap only weakly between cycles (a heap collected before the cycle that completes the task left it
            // pending for ever).
            _link.Pinned = this;
        }

        if (_advancer is not null)
        {
            SyncAsyncWakingForTesting?.Invoke();
            try
            {
                _wake.Set();
            }
            catch (ObjectDisposedException)
            {
                // A Dispose stopped the advancer since the check above (and disposed its event). The waiter was added
                // before Dispose closed the waiters, so Dispose's last advance completes it, or Dispose fails it: the task
                // reports what happened (it used to throw ObjectDisposedException even when that advance made the
                // operations durable).
            }
        }
        else
        {
            Task.Run(() =>
            {
                try
                {
                    SyncCore(target, _syncTimeout);
                }
                catch (Exception e)
                {
                    completion.TrySetException(e);
                }
            });
        }

        return WaitWithTimeout(completion.Task, target, cancellationToken);
    }

    /// <summary>
    /// Runs one advance on the calling thread: moves the version from v to v + 1 (waiting for the operations of v to
    /// end), writes back v's payloads, persists frontier v and reclaims what became free. Normally the background
    /// advancer does this; call it to drive versions by hand (with <see cref="BufferedDurableHeapOptions.AdvancePeriod"/>
    /// set to <see cref="Timeout.InfiniteTimeSpan"/>).
    /// </summary>
    /// <param name="timeout">How long to wait for operations of v to end (up to int.MaxValue milliseconds, or <see cref="Timeout.InfiniteTimeSpan"/>).</param>
    /// <returns>The new durable frontier (<see cref="DurableFrontier"/>: 0 on a <see cref="DurabilityMode.Transient"/> heap).</returns>
    /// <exception cref="ArgumentOutOfRangeException"><paramref name="timeout"/> is negative (other than <see cref="Timeout.InfiniteTimeSpan"/>) or longer than int.MaxValue milliseconds.</exception>
    /// <exception cref="InvalidOperationException">The calling thread is inside an operation of this heap or of another
    /// buffered heap, or runs a deferred action of this heap's epoch (see <see cref="Sync()"/>). Or: the heap's version
    /// space is used up (2^42 versions less those kept for opens: see the README's limits), so no version begins.</exception>
    /// <exception cref="TimeoutException">Another thread stayed inside an operation for the whole timeout.</exception>
    /// <exception cref="ObjectDisposedException">The heap has been disposed, or Dispose began on another thread while
    /// this call waited for the operations of v to end (Dispose's last advance then completes it or reports why not).</exception>
    public long AdvanceVersion(TimeSpan timeout)
    {
        ValidateTimeout(timeout);
        ThrowIfDisposed();
        ThrowIfProtected(nameof(AdvanceVersion));
        ThrowIfDraining(nameof(AdvanceVersion));
        RefuseWaitInsideAnotherHeapsOperation(nameof(AdvanceVersion));
        if (VersionSpaceExhausted)
        {
            ThrowHelper.ThrowInvalidOperation(ExhaustedVersionSpaceMessage(CurrentVersion));
        }

        RunCycle(long.MaxValue, Deadline(timeout), timeout);
        return DurableFrontier;
    }

    /// <summary>The background advancer's thread, null without one (tests: it stops after a failure).</summary>
    internal Thread? AdvancerForTesting => _advancer;

    /// <summary>Test hook: runs in a thread's backlog back-pressure after its disposed check, before it runs advance cycles.</summary>
    internal Action? BeforeBackPressureCyclesForTesting { get; set; }

    /// <summary>Test hook: runs in Dispose once its own last cycles are done, before it waits for operations and unmaps.</summary>
    internal Action? AfterDisposeClosedCyclesForTesting { get; set; }

    /// <summary>Test hook: replaces <see cref="Stopwatch.GetTimestamp"/> as the clock that dates versions for the lag bound.</summary>
    internal Func<long>? ClockForTesting { get; set; }

    /// <summary>
    /// Called by <see cref="AdvanceStateMachine"/> in the critical section: checks that the transition starts where the
    /// heap's last one ended, dates the new version, and makes sure the persisted clock covers it. Each cycle persists
    /// the clock of the next transition with its frontier (see <see cref="PersistFrontier"/>), so the clock is persisted
    /// here only in the first transition after the heap opened: a persist through the page cache is a pwrite and an
    /// fdatasync, which every thread beginning an operation waited for (1–2 ms on average, up to 250 ms behind another
    /// fdatasync, under two writers).
    /// </summary>
    /// <exception cref="InvalidOperationException">A state machine the heap did not run (on the public
    /// <see cref="VersionScheme"/>) advanced the version since the heap's last transition: the versions it ended were
    /// never written back (their buffers wait in slots no cycle drains in time), and a frontier persisted now would
    /// claim them durable. The transition fails, which the cycle records as the advancer's fault.</exception>
    internal void PersistClockInCriticalSection(long fromSchemeVersion, long schemeVersion)
    {
        // On whichever thread steps the machine (a writer entering, a Sync): an interrupt must not fail the transition.
        using InterruptShield.Scope shield = InterruptShield.Enter();
        // Plain read: written only in the heap's critical sections, which the scheme runs one at a time, each ordered
        // after the previous one by the scheme's interlocked step protocol.
        if (fromSchemeVersion != _schemeVersion && (_faults & DurabilityFaults.AllowForeignTransitions) == 0)
        {
            ThrowForeignTransition(fromSchemeVersion);
        }

        // Volatile.Write: atomic 64-bit store; read without the cycle gate by HelpOldVersion.
        Volatile.Write(ref _versionStartedAt, Now());
        long version = _versionBase + schemeVersion;
        // Volatile.Read/Write: written here and by PersistFrontier (under the cycle gate); the transitions and cycles are
        // ordered (a cycle persists its frontier before the next transition starts), the volatile accesses make each
        // write visible to the next reader on whichever thread runs the next critical section.
        if (_mode != DurabilityMode.Transient && version > Volatile.Read(ref _persistedClock) && (_faults & DurabilityFaults.ClockLeftBehind) == 0)
        {
            // Before any operation of the version can write a tag of it: recovery starts new versions above the clock.
            _heap.File.EpochClock = version;
            Volatile.Write(ref _persistedClock, version);
            ClockPersistsInTransitionsForTesting++;
        }

        VersionBeginsForTesting?.Invoke(version);
        InsideCriticalSectionForTesting?.Invoke();
        _schemeVersion = schemeVersion;
        EndedVersion(version - 1);
    }

    /// <summary>The clock this heap last persisted (0 before any): the critical section persists it again only for a version above it.</summary>
    private long _persistedClock;

    /// <summary>How many transitions' critical sections persisted the clock (tests; written in critical sections only).</summary>
    internal int ClockPersistsInTransitionsForTesting { get; private set; }

    /// <summary>
    /// Persists <paramref name="frontier"/> (its version written back, sealed and fenced) and, in the same write-back
    /// and fence, the clock of the next transition (frontier + 2: the current version is frontier + 1), so that the
    /// transition's critical section need not persist anything. A crash may leave either word without the other: the
    /// frontier without the clock leaves the clock at frontier + 1 (the previous cycle's) or above, and the clock without
    /// the frontier leaves frontier − 1 and clock − 2 = frontier; recovery's cut, max(frontier, clock − 2), is this
    /// frontier or the previous one, both written back whole, and its first version lies above every tag on the file.
    /// </summary>
    private void PersistFrontier(long frontier)
    {
        long clock = (_faults & DurabilityFaults.ClockLeftBehind) != 0 ? frontier + 1 : frontier + 2;
        long started = Stopwatch.GetTimestamp();
        _heap.File.PersistFrontierAndClock(frontier, clock);
        _cycleFenceTicks += Stopwatch.GetTimestamp() - started;
        Volatile.Write(ref _persistedClock, Math.Max(Volatile.Read(ref _persistedClock), clock));
    }

    /// <summary>The scheme version the heap's last transition moved to (the scheme's first version before any): see <see cref="PersistClockInCriticalSection"/>.</summary>
    private long _schemeVersion;

    [DoesNotReturn]
    private void ThrowForeignTransition(long fromSchemeVersion) =>
        ThrowHelper.ThrowInvalidOperation($"The heap's version scheme was advanced from version {_versionBase + _schemeVersion} to {_versionBase + fromSchemeVersion} by a state machine the heap did not run (BufferedDurableHeap.VersionScheme is for diagnostics: do not run state machines on it). The operations of the versions it ended were never written back, so nothing more can become durable in this heap: dispose it and reopen the file (recovery keeps every version up to DurableFrontier, {DurableFrontier}).");

    /// <summary>
    /// At the start of the cycle that writes back <paramref name="completed"/>, after its cut: no thread may still be
    /// inside an operation of that version or an older one. One can only if its region ended under it (the operation's
    /// thread called Refresh or Leave on the public <see cref="VersionScheme"/>): whatever it writes from then on is
    /// tagged with a version this cycle declares durable without it, and it appends to buffers this cycle drains.
    /// </summary>
    /// <exception cref="InvalidOperationException">Such an operation is open; the cycle fails before it writes anything
    /// back (the advancer's fault).</exception>
    private void CheckNoOperationOutlivedItsCut(long completed)
    {
        if ((_faults & DurabilityFaults.IgnoreOperationsPastTheirCut) != 0)
        {
            return;
        }

        // Volatile.Read: acquire; pairs with the release in RegisterThread.
        foreach (ThreadBuffers buffers in Volatile.Read(ref _registry))
        {
            // Volatile.Read: acquire; pairs with the release stores in ThreadBuffers.OpenOperation/CloseOperation.
            long open = Volatile.Read(ref buffers.OpenVersion);
            if (open <= completed)
            {
                ThrowHelper.ThrowInvalidOperation($"Thread {buffers.ManagedThreadId} is still inside an operation of version {open}, whose cut has passed: its protected region ended inside the operation (Refresh or Leave called on BufferedDurableHeap.VersionScheme, which is for diagnostics only), so what it writes from then on could never be made durable. Nothing more becomes durable in this heap: dispose it and reopen the file (recovery keeps every version up to DurableFrontier, {DurableFrontier}).");
            }
        }
    }

    /// <summary>Test hook: runs at the end of the transition's critical section (after the clock is persisted); a throw is a fault of the critical section.</summary>
    internal Action? InsideCriticalSectionForTesting { get; set; }

    /// <summary>Test hook: runs in the transition's critical section with the version that begins, once the clock covers it.</summary>
    internal Action<long>? VersionBeginsForTesting { get; set; }

    /// <summary>
    /// Back-pressure on the durability lag: when the current version has run for longer than
    /// <see cref="BufferedDurableHeapOptions.MaxVersionAge"/>, the advancer has fallen behind (its cycles take longer than a period, so each version grows and
    /// takes longer to write back). The calling thread then runs the advance that ends the version — after the one in
    /// progress, unless that one already covered it — instead of adding to it, so writers faster than the advancer
    /// slow down towards its pace and the lag stays bounded. Costs nothing while cycles keep to the period.
    /// </summary>
    private void HelpOldVersion()
    {
        long bound = _lagBound;
        // Volatile.Read: a fresh look (a stale one only costs a wait). A transition in flight waits for a
        // thread still inside an operation of the old version, which no help can hurry; after a failed cycle nothing
        // more becomes durable (Sync and the advancer report it).
        if (bound == 0 || Volatile.Read(ref _inflight) is not null || _advancerFault is not null)
        {
            return;
        }

        // The version first: a transition between the two reads then makes the version look young (no help), never an
        // old one look older.
        long version = CurrentVersion;
        // Volatile.Read: atomic 64-bit load; pairs with the Volatile.Write in PersistClockInCriticalSection.
        long age = Now() - Volatile.Read(ref _versionStartedAt);
        if (age <= bound)
        {
            return;
        }

        long started = Stopwatch.GetTimestamp();
        try
        {
            EndOrAwait(version);
        }
        finally
        {
            CountBackPressure(started);
        }
    }

    /// <summary><see cref="HelpOldVersion"/> once <paramref name="version"/> is older than the bound: ends it, or waits while another thread does.</summary>
    private void EndOrAwait(long version)
    {
        // One helper at a time; the others wait until the old version has ended too (not for the helper's whole cycle),
        // so that the lag stays bounded instead of growing with the overload (more writers than the advancer keeps up
        // with). They used to carry on writing into the old version up to twice the bound, and under two full-speed
        // writers through the page cache Sync's median was about 3.8 periods and the lag's p99 about 3.4, against
        // about 1.6 and 2.4-2.9 with every writer waiting (benchmark --lag-writers 2), at no throughput the benchmark
        // could tell apart. A background advancer that keeps to its period never lets a version reach the bound.
        // The helper itself waits until the version is durable (its own cycle, or the one holding the gate), which holds
        // one writer for a write-back: letting it go once the version had ended (tried: 10612b1) gave two full-speed
        // writers 4-7 % more upserts but a lag p99 of 3.5-3.6 periods instead of 2.9 and Sync's median past 2 periods
        // (benchmark/RESULTS.md, "Tried and reverted").
        if (Interlocked.CompareExchange(ref _lagHelper, 1, 0) != 0)
        {
            if ((_faults & DurabilityFaults.OnlyTheHelperWaits) == 0)
            {
                WaitForTheVersionToEnd(version);
            }

            return;
        }

        try
        {
            ThrowIfDisposed();
            // Bounded as the background advancer bounds its own cycles, not by the Sync timeout: a thread that stays
            // inside an operation holds the transition, and this thread only offered help.
            TimeSpan wait = HelpWait();
            RunCycle(version, Deadline(wait), wait);
        }
        catch (TimeoutException)
        {
            // Another thread stays inside an operation: the version cannot end now; carry on.
        }
        catch (Exception e) when (e is InvalidOperationException or System.IO.IOException or ObjectDisposedException)
        {
            // The cycle failed (recorded for Sync and the advancer, which report it) or the heap is being disposed (the
            // operation's own check reports that): the help was an offer, the operation goes on or fails on its own.
        }
        finally
        {
            // Volatile.Write: release; the next helper's compare-exchange sees it.
            Volatile.Write(ref _lagHelper, 0);
            WakeVersionWaiters();
        }
    }

    /// <summary>
    /// Waits (at most <see cref="HelpWait"/>) until <paramref name="version"/> has ended — the helper's transition moved
    /// past it — or the helper gave up. Not for the rest of the helper's cycle (write-back, seal, reclamation), nor for
    /// a cycle of the background advancer that the helper waits for first: the version then ends as soon as it can, and
    /// the writers add to the next one meanwhile, as they do while the background advancer writes a version back. (They
    /// used to wait for the cycle gate: under two writers through the page cache one core sat idle for 10–25 ms several
    /// times a second.)
    /// </summary>
    private void WaitForTheVersionToEnd(long version)
    {
        long deadline = Deadline(HelpWait());
        using (InterruptShield.Hold(_versionWaitGate))
        {
            // Volatile.Read: written before the pulse, under this lock (EndedVersion, WakeVersionWaiters).
            while (Volatile.Read(ref _lastEndedVersion) < version && Volatile.Read(ref _lagHelper) != 0 && _advancerFault is null)
            {
                TimeSpan left = Remaining(deadline);
                if (left == TimeSpan.Zero)
                {
                    return;
                }

                Monitor.Wait(_versionWaitGate, left);
            }
        }
    }

    /// <summary>In the transition's critical section: <paramref name="ended"/> is over; wakes the writers waiting for it.</summary>
    private void EndedVersion(long ended)
    {
        Volatile.Write(ref _lastEndedVersion, ended);
        WakeVersionWaiters();
    }

    private void WakeVersionWaiters()
    {
        using (InterruptShield.Hold(_versionWaitGate))
        {
            Monitor.PulseAll(_versionWaitGate);
        }
    }

    private readonly object _versionWaitGate = new();

    /// <summary>The last version whose transition has begun (its successor began): see <see cref="WaitForTheVersionToEnd"/>.</summary>
    private long _lastEndedVersion;

    /// <summary>The gate advance cycles run under (tests hold it to stand for a long cycle).</summary>
    internal object CycleGateForTesting => _cycleGate;

    /// <summary>Test hook: marks a thread as helping (see <see cref="HelpOldVersion"/>), as if one were running a cycle.</summary>
    internal void SetHelperForTesting(bool helping)
    {
        Volatile.Write(ref _lagHelper, helping ? 1 : 0);
        WakeVersionWaiters();
    }

    /// <summary>How long the background advancer, or a thread helping it, waits for a cycle: five periods, at least 100 ms.</summary>
    /// <remarks>Capped at what <see cref="Monitor.TryEnter(object, TimeSpan)"/> takes (about 24.8 days), since a valid period may be longer than a fifth of that.</remarks>
    private TimeSpan HelpWait() => TimeSpan.FromMilliseconds(Math.Min(int.MaxValue, Math.Max(100, _period.TotalMilliseconds * 5)));

    private long Now() => ClockForTesting is { } clock ? clock() : Stopwatch.GetTimestamp();

    private long SyncTarget()
    {
        if (_mode == DurabilityMode.Transient)
        {
            ThrowHelper.ThrowInvalidOperation("Sync on a transient heap: nothing is ever durable in DurabilityMode.Transient. Open the heap with DurabilityMode.Buffered.");
        }

        // Every operation that completed before this call observed a version at or below the current one (and at or
        // below the last writable one: none begins past it, and no version ends after it).
        long current = WritableAtMost(CurrentVersion);
        return (_faults & DurabilityFaults.SyncBeforeFrontierCovers) != 0 ? current - 1 : current;
    }

    private void SyncCore(long target, TimeSpan timeout, string caller = nameof(Sync))
    {
        ThrowIfProtected(caller);
        if (caller != nameof(Dispose))
        {
            // (Dispose checked for itself before it changed anything.)
            ThrowIfDraining(caller);
            RefuseWaitInsideAnotherHeapsOperation(caller);
        }

        // No operation writes past the last writable version, and no version ends after it (Dispose asks for the current
        // version): its frontier is the last there will be.
        target = WritableAtMost(target);

        long deadline = Deadline(timeout);
        while (Frontier < target)
        {
            // (Failed for a thread that exited inside an operation: the cycle may still write back a version whose cut came.)
            // Volatile.Read: acquire; pairs with the recording CAS (see IsExitedFault).
            if (Volatile.Read(ref _advancerFault) is { } fault && !IsExitedFault(fault))
            {
                ThrowHelper.ThrowInvalidOperation($"The heap's advancer failed, so nothing more can become durable: {fault.Message}", fault);
            }

            try
            {
                // Helping: run the cycle here rather than wait for the background period. The gate serializes it with
                // the background advancer; whoever holds it moves the frontier for both.
                RunCycle(target, deadline, timeout);
            }
            catch (ObjectDisposedException) when (Volatile.Read(ref _disposed) != 0 && Volatile.Read(ref _disposingThread) != Environment.CurrentManagedThreadId && (_faults & DurabilityFaults.SyncWaitsThroughDispose) == 0)
            {
                // Dispose began (and took the cycles over, or made this wait give up): its last advance makes durable
                // what it can. This call's outcome is that one: wait for Dispose (within this call's timeout).
                if ((_faults & DurabilityFaults.SyncFailsWhenDisposeOvertakesIt) != 0)
                {
                    throw;
                }

                WaitForDisposeToDecide(target, deadline, timeout);
                return;
            }
        }
    }

    /// <summary>
    /// A Sync that Dispose overtook: returns once Dispose has completed and the frontier covers
    /// <paramref name="target"/> (Dispose's last advance made it durable); otherwise throws.
    /// </summary>
    /// <exception cref="TimeoutException">Dispose did not complete within the Sync's timeout.</exception>
    /// <exception cref="ObjectDisposedException">The heap closed before <paramref name="target"/> became durable.</exception>
    private void WaitForDisposeToDecide(long target, long deadline, TimeSpan timeout)
    {
        while (!_disposal.TryWaitForCompletion(Remaining(deadline)))
        {
            if (Remaining(deadline) == TimeSpan.Zero)
            {
                ThrowSyncTimeout(target, timeout, FailIfAThreadExitedInsideAnOperation());
            }
        }

        if (Frontier < target)
        {
            throw new ObjectDisposedException(nameof(BufferedDurableHeap), $"The heap was disposed before version {target} became durable (the durable frontier is {DurableFrontier}): Dispose's last advance could not make it durable, and its exception says why.");
        }
    }

    /// <summary>One advance cycle under the cycle gate, unless the frontier covers <paramref name="target"/> by then: ends the current version, writes it back and persists the frontier (see <see cref="AfterTransition"/>).</summary>
    /// <param name="target">The version to make durable (long.MaxValue: the current one, whichever it is).</param>
    /// <param name="deadline">When the wait for the version's operations to end gives up.</param>
    /// <param name="timeout">The timeout that deadline stands for (for the messages).</param>
    /// <param name="unlessIdle">The background advancer's period: nothing is done when the heap is idle (<see cref="NothingToAdvance"/>).</param>
    private void RunCycle(long target, long deadline, TimeSpan timeout, bool unlessIdle = false)
    {
        if (!EnterCycleGate(target, deadline, timeout))
        {
            // Another thread's cycle made the target durable while this one waited for the gate.
            return;
        }

        try
        {
            // Volatile.Read: pairs with the Volatile.Write in Dispose.
            int disposing = Volatile.Read(ref _disposingThread);
            if (disposing != 0 && disposing != Environment.CurrentManagedThreadId)
            {
                ThrowHelper.ThrowObjectDisposed(this);
            }

            if (Frontier >= target)
            {
                return;
            }

            // Volatile.Read: acquire; pairs with the recording CAS (see IsExitedFault).
            if (Volatile.Read(ref _advancerFault) is { } earlier)
            {
                // A thread exited inside an operation: a transition whose cut came before it is still written back (every
                // operation of that version ended; the exited one is in a later version), so the frontier covers it.
                if (IsExitedFault(earlier) && FinishACutThatCame() && Frontier >= target)
                {
                    return;
                }

                // A cycle failed after its transition: that version's write-back is incomplete, so no later version
                // may be covered by the frontier (it would cover the incomplete one too).
                ThrowHelper.ThrowInvalidOperation($"The heap's advancer failed, so nothing more can become durable: {earlier.Message}", earlier);
            }

            if (_inflight is null && VersionSpaceExhausted)
            {
                // The last writable version has ended (its cycle made it durable): no operation writes in the current
                // one, and the versions left are the opens' (HeapLayout.VersionHeadroom). Nothing to advance.
                return;
            }

            if (unlessIdle && _inflight is null && NothingToAdvance())
            {
                // Idle: the version stays, nothing is written to the file. Dated afresh, so that the first operation after an
                // idle stretch does not find its version old and end it itself (HelpOldVersion): it is ended at the next
                // period, as if it had begun now (no operation began in it before: none was open, none wrote).
                if ((_faults & DurabilityFaults.IdleWithoutRedating) == 0)
                {
                    Volatile.Write(ref _versionStartedAt, Now());
                }

                // Volatile.Write: atomic 64-bit store for GetAdvancerStatistics; written under the cycle gate only.
                Volatile.Write(ref _statIdlePeriods, _statIdlePeriods + 1);
                return;
            }

            AdvanceStateMachine machine;
            try
            {
                machine = _inflight ??= StartTransition(deadline, target, timeout);
            }
            catch (ObjectDisposedException e) when (Volatile.Read(ref _disposed) == 0 || disposing == Environment.CurrentManagedThreadId)
            {
                // The version scheme, or its epoch, was disposed under the heap (through the public VersionScheme): no
                // version can ever end again (a scheme whose epoch is disposed refuses to start a transition).
                // Volatile.Read: pairs with the exchange in Dispose, whose own disposal of the scheme comes later (so in
                // the last advance of Dispose, on its thread, the scheme can only have been disposed under the heap: it
                // used to reach Dispose's caller as the scheme's bare ObjectDisposedException).
                var failed = new InvalidOperationException(SchemeDisposedUnderHeap, e);
                RecordBackgroundFault(failed);
                throw failed;
            }

            bool done;
            try
            {
                // Not on Dispose's own thread: a Sync elsewhere stops waiting once Dispose begins (see _cycleWaitsEnd), or
                // once the heap fails for a thread that exited inside an operation (the version can never end then).
                WaitingForTheCutForTesting?.Invoke();
                done = WaitForTheCut(machine.Completion, deadline, disposing == 0 ? _cycleWaitsEnd.Token : CancellationToken.None);
            }
            catch (AggregateException)
            {
                done = true;
            }
            catch (OperationCanceledException) when (Volatile.Read(ref _disposed) == 0 && _advancerFault is { } failed)
            {
                // Volatile.Read: pairs with the exchange in Dispose. The heap failed (a thread exited inside an operation):
                // left in flight for good; the waiter gets the reason, as a SyncAsync does.
                throw new InvalidOperationException($"The heap's advancer failed, so nothing more can become durable: {failed.Message}", failed);
            }
            catch (OperationCanceledException)
            {
                // Left in flight, as after a timeout: Dispose's last advance completes it, within its own timeout (a Sync
                // then waits for that outcome: see SyncCore).
                throw new ObjectDisposedException(nameof(BufferedDurableHeap), "The heap is being disposed: this wait for the version's operations to end was given up; Dispose's last advance completes the version or reports why not.");
            }

            if (!done)
            {
                // Left in flight: the next cycle (or the operation that finally ends) completes it. Unless a thread exited
                // inside an operation: the heap fails then (the background advancer looks here every period).
                ThrowSyncTimeout(target, timeout, FailIfAThreadExitedInsideAnOperation());
            }

            _inflight = null;
            if (machine.Fault is { } fault)
            {
                // A fault of the critical section (the clock's persist, typically) is the advancer's like any other: the
                // scheme stays at the old version, but what of the section reached the file is unknown, so no later cycle
                // may run as if nothing happened (it used to be thrown here once and forgotten; a helping thread's cycle
                // swallowed it). Recorded under the gate, as below.
                var failed = new InvalidOperationException($"The version transition failed: {fault.Message}", fault);
                if ((_faults & DurabilityFaults.ForgetTransitionFaults) == 0)
                {
                    RecordBackgroundFault(failed);
                }

                throw failed;
            }

            try
            {
                // On the caller's thread too (a Sync, back-pressure): a thread interrupted inside it left the write-back
                // half done, which failed the heap for good; its waits now absorb the interrupt (see InterruptShield).
                using InterruptShield.Scope shield = InterruptShield.Enter();
                AfterTransition(Volatile.Read(ref _versionBase) + machine.ActualToVersion - 1);
            }
            catch (Exception e)
            {
                // Recorded under the gate before anyone else can start a cycle: see the check above.
                RecordBackgroundFault(e);
                throw;
            }
        }
        finally
        {
            ExitCycleGate();
        }
    }

    /// <summary>
    /// Under the cycle gate, with no transition in flight: whether a cycle now would find nothing to write back, seal,
    /// reclaim, mark or forget, and no one waiting for it — it would only move the version and write the frontier and
    /// the sealed frontier back again, with two fences (through the page cache, two <c>pwrite</c> and two <c>fdatasync</c>
    /// calls: an idle heap made 100 of each a second at the default period). The background advancer then lets the
    /// version run on. What recovery keeps is the same either way: no operation wrote in it.
    /// </summary>
    /// <remarks>
    /// Racing operations can only be left to the next period, never lost: no transition starts without the cycle gate,
    /// which the caller holds, so whatever a look misses stays in the current version's lists for a later cycle. A look
    /// misses little: an operation open now shows in its thread's <see cref="ThreadBuffers.OpenVersion"/>, and one that
    /// ended before the look appended to its lists before that field's release store, which the acquire here reads (a
    /// Strict operation whose write-back failed carries its payloads after it, but they are in its version's list too).
    /// </remarks>
    private bool NothingToAdvance()
    {
        if ((_faults & DurabilityFaults.AdvanceWhenIdle) != 0)
        {
            return false;
        }

        bool pendingWorkIgnored = (_faults & DurabilityFaults.IdleWithWorkPending) != 0;
        bool exitedThreadsIgnored = (_faults & DurabilityFaults.IdleWithExitedThreads) != 0;
        // Volatile.Read: acquire; pairs with the release in RegisterThread.
        foreach (ThreadBuffers buffers in Volatile.Read(ref _registry))
        {
            // Volatile.Read: acquire; pairs with the release stores in ThreadBuffers.OpenOperation/CloseOperation.
            if (Volatile.Read(ref buffers.OpenVersion) != long.MaxValue || (!pendingWorkIgnored && !buffers.IsDrained))
            {
                return false;
            }

            // An exited thread is forgotten by a cycle (ForgetExitedThreads), which hands its allocation cache back.
            if (!exitedThreadsIgnored && !buffers.Owner.IsAlive)
            {
                return false;
            }
        }

        if (!pendingWorkIgnored)
        {
            using (InterruptShield.Hold(_waitersGate))
            {
                if (_waiters.Count != 0)
                {
                    return false;
                }
            }

            using (InterruptShield.Hold(_strictCarried))
            {
                if (_strictCarried.Count != 0)
                {
                    return false;
                }
            }
        }

        // A sweep since the last cycle: the next cycle writes its mark (a Transient heap's cycles write none).
        bool sweepMarked = _mode == DurabilityMode.Transient || (_faults & DurabilityFaults.IdleWithSweepUnmarked) != 0 || _heap.SweepLogMarkIsCurrent;
        return sweepMarked && (exitedThreadsIgnored || !_heap.HasExitedThreadCaches);
    }

    /// <summary>
    /// Takes the cycle gate for a cycle towards <paramref name="target"/>; or returns false, without it, once the durable
    /// frontier covers the target while another thread holds the gate.
    /// </summary>
    /// <remarks>
    /// A thread that only waited for the gate used to wait for it alone, although the cycle running (or the next one)
    /// could make its target durable: a Sync whose version the background advancer had written back 10 ms after the call
    /// still waited, because a monitor is not fair and an advancer behind its schedule takes the gate again at once, cycle
    /// after cycle. Through the page cache, Sync's p99 was 8.6–10.2 periods under two full-speed writers and 2.2–3.6
    /// under one (benchmark/RESULTS.md). Now the wait ends at whichever comes first: the gate released (<see cref="ExitCycleGate"/>) or the frontier at the
    /// target (<see cref="CompleteWaiters"/>).
    /// </remarks>
    /// <exception cref="TimeoutException">Neither came before <paramref name="deadline"/>.</exception>
    private bool EnterCycleGate(long target, long deadline, TimeSpan timeout)
    {
        if ((_faults & DurabilityFaults.WaitForTheCycleGateAlone) != 0)
        {
            // The broken control: the gate or the deadline (as before).
            WaitingForTheCycleGateForTesting?.Invoke();
            if (!Monitor.TryEnter(_cycleGate, Remaining(deadline)))
            {
                ThrowSyncTimeout(target, timeout, FailIfAThreadExitedInsideAnOperation());
            }

            return true;
        }

        while (true)
        {
            // Read before the try: a release after a failed try counts, so the wait below sees it and tries again.
            // (Volatile.Read: pairs with the increment under the signal's lock in ExitCycleGate.)
            long releases = Volatile.Read(ref _cycleGateReleases);
            if (Monitor.TryEnter(_cycleGate))
            {
                return true;
            }

            if (Frontier >= target)
            {
                return false;
            }

            WaitingForTheCycleGateForTesting?.Invoke();
            bool timedOut = false;
            using (InterruptShield.Hold(_cycleGateSignal))
            {
                // Both conditions read under the signal's lock, which the release and the frontier's pulse take: no
                // wake-up is lost between the reads and the wait.
                while (Volatile.Read(ref _cycleGateReleases) == releases && Frontier < target)
                {
                    TimeSpan left = Remaining(deadline);
                    if (left == TimeSpan.Zero)
                    {
                        timedOut = true;
                        break;
                    }

                    InterruptShield.Wait(_cycleGateSignal, left);
                }
            }

            if (timedOut)
            {
                ThrowSyncTimeout(target, timeout, FailIfAThreadExitedInsideAnOperation());
            }
        }
    }

    /// <summary>Releases the cycle gate and wakes the threads waiting for it in <see cref="EnterCycleGate"/>.</summary>
    private void ExitCycleGate()
    {
        Monitor.Exit(_cycleGate);
        // In a shield: an interrupt while it takes the signal's lock must not lose the wake-up (the waiters would wait
        // until their deadlines); the outermost shield requests the interrupt again.
        using (InterruptShield.Enter())
        {
            WakeCycleGateWaiters(released: true);
        }
    }

    /// <summary>Wakes the threads in <see cref="EnterCycleGate"/>: the gate was released, or the frontier moved.</summary>
    private void WakeCycleGateWaiters(bool released)
    {
        using (InterruptShield.Hold(_cycleGateSignal))
        {
            if (released)
            {
                Volatile.Write(ref _cycleGateReleases, _cycleGateReleases + 1);
            }

            Monitor.PulseAll(_cycleGateSignal);
        }
    }

    private readonly object _cycleGateSignal = new();

    /// <summary>How many times the cycle gate was released through <see cref="ExitCycleGate"/> (written under <see cref="_cycleGateSignal"/>).</summary>
    private long _cycleGateReleases;

    /// <summary>Test hook: runs in a cycle right after its frontier moved and its waiters were woken, before its reclamation.</summary>
    internal Action<long>? FrontierMovedForTesting { get; set; }

    /// <summary>Test hook: runs on a thread about to wait for the cycle gate, held by another thread (see <see cref="EnterCycleGate"/>).</summary>
    internal Action? WaitingForTheCycleGateForTesting { get; set; }

    private AdvanceStateMachine StartTransition(long deadline, long target, TimeSpan timeout)
    {
        var spinner = new SpinWait();
        while (true)
        {
            var machine = new AdvanceStateMachine(this);
            StateMachineExecutionStatus status = _scheme.TryExecuteStateMachine(machine);
            if (status == StateMachineExecutionStatus.Ok)
            {
                return machine;
            }

            // Retry: a machine someone else started on the scheme (the heap's own machines run under the gate).
            if (Remaining(deadline) == TimeSpan.Zero)
            {
                ThrowSyncTimeout(target, timeout, FailIfAThreadExitedInsideAnOperation());
            }

            spinner.SpinOnce();
        }
    }

    /// <summary>Version <paramref name="completed"/> has no region left: seal it, write it back, persist it as the frontier, reclaim.</summary>
    private void AfterTransition(long completed)
    {
        CheckNoOperationOutlivedItsCut(completed);
        long start = Stopwatch.GetTimestamp();
        long sealTicks = 0;
        _cycleFenceTicks = 0;
        int written = 0;
        bool frontierFirst = (_faults & DurabilityFaults.PersistFrontierBeforeSeals) != 0;
        if (_mode == DurabilityMode.Buffered)
        {
            if ((_faults & DurabilityFaults.PersistFrontierBeforeWriteBack) != 0)
            {
                PersistFrontier(completed);
                AfterFrontierPersistedFirstForTesting?.Invoke(completed);
            }

            if (frontierFirst)
            {
                // The broken control's order: written back and fenced unsealed, the frontier, then the seals (a crash
                // between leaves a durable version checked by its headers only, and the sealed-frontier word below it).
                written = WriteBackVersion(completed, seal: false, ref sealTicks);
                PersistFrontier(completed);
                BeforeSealForTesting?.Invoke(completed);
                sealTicks += SealVersion(completed, written);
            }
            else
            {
                // Sealed in the pass that writes the version back, under one fence, before the frontier covers it: every
                // block a frontier covers is whole and checked whole at recovery, and a seal a crash left over bytes
                // that are not durable belongs to this version, beyond the frontier (see HeapLayout, sealing).
                BeforeSealForTesting?.Invoke(completed);
                written = WriteBackVersion(completed, seal: true, ref sealTicks);
                SealedBeforeTheFrontierForTesting?.Invoke(completed);

                // Store and persist: the payloads and their seals were fenced first.
                PersistFrontier(completed);
            }
        }
        else if (_mode == DurabilityMode.Strict)
        {
            // Each operation wrote its payloads back and fenced before it left its region, so before the cut; those
            // whose write-back failed are written back here. All are durable before the seals and the frontier.
            WriteBackCarriedStrictPayloads();
            written = CollectVersion(completed);
            if (frontierFirst)
            {
                PersistFrontier(completed);
            }

            // Sealed over durable payloads, before the frontier covers the version (see Buffered above).
            BeforeSealForTesting?.Invoke(completed);
            sealTicks += SealVersion(completed, written);
            PersistFrontier(completed);
        }

        // Volatile.Write: release; pairs with the acquire in Frontier (Sync's loop, SyncAsync).
        Volatile.Write(ref _frontier, completed);
        CompleteWaiters(completed);
        FrontierMovedForTesting?.Invoke(completed);
        long durableAt = Stopwatch.GetTimestamp();
        Reclaim(completed - 1, written);
        ForgetExitedThreads();
        long reclaimed = Stopwatch.GetTimestamp();

        // Volatile.Write: atomic 64-bit stores for GetAdvancerStatistics on any thread; written under the cycle gate
        // (one writer), so a plain read-modify-write of each counter is enough.
        Volatile.Write(ref _statCycles, _statCycles + 1);
        Volatile.Write(ref _statBlocks, _statBlocks + written);
        Volatile.Write(ref _statWriteBackTicks, _statWriteBackTicks + (durableAt - start - sealTicks));
        Volatile.Write(ref _statSealTicks, _statSealTicks + sealTicks);
        Volatile.Write(ref _statFenceTicks, _statFenceTicks + _cycleFenceTicks);
        Volatile.Write(ref _statReclaimTicks, _statReclaimTicks + (reclaimed - durableAt));
    }

    /// <summary>
    /// Writes back <paramref name="version"/>'s payloads (no thread writes them any more: the version's cut has
    /// passed) — sealed first when <paramref name="seal"/> is set, with the sealed-frontier word — and fences once.
    /// Leaves their offsets in <see cref="_sealScratch"/>.
    /// </summary>
    /// <param name="version">The version whose cut has passed.</param>
    /// <param name="seal">Whether to seal the blocks in this pass (format 6), or leave them for <see cref="SealVersion"/>.</param>
    /// <param name="sealTicks">Accumulates the time spent computing the seals.</param>
    /// <returns>How many blocks it wrote back.</returns>
    private int WriteBackVersion(long version, bool seal, ref long sealTicks)
    {
        int n = CollectVersion(version);
        long[] offsets = _sealScratch;
        var ranges = new WriteBackRuns(_domain);

        // In chunks, each sealed and then copied (through the page cache, whole pages only: the last page of a chunk
        // waits for the next one), so the disk writes one chunk while the next is sealed and copied (see
        // MappedFilePersistenceDomain.StartWriteOut): the fence after them waits for what is left.
        for (int chunk = 0; chunk < n; chunk += WriteBackChunk)
        {
            int end = Math.Min(n, chunk + WriteBackChunk);
            if (seal)
            {
                long sealing = Stopwatch.GetTimestamp();
                _heap.Seal(offsets.AsSpan(chunk, end - chunk), version);
                sealTicks += Stopwatch.GetTimestamp() - sealing;
            }

            for (int i = chunk; i < end; i++)
            {
                ranges.Add(offsets[i], HeapLayout.HeaderSize + (long)PayloadSize(offsets[i]));
            }

            ranges.FlushWholePages();
        }

        ranges.Flush();
        if (seal)
        {
            // In the seals' fence, so it never says less than the frontier, persisted after it.
            _heap.File.WriteBackSealedFrontier(version);
            _heap.WriteBackSweepLogMark();
        }

        Fence();
        return n;
    }

    /// <summary>How many blocks <see cref="WriteBackVersion"/> seals and copies at a time (192 KiB of 48-byte blocks).</summary>
    internal const int WriteBackChunk = 4096;

    /// <summary>
    /// Moves the offsets of the blocks allocated in <paramref name="version"/> from every thread's list into
    /// <see cref="_sealScratch"/> (through the page cache, sorted in address order).
    /// </summary>
    /// <returns>How many there are.</returns>
    private int CollectVersion(long version)
    {
        int slot = ThreadBuffers.Slot(version);
        // Volatile.Read: acquire; pairs with the release in RegisterThread.
        ThreadBuffers[] registry = Volatile.Read(ref _registry);
        int count = 0;
        foreach (ThreadBuffers buffers in registry)
        {
            count += buffers.WriteBack[slot].Count;
        }

        if (_sealScratch.Length < count)
        {
            _sealScratch = new long[Math.Max(count, _sealScratch.Length * 2)];
        }

        long[] offsets = _sealScratch;
        int n = 0;
        foreach (ThreadBuffers buffers in registry)
        {
            OffsetList list = buffers.WriteBack[slot];
            list.CopyTo(offsets.AsSpan(n));
            n += list.Count;
            list.Clear();
        }

        if (_pageWriteBack)
        {
            // Through the page cache every write-back is a system call: sorted, each run of touched pages is written
            // back once (never the whole heap: its cost grows with the file). Each thread's list is a few ascending
            // runs (blocks are handed out in address order), so merging them is about linear.
            AscendingRuns.Sort(offsets, n, ref _sortScratch);
        }

        return n;
    }

    /// <summary>
    /// Seals the blocks of a version whose payloads are durable already (<see cref="DurabilityMode.Strict"/>: their
    /// operations wrote them back and fenced; or the broken control's order) — each commit word becomes a check over
    /// header and payload — writes back the commit words and the sealed-frontier word, and fences.
    /// </summary>
    /// <returns>The time it took, in timestamp ticks.</returns>
    private long SealVersion(long version, int count)
    {
        long started = Stopwatch.GetTimestamp();
        long[] offsets = _sealScratch;
        var ranges = new WriteBackRuns(_domain);
        if (count != 0)
        {
            _heap.Seal(offsets.AsSpan(0, count), version);
            for (int i = 0; i < count; i++)
            {
                ranges.Add(offsets[i] + HeapLayout.CommitOffset, sizeof(ulong));
            }
        }

        ranges.Flush();

        // Durable with the seals (one fence), before the frontier: recovery takes a sealed frontier below the frontier
        // for a window between the two (a file written in the broken control's order, or a damaged word).
        _heap.File.WriteBackSealedFrontier(version);
        _heap.WriteBackSweepLogMark();
        // Not Fence(): this fence is the seals' (in SealTime, which the write-back time excludes), not the write-back's.
        _domain.FenceOwned();
        return Stopwatch.GetTimestamp() - started;
    }

    /// <summary>The fence of a cycle's write-back, timed for <see cref="AdvancerStatistics.FenceTime"/>.</summary>
    private void Fence()
    {
        long started = Stopwatch.GetTimestamp();
        _domain.FenceOwned();
        _cycleFenceTicks += Stopwatch.GetTimestamp() - started;
    }

    /// <summary>The time the cycle in progress has waited on fences so far (under the cycle gate: one cycle at a time).</summary>
    private long _cycleFenceTicks;

    /// <summary>Counts a thread held back by the back-pressure since <paramref name="started"/> (see <see cref="AdvancerStatistics.BackPressureWaits"/>).</summary>
    private void CountBackPressure(long started)
    {
        Interlocked.Add(ref _statBackPressureTicks, Stopwatch.GetTimestamp() - started);
        Interlocked.Increment(ref _statBackPressureWaits);
    }

    private long[] Scratch(int count)
    {
        if (_scratch.Length < count)
        {
            _scratch = new long[Math.Max(count, _scratch.Length * 2)];
        }

        return _scratch;
    }

    /// <summary>
    /// Frees what version <paramref name="version"/> replaced or deleted: its readers are gone and its replacements
    /// durable. Replaced and deleted payloads are deferred (<see cref="PersistentHeap.DeferFrees"/>: parked untouched,
    /// marked free and written back by the heap's sweep before they are handed out again). An anti-payload is freed only
    /// once every older copy of its uid is durably free, so when the version deleted anything, every deferred free is
    /// made durable first. Then the heap's pools are stocked for the next versions (<see cref="StockAfterCycle"/>).
    /// </summary>
    /// <param name="version">The version whose retired blocks become free.</param>
    /// <param name="allocated">How many blocks the cycle's version allocated (bounds the sweep of an excess of parked frees).</param>
    private void Reclaim(long version, int allocated)
    {
        int slot = ThreadBuffers.Slot(version);
        bool durable = _mode != DurabilityMode.Transient;
        bool unordered = (_faults & DurabilityFaults.FreeAntiPayloadsWithoutOrdering) != 0;
        // Volatile.Read: acquire; pairs with the release in RegisterThread.
        ThreadBuffers[] registry = Volatile.Read(ref _registry);
        if (!durable)
        {
            // Transient: nothing is durable, blocks go straight back.
            FreeAll(registry, b => b.Retired[slot], durable: false, version);
            FreeAll(registry, b => b.AntiPayloads[slot], durable: false, version);
            return;
        }

        int n = Collect(registry, b => b.Retired[slot]);
        _largeScratch.Clear();
        if (n != 0)
        {
            // By segment: parking a block touches its segment's descriptor, bitmap and count, so a version's frees,
            // retired in random order, visit those of a few segments at a time instead of each line of all of them at
            // random. Ordered by their 64 KiB stretch of the file only (segments start at DataStart, 4 KiB aligned, so
            // a stretch meets at most two, whose frees may alternate): the order within a stretch does not matter
            // there, and the radix sort skips the digits below.
            AscendingRuns.SortByHighBits(_scratch, n, HeapLayout.SegmentShift, ref _sortScratch);

            // (Skipped when nothing was retired: parking takes the sweep's lock, however briefly.)
            _heap.DeferFrees(_scratch, n, _largeScratch);
            AfterReclaimMarkedForTesting?.Invoke();
        }

        if (_largeScratch.Count != 0)
        {
            FreeOffsets(CollectionsMarshal.AsSpan(_largeScratch), durable: true, version);
        }

        bool deletes = false;
        foreach (ThreadBuffers buffers in registry)
        {
            deletes |= buffers.AntiPayloads[slot].Count != 0;
        }

        if (deletes)
        {
            // (A delete-heavy workload writes its frees back every cycle, as before frees were deferred. The broken
            // control skips this, so an anti-payload's free can reach the file before the free of a copy it cancels.)
            if (!unordered)
            {
                _heap.FlushPendingFrees();
            }

            FreeAll(registry, b => b.AntiPayloads[slot], durable: true, version);
        }

        StockAfterCycle(allocated);
    }

    /// <summary>Copies the offsets the lists <paramref name="select"/> picks into <see cref="_scratch"/>, clears the lists and counts their bytes as reclaimed.</summary>
    private int Collect(ThreadBuffers[] registry, Func<ThreadBuffers, OffsetList> select)
    {
        int count = 0;
        foreach (ThreadBuffers buffers in registry)
        {
            count += select(buffers).Count;
        }

        long[] offsets = Scratch(count);
        int n = 0;
        foreach (ThreadBuffers buffers in registry)
        {
            // The bytes were counted when the blocks were retired: no read of their (cold) headers here.
            OffsetList list = select(buffers);
            long bytes = list.Bytes;
            list.CopyTo(offsets.AsSpan(n));
            n += list.Count;
            list.Clear();

            // Volatile.Write: release; pairs with the acquire in ReclaimBacklog. Only cycles (under _cycleGate) write it.
            Volatile.Write(ref buffers.ReclaimedBytes, buffers.ReclaimedBytes + bytes);
        }

        return n;
    }

    private void FreeAll(ThreadBuffers[] registry, Func<ThreadBuffers, OffsetList> select, bool durable, long version)
    {
        int n = Collect(registry, select);
        FreeOffsets(_scratch.AsSpan(0, n), durable, version);
    }

    /// <summary>
    /// Frees blocks the eager way: marked free, written back (through the page cache, sorted runs of pages) and
    /// fenced, and only then handed out again — a reuse that reached the file before the free could leave an old seal
    /// over new bytes, which recovery would have to report as damage. Sorts <paramref name="offsets"/> in place.
    /// </summary>
    /// <param name="offsets">The blocks.</param>
    /// <param name="durable">Whether the frees are made durable before the blocks are handed out again.</param>
    /// <param name="version">The version whose retired blocks these are: their claims (of that version or older) are
    /// forgotten once they are free (a block handed out at once may meanwhile hold a later payload's claim).</param>
    private void FreeOffsets(Span<long> offsets, bool durable, long version)
    {
        // (The broken control hands blocks out at once, before their frees are durable: the old behaviour.)
        bool holdUntilDurable = durable && (_faults & DurabilityFaults.ReuseBeforeFreeIsDurable) == 0;
        foreach (long offset in offsets)
        {
            if (holdUntilDurable)
            {
                // Marked free only: handed out again below, once the free is durable.
                _heap.MarkFree(new PayloadRef(offset));
            }
            else
            {
                _heap.FreeForOwner(new PayloadRef(offset));
            }
        }

        ForgetFreed(offsets, version);
        if (!durable || offsets.Length == 0)
        {
            return;
        }

        AfterEagerFreesMarkedForTesting?.Invoke();
        WriteBackRuns.WriteBackHeadersAndFence(_domain, offsets);
        if (holdUntilDurable)
        {
            foreach (long offset in offsets)
            {
                _heap.ReleaseFreed(new PayloadRef(offset));
            }
        }
    }

    private void CompleteWaiters(long frontier)
    {
        // A Sync waiting for the gate returns now if its version is durable, not when this cycle ends.
        WakeCycleGateWaiters(released: false);
        using (InterruptShield.Hold(_waitersGate))
        {
            for (int i = _waiters.Count - 1; i >= 0; i--)
            {
                if (_waiters[i].Target <= frontier)
                {
                    _waiters[i].Completion.TrySetResult();
                    _waiters.RemoveAt(i);
                }
            }

            if (_waiters.Count == 0)
            {
                _link.Pinned = null;
            }
        }
    }

    /// <summary>
    /// Records a failed cycle or stocking (the first fault stays: the stocker records its faults without the cycle gate)
    /// and fails every SyncAsync waiting. Never throws: on the advancer's or the stocker's own thread an exception let out
    /// ends the process, and out of memory the message built here, or the waiters' tasks given the fault, may fail to
    /// allocate (a probe's stocker ended the process so). The fault is recorded first, without allocating, so Sync,
    /// SyncAsync and Dispose report it from then on; a waiter that could not be failed ends at its
    /// <see cref="BufferedDurableHeapOptions.SyncTimeout"/>.
    /// </summary>
    private void RecordBackgroundFault(Exception fault)
    {
        // Interlocked.CompareExchange: the first fault stays the one reported.
        Interlocked.CompareExchange(ref _advancerFault, fault, null);
        try
        {
            FailWaiters(new InvalidOperationException($"The heap's advancer failed: {fault.Message}", fault));
        }
        catch (Exception)
        {
            // Out of memory: recorded above, reported by the next call.
        }
    }

    /// <summary>Fails every SyncAsync waiting; with <paramref name="close"/> (Dispose, the finalizer), no SyncAsync may wait any more.</summary>
    private void FailWaiters(Exception fault, bool close = false)
    {
        using (InterruptShield.Hold(_waitersGate))
        {
            _waitersClosed |= close;
            foreach ((_, TaskCompletionSource completion) in _waiters)
            {
                completion.TrySetException(fault);
            }

            _waiters.Clear();
            _link.Pinned = null;
        }
    }

    private Task WaitWithTimeout(Task task, long target, CancellationToken cancellationToken) =>
        SyncWaits.WaitAsync(task, _syncTimeout, cancellationToken, () => ThrowSyncTimeout(target, _syncTimeout, FailIfAThreadExitedInsideAnOperation()));

    private void StartAdvancer(TimeSpan period, TimeSpan? maxVersionAge, Action<BufferedDurableHeap>? startingForTesting)
    {
        _period = period;
        _link.Period = period;
        if (period == Timeout.InfiniteTimeSpan)
        {
            return;
        }

        Volatile.Write(ref _versionStartedAt, Now());
        TimeSpan age = maxVersionAge ?? period * LagBoundPeriods;
        _lagBound = _mode == DurabilityMode.Buffered && age != Timeout.InfiniteTimeSpan ? Math.Max(1, (long)(age.TotalSeconds * Stopwatch.Frequency)) : 0;

        if (_mode != DurabilityMode.Transient)
        {
            StartStocker();
        }

        try
        {
            startingForTesting?.Invoke(this);
            _advancer = new Thread(AdvancerLoop) { IsBackground = true, Name = "epvs-advancer" };
            _advancer.Start(_link);
        }
        catch
        {
            // The open fails (see the constructor): the stocker must not outlive it.
            _advancer = null;
            using (InterruptShield.Enter())
            {
                SignalStockerToStop();
                _backgroundStillRunning = !StockerStopped(BackgroundStopWait);
            }

            throw;
        }
    }

    /// <summary>The advancer's thread: holds the heap only while it runs a cycle (see <see cref="BackgroundLink"/>).</summary>
    private static void AdvancerLoop(object? state)
    {
        var link = (BackgroundLink)state!;
        try
        {
            AdvanceUntilStopped(link);
        }
        catch (Exception e)
        {
            // Nothing may leave the thread (it would end the process): recorded, as a failed cycle is.
            RecordEscaped(link, e);
        }
    }

    /// <summary>Records an exception that reached the top of a background thread on the link's heap, if it is still alive; never throws.</summary>
    private static void RecordEscaped(BackgroundLink link, Exception e)
    {
        if (link.Heap.TryGetTarget(out BufferedDurableHeap? heap))
        {
            heap.RecordBackgroundFault(e);
        }
    }

    private static void AdvanceUntilStopped(BackgroundLink link)
    {
        long started = Stopwatch.GetTimestamp();
        while (!link.Stopping)
        {
            // Fixed rate: a cycle starts one period after the previous one started (not after it ended), so the
            // durability lag stays about one period even when write-back takes a good part of it.
            link.Wake.WaitOne(Remaining(started + (long)(link.Period.TotalSeconds * Stopwatch.Frequency)));
            if (link.Stopping)
            {
                break;
            }

            started = Stopwatch.GetTimestamp();
            if (!CycleOnce(link))
            {
                return;
            }
        }
    }

    /// <summary>One background cycle of the link's heap, if it is still alive; false when the advancer ends.</summary>
    [MethodImpl(MethodImplOptions.NoInlining)]
    private static bool CycleOnce(BackgroundLink link) => link.Heap.TryGetTarget(out BufferedDurableHeap? heap) && heap.BackgroundCycle();

    /// <summary>The advancer's cycle; false when the advancer stops (Dispose took over, or the cycle failed).</summary>
    private bool BackgroundCycle()
    {
        try
        {
            // Bounded, so that a stalled operation does not keep the advancer from noticing Dispose.
            TimeSpan bound = HelpWait();
            Interlocked.Increment(ref _backgroundPeriods);
            RunCycle(long.MaxValue, Deadline(bound), bound, unlessIdle: true);
        }
        catch (TimeoutException)
        {
            // A thread is still inside an operation of the old version; the transition stays in flight and
            // completes when it leaves. Try again next period.
        }
        catch (ObjectDisposedException) when (Volatile.Read(ref _disposed) != 0)
        {
            // Dispose took over the cycles (it stopped waiting for this thread): a stop, not a fault. (Volatile.Read:
            // pairs with the exchange in Dispose. Any other ObjectDisposedException, the version scheme disposed under
            // the heap, is a fault like any other: this thread used to stop without a word, and SyncAsync waited for
            // ever with an infinite SyncTimeout.)
            return false;
        }
        catch (Exception e)
        {
            // The first fault stays the one reported (a cycle refused after an earlier fault, or the stocker's, wraps it).
            RecordBackgroundFault(e);
            return false;
        }

        return true;
    }

    /// <summary>Test hook: runs first when Dispose stops the advancer; a hook that throws stands for a failure there.</summary>
    internal Action? StoppingAdvancerForTesting { get; set; }

    /// <summary>How long Dispose waits for the advancer and the stocker to stop, both together (tests shorten it).</summary>
    internal TimeSpan BackgroundStopWait { get; set; } = TimeSpan.FromSeconds(30);

    /// <summary>
    /// Set by Dispose when the advancer or the stocker did not stop within <see cref="BackgroundStopWait"/> (stuck in the
    /// kernel on a failing disk, say): it may still write through the heap's file, so the file is closed as with a
    /// thread still inside an operation — quarantined, never unmapped, and refused to any other heap.
    /// </summary>
    private bool _backgroundStillRunning;

    /// <summary>
    /// Stops the advancer and the stocker and waits for both (Dispose, before its last cycles), together at most
    /// <see cref="BackgroundStopWait"/>.
    /// </summary>
    /// <returns>A timeout that names each thread that did not stop (<see cref="_backgroundStillRunning"/> is then set);
    /// otherwise the advancer's fault, if any.</returns>
    private Exception? StopBackgroundThreads()
    {
        Exception? stuck;
        try
        {
            StoppingAdvancerForTesting?.Invoke();
        }
        finally
        {
            // Whatever happened there, both threads are told to stop and waited for: neither may write through the heap
            // while it closes. The stocker after the advancer's flag (a cycle the advancer ran last may still ask for a
            // stocking, which then runs nowhere: a cycle a Sync runs meanwhile may too, and allocating threads sweep or
            // format for themselves until Dispose's own cycles, which stock nothing). One wait for both: a disk that
            // holds one of them in the kernel likely holds the other too, and Dispose waited for each in turn.
            _link.Stopping = true;
            _wake.Set();
            SignalStockerToStop();
            long deadline = Deadline(BackgroundStopWait);
            bool advancerStopped = _advancer is not { } thread || InterruptShield.Join(thread, Remaining(deadline));
            if (advancerStopped)
            {
                _wake.Dispose();
            }

            bool stockerStopped = StockerStopped(Remaining(deadline));
            _backgroundStillRunning = !advancerStopped || !stockerStopped;
            string which = advancerStopped ? "stocker thread" : stockerStopped ? "advancer thread" : "advancer and stocker threads";
            stuck = _backgroundStillRunning ? new TimeoutException($"The {which} did not stop within {BackgroundStopWait.TotalSeconds:0.#} s.") : null;
        }

        // (A failure for a thread that exited inside an operation is not one here: the last advance still writes back a
        // version whose cut came before it, then reports it.)
        // (One read of the fault: a stall watch's tick may record one meanwhile.)
        Exception? fault = Volatile.Read(ref _advancerFault);
        return stuck ?? (fault is not null && IsExitedFault(fault) ? null : fault);
    }

    private void ThrowIfProtected(string what)
    {
        if (_scheme.Epoch.ThisInstanceProtected())
        {
            ThrowHelper.ThrowInvalidOperation($"{what} was called inside an operation of this heap: the version cannot advance until the calling thread's operation ends, so it would wait for itself. Dispose the DurableOperation first.");
        }
    }

    /// <summary>
    /// A wait for a version's end called from a deferred action of the heap's epoch (registered by a caller on
    /// <see cref="VersionScheme"/>'s epoch, run in the drain of a thread ending its operation): the transition's critical
    /// section may be pending in that same drain, behind the running action, so the cycle waited for a cut nobody could
    /// complete — for ever with an infinite timeout (the draining thread's operation never finished ending either).
    /// Refused before anything changes. (A deferred action may still run operations, and SyncAsync, which does not wait.)
    /// </summary>
    private void ThrowIfDraining(string what)
    {
        if (_scheme.Epoch.ThisInstanceDraining() && (_faults & DurabilityFaults.WaitInsideTheEpochsDrain) == 0)
        {
            ThrowHelper.ThrowInvalidOperation($"{what} was called from a deferred action of this heap's epoch (VersionScheme.Epoch), run in another call's drain: the version transition it waits for may be pending in that same drain, behind this action, so it would wait for ever. Do it from a thread of your own (queue it to the thread pool, say).");
        }
    }

    [DoesNotReturn]
    private void ThrowSyncTimeout(long target, TimeSpan timeout, string? exited)
    {
        // AdvanceVersion has no target version (long.MaxValue: the next one); a Sync names the version it waits for.
        string what = target == long.MaxValue ? "for an advance of the version" : $"for version {target} to become durable";
        if (exited is not null)
        {
            throw new TimeoutException($"Waited {timeout} {what}, and it never will: {exited}");
        }

        IReadOnlyList<EpochSlotInfo> blocking = _scheme.GetThreadsBlockingTransition();
        string who = blocking.Count == 0 ? "no thread is inside an operation now (it may just have left)" : "still inside an operation: " + string.Join("; ", blocking.Select(b => b.ToString()));
        throw new TimeoutException(
            $"Waited {timeout} {what} (durable frontier {DurableFrontier}, current version {CurrentVersion}); " +
            $"the version transition waits for every operation of the old version to end, and {who}. " +
            "A thread that stays inside an operation blocks durability: end its operation, or wait longer.");
    }

    /// <summary>What the waits underneath take (<see cref="Monitor.TryEnter(object, TimeSpan)"/>, <see cref="Task.Wait(TimeSpan)"/>): a clear error up front instead of theirs midway.</summary>
    private static void ValidateTimeout(TimeSpan timeout)
    {
        if (timeout != Timeout.InfiniteTimeSpan && (timeout < TimeSpan.Zero || timeout.TotalMilliseconds > int.MaxValue))
        {
            ThrowHelper.ThrowArgumentOutOfRange(nameof(timeout), $"The timeout must be between zero and int.MaxValue milliseconds (about 24.8 days), or Timeout.InfiniteTimeSpan, not {timeout}.");
        }
    }

    private static long Deadline(TimeSpan timeout) =>
        timeout == Timeout.InfiniteTimeSpan ? long.MaxValue : Stopwatch.GetTimestamp() + (long)(timeout.TotalSeconds * Stopwatch.Frequency);

    private static TimeSpan Remaining(long deadline)
    {
        if (deadline == long.MaxValue)
        {
            return Timeout.InfiniteTimeSpan;
        }

        long left = deadline - Stopwatch.GetTimestamp();
        return left <= 0 ? TimeSpan.Zero : TimeSpan.FromSeconds((double)left / Stopwatch.Frequency);
    }
}
