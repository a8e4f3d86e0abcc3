using System;
using System.Collections.Generic;
using System.Diagnostics.CodeAnalysis;
using System.Runtime.CompilerServices;
using System.Threading;
using System.Threading.Tasks;
using Epvs;

namespace Epvs.Persistence;

/// <summary>
/// Buffered durable linearizability on EPVS (DESIGN §4, layer 4; Montage/nbMontage): a <see cref="PersistentHeap"/>
/// whose payloads are tagged with the EPVS version of the operation that wrote them, a background advancer that moves
/// the version, writes back each completed version's payloads and persists a durable frontier, and a recovery that
/// keeps exactly the payloads of the versions up to that frontier.
/// </summary>
/// <remarks>
/// <para>Guarantee. After a crash, reopening yields exactly the operations of every version up to the persisted
/// durable frontier — a prefix of the history in version order, never a mix — which trails the running version by
/// about one <see cref="BufferedDurableHeapOptions.AdvancePeriod"/> (Montage's guarantee, versions ≤ clock − 2, holds
/// too). <see cref="Sync(TimeSpan)"/> returns once every operation that completed before the call is in that prefix.</para>
/// <para>Why it works. An operation runs inside one EPVS protected region (<see cref="BeginOperation"/> to
/// <see cref="DurableOperation.Dispose"/>), so it belongs to exactly one version, and the transition from v to v + 1
/// runs only when every region of v has left: a quiescent cut. Payloads of older versions are never changed in place
/// (an update copies them with the same uid; a delete writes an anti-payload), so the durable image of every version
/// ≤ v stays intact while v + 1 runs. The advancer writes back v's payloads after the cut and only then persists
/// frontier = v. Replaced payloads and anti-payloads are freed two versions later, when no reader can hold them and
/// their replacement is durable; a payload's free is durable before its anti-payload's.</para>
/// <para>Threads. Every member may be called from any thread. An operation is thread-affine (it is an EPVS region)
/// and must not span an <c>await</c>. A thread that stays inside an operation holds back every version transition,
/// hence durability: <see cref="Sync(TimeSpan)"/> then times out and names it.</para>
/// </remarks>
public sealed unsafe partial class BufferedDurableHeap : IDisposable, IAsyncDisposable
{
    private readonly PersistentHeap _heap;
    private readonly PersistenceDomain _domain;
    private readonly EpochProtectedVersionScheme _scheme;
    private readonly DurabilityMode _mode;
    private readonly DurabilityFaults _faults;

    /// <summary>The last version operations may write in (<see cref="HeapLayout.LastWritableVersion"/>; unbounded for a
    /// transient heap, which persists no version, and under the broken control that runs past it).</summary>
    private readonly long _lastWritableVersion;
    private readonly TimeSpan _syncTimeout;
    private readonly long _backlogLimit;
    private readonly byte* _base;
    private readonly bool _pageWriteBack;
    private readonly bool _ownsFile;
    private readonly ThreadLocal<ThreadBuffers> _local;
    private readonly object _registryGate = new();
    private ThreadBuffers[] _registry = Array.Empty<ThreadBuffers>();
    private long _versionBase;
    private int _disposed;

    /// <summary>Makes every Dispose return only once the first one has closed the heap.</summary>
    private readonly DisposalGate _disposal = new();

    /// <summary>The thread disposing the heap, the only one that may still run advance cycles (0: not disposing).</summary>
    private int _disposingThread;

    /// <summary>
    /// Cancelled as Dispose begins: a Sync on another thread that holds the cycle gate while it waits for the version's
    /// operations to end (for ever, with an infinite timeout) stops waiting, so that Dispose takes the gate and closes
    /// the heap within its own timeout instead of behind that wait. Also when the heap fails because a thread exited
    /// inside an operation: that wait can never end then (see BufferedDurableHeap.ExitedThreads.cs).
    /// </summary>
    private readonly CancellationTokenSource _cycleWaitsEnd = new();

    private BufferedDurableHeap(HeapFile file, bool ownsFile, BufferedDurableHeapOptions? options)
    {
        options ??= new BufferedDurableHeapOptions();
        options.Validate();
        RefuseTransientOverDurableData(file, options.Mode);
        _ownsFile = ownsFile;
        _mode = options.Mode;
        _faults = options.Faults;
        _lastWritableVersion = _mode == DurabilityMode.Transient || (_faults & DurabilityFaults.AdvancePastTheVersionSpace) != 0 ? long.MaxValue : HeapLayout.LastWritableVersion;
        _syncTimeout = options.SyncTimeout;
        _backlogLimit = options.ReclaimBacklogLimit;
        _domain = file.Domain;
        _base = file.Pointer;

        // Through the page cache (msync) every write-back is a system call: the advancer sorts a version's payloads and
        // writes back each run of touched pages once; on persistent memory, per-payload cache-line write-back is what
        // Montage does.
        _pageWriteBack = !_domain.IsPersistentMemory;
        _link = new BackgroundLink(this);
        _local = new ThreadLocal<ThreadBuffers>(RegisterThread);
        _scheme = new EpochProtectedVersionScheme();
        _scheme.TransitionStalled += OnTransitionStalled;
        _entryToken = _entryRefused.Token;
        _schemeVersion = _scheme.CurrentState.Version;
        try
        {
            (_heap, Recovery) = Recover(file, options);
            _heap.BlocksFreed = ForgetSwept;
        }
        catch
        {
            // As in PersistentHeap's constructor: no clean-shutdown mark after a failed recovery, whoever owns the file.
            file.ForgoCleanShutdown();
            _scheme.Dispose();
            _local.Dispose();
            throw;
        }

        try
        {
            options.StartingAdvancerForTesting?.Invoke();
            StartAdvancer(options.AdvancePeriod, options.MaxVersionAge, options.StartingAdvancerThreadForTesting);
        }
        catch
        {
            // No thread for the advancer (the process's thread or descriptor limit, memory): the open fails with that
            // exception, and the recovered allocator detaches from the file first. Left attached, the owner's cleanup
            // could not dispose the file (a heap still used it): it threw InvalidOperationException in place of this
            // exception and left the file mapped and locked, so every later open in the process failed as AlreadyOpen.
            // Recovery's writes are complete and durable; the file is as a later open will find it. A stocker that did not
            // stop (StartAdvancer waited for it) may still write through the file: closed as Dispose closes it then
            // (quarantined, refused to another heap, the scheme left to the collector).
            _heap.Dispose(operationsDrained: !BackgroundMayStillWrite);
            if (!BackgroundMayStillWrite)
            {
                _scheme.Dispose();
                _local.Dispose();
            }

            throw;
        }
    }

    /// <summary>The allocator underneath (statistics, <see cref="PersistentHeap.File"/>). Allocate payloads through <see cref="BeginOperation"/>: its own <see cref="PersistentHeap.Allocate"/>, <see cref="PersistentHeap.TryAllocate"/> and <see cref="PersistentHeap.Free"/> throw <see cref="InvalidOperationException"/>.</summary>
    public PersistentHeap Heap => _heap;

    /// <summary>
    /// The version scheme whose versions tag the payloads: for diagnostics (<see cref="EpochProtectedVersionScheme.GetThreadsBlockingTransition"/>,
    /// <see cref="EpochProtectedVersionScheme.TransitionStalled"/>, <see cref="EpochProtectedVersionScheme.StateMachineFaulted"/>).
    /// </summary>
    /// <remarks>
    /// Do not run state machines on it, nor call Refresh or Leave inside an operation: either ends versions (or an
    /// operation's region) behind the heap's back. The heap notices at its next transition and fails like a failed
    /// advance cycle (see <see cref="BeginOperation"/>) rather than declare durable what it never wrote back.
    /// </remarks>
    public EpochProtectedVersionScheme VersionScheme => _scheme;

    /// <summary>How this heap makes operations durable.</summary>
    public DurabilityMode Mode => _mode;

    /// <summary>What recovery found when the heap opened.</summary>
    public DurableRecoveryReport Recovery { get; }

    /// <summary>
    /// The version new operations observe (payload tags are versions). Moves forward at every advance; the background
    /// advancer does not advance an idle heap (see <see cref="BufferedDurableHeapOptions.AdvancePeriod"/>), so a version
    /// read without writing may stay current, and not durable, for as long as nothing is written: wait for durability
    /// with <see cref="Sync()"/> or <see cref="SyncAsync"/>.
    /// </summary>
    public long CurrentVersion => Volatile.Read(ref _versionBase) + _scheme.CurrentState.Version;

    /// <summary>
    /// The durable frontier: every operation of a version at or below it is durable (after a crash, recovery keeps
    /// exactly those). Always below <see cref="CurrentVersion"/>. 0 on a <see cref="DurabilityMode.Transient"/> heap,
    /// which makes nothing durable (it used to move with every advance there, while a reopen kept nothing).
    /// </summary>
    public long DurableFrontier => _mode == DurabilityMode.Transient ? 0 : Frontier;

    /// <summary>The last version whose cycle completed (in every mode; <see cref="DurableFrontier"/> but for Transient).</summary>
    // Volatile.Read: acquire; pairs with the release in AfterTransition, so a thread that sees frontier v also sees
    // that v's write-back and frontier persist are done.
    private long Frontier => Volatile.Read(ref _frontier);

    /// <summary>Creates a heap file at <paramref name="path"/> and opens it for buffered durability; disposing the heap disposes the file.</summary>
    /// <param name="path">Where to create the file (it must not exist).</param>
    /// <param name="fileOptions">Size and persistence domain; null for the defaults.</param>
    /// <param name="options">Durability mode, advance period, recovery; null for the defaults.</param>
    /// <returns>The empty heap, with its advancer running.</returns>
    /// <exception cref="HeapFileException">See <see cref="HeapFile.Create(string, HeapFileOptions?)"/>.</exception>
    /// <exception cref="ArgumentOutOfRangeException">An option is out of range; no file is created.</exception>
    /// <exception cref="InvalidOperationException">The calling thread is inside an operation of another buffered heap
    /// (the new heap could not be disposed there: see <see cref="Dispose"/>); no file is created.</exception>
    public static BufferedDurableHeap Create(string path, HeapFileOptions? fileOptions = null, BufferedDurableHeapOptions? options = null)
    {
        // Options first: an invalid one must not leave a file behind (a retry would then find the path taken).
        options?.Validate();
        RefuseOpeningInsideAnotherHeapsOperation(options);
        HeapFile file = HeapFile.Create(path, fileOptions);

        // A heap that never held data is not left behind either: removed while its lock is held, by whichever Dispose of
        // the file runs first on the way out (the heap's constructor disposes it when it fails).
        file.RemoveIfDisposedForFailedCreate = true;
        try
        {
            BufferedDurableHeap heap = Own(file, options);
            file.RemoveIfDisposedForFailedCreate = false;
            return heap;
        }
        catch
        {
            file.Dispose();
            throw;
        }
    }

    /// <summary>Opens an existing heap file and recovers it (see the class remarks); disposing the heap disposes the file.</summary>
    /// <param name="path">The heap file.</param>
    /// <param name="fileOptions">Which persistence domain to map it with; null for the defaults.</param>
    /// <param name="options">Durability mode, advance period, recovery; null for the defaults.</param>
    /// <returns>The recovered heap; structures take their payloads with <see cref="TakeRecoveredPayloads(int)"/>.</returns>
    /// <exception cref="System.IO.FileNotFoundException">There is no file at <paramref name="path"/> (see <see cref="HeapFile.Open(string, HeapFileOptions?)"/>).</exception>
    /// <exception cref="HeapFileException">See <see cref="HeapFile.Open(string, HeapFileOptions?)"/>.</exception>
    /// <exception cref="System.IO.IOException">The file could not be opened for another reason (see <see cref="HeapFile.Open(string, HeapFileOptions?)"/>).</exception>
    /// <exception cref="ArgumentOutOfRangeException">An option is out of range; the file is not opened.</exception>
    /// <exception cref="InvalidOperationException">The calling thread is inside an operation of another buffered heap (as for <see cref="Create"/>),
    /// or <see cref="DurabilityMode.Transient"/> was asked over a file that holds durable data (the file is left as it was).</exception>
    public static BufferedDurableHeap Open(string path, HeapFileOptions? fileOptions = null, BufferedDurableHeapOptions? options = null)
    {
        // Options first, as in Create: an invalid one opens nothing.
        options?.Validate();
        RefuseOpeningInsideAnotherHeapsOperation(options);
        return Own(HeapFile.Open(path, fileOptions, HeapLayout.KindBufferedDurable), options);
    }

    /// <summary>Opens (recovering) a heap file the caller owns, for example one on a <see cref="SimulatedPersistenceDomain"/>; the file is not disposed with the heap.</summary>
    /// <param name="file">A heap file just created or opened, not used by another heap.</param>
    /// <param name="options">Durability mode, advance period, recovery; null for the defaults.</param>
    /// <returns>The recovered heap.</returns>
    /// <exception cref="ArgumentOutOfRangeException">An option is out of range; nothing is opened.</exception>
    /// <exception cref="InvalidOperationException">The calling thread is inside an operation of another buffered heap (as for <see cref="Create"/>),
    /// or <see cref="DurabilityMode.Transient"/> was asked over a file that holds durable data (the file is left as it was).</exception>
    public static BufferedDurableHeap Open(HeapFile file, BufferedDurableHeapOptions? options = null)
    {
        ArgumentNullException.ThrowIfNull(file);
        options?.Validate();
        RefuseOpeningInsideAnotherHeapsOperation(options);
        return new BufferedDurableHeap(file, ownsFile: false, options);
    }

    /// <summary>
    /// Begins an operation: enters an EPVS protected region and returns the handle through which the operation
    /// allocates, updates and deletes payloads, all tagged with <see cref="DurableOperation.Version"/>. Dispose it
    /// (with <c>using</c>) on the same thread to end the operation.
    /// </summary>
    /// <returns>The operation.</returns>
    /// <exception cref="ObjectDisposedException">The heap has been disposed.</exception>
    /// <exception cref="InvalidOperationException">An advance cycle failed earlier (a write-back error, a fault in
    /// the transition's critical section such as a failed persist of the epoch clock, a double delete, the version
    /// scheme disposed under the heap): nothing more can become durable in this heap, so no
    /// operation begins any more rather than complete without ever being durable. Dispose the heap and reopen the
    /// file: recovery keeps every version up to <see cref="DurableFrontier"/>. Also when the version scheme, or its
    /// epoch, was disposed under the heap (the message says so), and when a thread exited inside an operation, which
    /// can never end: the heap fails then, naming the thread, and an operation waiting for the version transition
    /// behind it throws this instead of waiting for ever. Also when the calling thread is inside an operation of
    /// another <see cref="BufferedDurableHeap"/> (nothing begins; nothing fails): threads nesting operations of two heaps
    /// in opposite orders would wait for each other's version transitions for ever. Operations of one heap nest.</exception>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    public DurableOperation BeginOperation() => Begin(refuseAfterFault: true);

    /// <summary>
    /// <see cref="BeginOperation"/> for the structures' reads, which write nothing: still allowed after an advance cycle
    /// failed, so that a caller can get its data out before it disposes the heap.
    /// </summary>
    internal DurableOperation BeginReadOperation() => Begin(refuseAfterFault: false);

    /// <summary>
    /// The read operation a structure rebuilds its index in when it opens (it reads the recovered payloads in the
    /// mapping): like <see cref="BeginReadOperation"/>, but not counted as one of the thread's operations for the
    /// back-pressure checks, which it neither needs (it writes nothing) nor should run (an advance inside a constructor).
    /// </summary>
    internal DurableOperation BeginRebuildOperation() => Begin(refuseAfterFault: false, backPressure: false);

    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    private DurableOperation Begin(bool refuseAfterFault, bool backPressure = true)
    {
        ThreadBuffers buffers;
        VersionSchemeState state;
        try
        {
            buffers = _local.Value!;
            if (!buffers.HasOpenOperations && buffers.AcrossHeaps.OpenIn is { } other && !other.IsHeapDisposed)
            {
                RefuseOperationInsideAnotherHeapsOperation();
            }

            if (backPressure && (buffers.RetiredBytes >= buffers.NextBacklogCheck || --buffers.OperationsUntilCheck < 0))
            {
                ApplyBackPressure(buffers);
            }

            // Room to record the operation, made before entering the region: a failed allocation inside it would leave the
            // thread protected, holding back every version transition.
            if (buffers.OpenRecordFull)
            {
                GrowOpenRecord(buffers);
            }

            // With the heap's token: a transition behind a thread that exited inside an operation never completes (see
            // BufferedDurableHeap.ExitedThreads.cs), and only the token ends the wait for it.
            state = _scheme.Enter(_entryToken);
        }
        catch (OperationCanceledException e)
        {
            ThrowEntryRefused(e);
            throw;
        }
        catch (ObjectDisposedException e)
        {
            // Disposed: this heap (its Dispose disposes the thread buffers and the scheme), or the scheme or its epoch under
            // the heap. The message used to name whichever of those objects threw first (a ThreadLocal, a LightEpoch).
            ThrowSchemeGone(e);
            throw;
        }

        // Volatile.Read: acquire; pairs with the exchange in Dispose. Enter announced with a full fence first, so
        // either this operation sees the flag and backs out, or Dispose's wait for operations sees this one. (A failed
        // cycle is recorded under the cycle gate; an operation that began just before it is reported by Sync and
        // Dispose, which fail from then on too.)
        if (Volatile.Read(ref _disposed) != 0 || (refuseAfterFault && _advancerFault is not null))
        {
            _scheme.Leave();
            ThrowNotBegun();
        }

        // Volatile.Read: acquire; the base is written once in the constructor before any operation can begin.
        long version = Volatile.Read(ref _versionBase) + state.Version;

        // Volatile.Read: the critical section that began the version persisted the clock over it before publishing the
        // version, which Enter (a full fence) observed. Above the clock only after a transition the heap did not run.
        if (version > Volatile.Read(ref _persistedClock) && refuseAfterFault && _mode != DurabilityMode.Transient && (_faults & DurabilityFaults.BeginAboveTheClock) == 0)
        {
            RefuseForeignVersion(version);
        }

        if (version > _lastWritableVersion && refuseAfterFault)
        {
            RefuseExhaustedVersionSpace(version);
        }

        return new DurableOperation(this, buffers, version, buffers.OpenOperation(version));
    }

    /// <summary>
    /// Whether an operation of <paramref name="version"/> that began without the writers' checks (a structure's rebuild)
    /// may still write: the heap has not failed, and the version is one the heap began (see <see cref="RefuseForeignVersion"/>).
    /// </summary>
    internal bool MayWriteIn(long version) =>
        _mode == DurabilityMode.Transient || (Volatile.Read(ref _advancerFault) is null && version <= Volatile.Read(ref _persistedClock) && version <= _lastWritableVersion);

    /// <summary>Whether the heap's versions have run out (<see cref="HeapLayout.LastWritableVersion"/>): no operation begins, no version ends.</summary>
    private bool VersionSpaceExhausted => CurrentVersion > _lastWritableVersion;

    /// <summary>
    /// <paramref name="version"/>, or the last writable version if that is lower: what a Sync can wait for (no operation
    /// writes past it, and no version ends after it). One read of the caller's version: a target computed from two reads
    /// of <see cref="CurrentVersion"/> could name the version after the last, which never becomes durable (a review found
    /// a SyncAsync waiting for it).
    /// </summary>
    private long WritableAtMost(long version) => Math.Min(version, _lastWritableVersion);

    /// <summary>The message of every refusal once the versions have run out (see <see cref="HeapLayout.LastWritableVersion"/>).</summary>
    private string ExhaustedVersionSpaceMessage(long version) =>
        $"The heap's version space is used up: version {version} is past the last version a buffered heap writes in ({HeapLayout.LastWritableVersion}; the file stores versions in {HeapLayout.SealedValueBits} bits and keeps the last {HeapLayout.VersionHeadroom} for opens). Everything up to DurableFrontier ({DurableFrontier}) stays durable and readable, here and after a reopen; to write again, copy the data into a new heap file.";

    /// <summary>A writing operation is beginning past <see cref="HeapLayout.LastWritableVersion"/>: refused (leaves the region first). The heap does not fail: reads, Sync and Dispose go on.</summary>
    [MethodImpl(MethodImplOptions.NoInlining)]
    [DoesNotReturn]
    private void RefuseExhaustedVersionSpace(long version)
    {
        _scheme.Leave();
        ThrowHelper.ThrowInvalidOperation(ExhaustedVersionSpaceMessage(version));
    }

    /// <summary>
    /// A writing operation is beginning in a version above the persisted epoch clock: one a state machine the heap did not
    /// run began (the heap's own transitions persist the clock before any operation of their version). Nothing of it can
    /// become durable (the heap's next cycle fails on that transition), and its blocks could reach the file tagged above
    /// the clock — through a shared mapping or on persistent memory — which recovery takes for a stale superblock (see
    /// <see cref="PersistentHeapOptions.TagBound"/>). So the operation is refused, and the heap fails now, as that cycle
    /// would: reads go on, nothing more is written. Inside the operation's region: leaves it first.
    /// </summary>
    [MethodImpl(MethodImplOptions.NoInlining)]
    [DoesNotReturn]
    private void RefuseForeignVersion(long version)
    {
        _scheme.Leave();
        var fault = new InvalidOperationException($"The heap's version scheme was advanced to version {version}, past the persisted epoch clock {Volatile.Read(ref _persistedClock)}, by a state machine the heap did not run (BufferedDurableHeap.VersionScheme is for diagnostics: do not run state machines on it). Nothing of those versions can become durable, so no operation writes in them: dispose the heap and reopen the file (recovery keeps every version up to DurableFrontier, {DurableFrontier}).");

        // As a failed cycle records its fault: the first one stays the one reported.
        RecordBackgroundFault(fault);
        throw fault;
    }

    /// <summary>Test-only: the flag the first Dispose sets (read it with Volatile.Read).</summary>
    internal ref int DisposedFlagForTesting => ref _disposed;

    [MethodImpl(MethodImplOptions.NoInlining)]
    private void GrowOpenRecord(ThreadBuffers buffers)
    {
        BeforeOpenRecordGrowsForTesting?.Invoke();
        buffers.GrowOpenRecord();
    }

    /// <summary>Test hook: runs when a thread's record of open operations grows (a throw stands for a failed allocation).</summary>
    internal Action? BeforeOpenRecordGrowsForTesting { get; set; }

    /// <summary>
    /// Reserves a structure's (user) type id for this heap's lifetime, whatever its kind or key size: two structures with
    /// one type id would each write payloads the other is refused over at the next open.
    /// </summary>
    /// <exception cref="InvalidOperationException">A structure with this type id was already opened on the heap.</exception>
    internal void ReserveStructureTypeId(int typeId)
    {
        using (InterruptShield.Hold(_recoveredGate))
        {
            if (!_structureTypeIds.Add(typeId))
            {
                ThrowHelper.ThrowInvalidOperation($"A structure with type id {typeId} was already opened on this heap (or an earlier attempt failed after it had taken the recovered payloads): open each structure once per heap, each with its own type id; after a failed open, dispose and reopen the heap.");
            }
        }
    }

    /// <summary>
    /// Gives back a type id <see cref="ReserveStructureTypeId"/> took, for an open that failed before it took anything else
    /// (its key-size record found no room): the open can be retried in this session.
    /// </summary>
    internal void ReleaseStructureTypeId(int typeId)
    {
        using (InterruptShield.Hold(_recoveredGate))
        {
            _structureTypeIds.Remove(typeId);
        }
    }

    /// <summary>The payloads recovery kept for <paramref name="typeId"/> that nobody has taken yet, without taking them (a copy).</summary>
    internal RecoveredPayload[] PeekRecoveredPayloads(int typeId)
    {
        using (InterruptShield.Hold(_recoveredGate))
        {
            return _recovered.TryGetValue(typeId, out List<RecoveredPayload>? payloads) ? payloads.ToArray() : Array.Empty<RecoveredPayload>();
        }
    }

    /// <summary>Whether recovery kept payloads of <paramref name="typeId"/> that nobody has taken yet.</summary>
    internal bool HasRecoveredPayloads(int typeId)
    {
        using (InterruptShield.Hold(_recoveredGate))
        {
            return _recovered.TryGetValue(typeId, out List<RecoveredPayload>? payloads) && payloads.Count != 0;
        }
    }

    /// <summary>
    /// Gives a structure the payloads recovery kept for <paramref name="typeId"/> (the structure's id). Each type id
    /// can be taken once; payloads of type ids nobody takes stay allocated.
    /// </summary>
    /// <param name="typeId">The type id the structure's payloads carry.</param>
    /// <returns>The payloads, in no particular order; empty for a new heap.</returns>
    /// <exception cref="InvalidOperationException">The payloads of this type id were already taken.</exception>
    /// <exception cref="ObjectDisposedException">The heap was disposed.</exception>
    public IReadOnlyList<RecoveredPayload> TakeRecoveredPayloads(int typeId)
    {
        ThrowIfDisposed();
        using (InterruptShield.Hold(_recoveredGate))
        {
            if (!_claimedTypes.Add(typeId))
            {
                ThrowHelper.ThrowInvalidOperation($"The recovered payloads of type id {typeId} were already taken: open each structure once per heap, each with its own type id.");
            }

            if (_recovered.Remove(typeId, out List<RecoveredPayload>? payloads))
            {
                return payloads;
            }

            return Array.Empty<RecoveredPayload>();
        }
    }

    /// <summary>
    /// Stops the advancer, makes every completed operation durable (one last advance), reclaims what is still waiting,
    /// saves the allocator state for a fast reopen (see <see cref="DurableRecoveryReport.FastReopen"/>), and closes
    /// the heap (and the file, when the heap opened it) with a clean-shutdown mark. Every thread must have ended its
    /// operations.
    /// </summary>
    /// <remarks>Operations that begin after Dispose has started throw <see cref="ObjectDisposedException"/>. If a thread
    /// stays inside an operation past <see cref="BufferedDurableHeapOptions.SyncTimeout"/>, the heap is closed without
    /// a clean-shutdown mark and without unmapping under that thread: the mapping is replaced with private anonymous
    /// memory (Linux; elsewhere it is kept mapped), so the straggler can neither crash nor write to the file, and the
    /// file lock is released; then <see cref="TimeoutException"/> is thrown. If the last advance fails, or an advance
    /// cycle failed earlier, the heap (and the file, when the heap opened it) is closed all the same, the file gets no
    /// clean-shutdown mark, and <see cref="InvalidOperationException"/> says what was not made durable. Either way the
    /// file lock is released. A thread that begins an operation while Dispose runs is waited for briefly (at most
    /// <see cref="BufferedDurableHeapOptions.SyncTimeout"/>, or 30 s). Dispose returns only once the heap is closed: a
    /// call while another Dispose runs waits for it and returns when it has finished, whatever its outcome (the heap is
    /// closed either way; that caller gets the exception, if any), and a call after that does nothing. That wait is
    /// interruptible: <see cref="Thread.Interrupt"/> makes the waiting call throw <see cref="ThreadInterruptedException"/>,
    /// and the other one carries on.</remarks>
    /// <exception cref="TimeoutException">A thread is still inside an operation, so the last advance could not run within <see cref="BufferedDurableHeapOptions.SyncTimeout"/>; the heap is closed anyway and recovery keeps the frontier prefix.
    /// Or the heap's advancer or stocker thread did not stop within 30 s (both together; the message names which: stuck
    /// in a system call on a failing disk, say): the heap is closed without it, as with a thread left inside an operation — a file the heap opened is
    /// quarantined rather than unmapped under it, and a file the caller owns hosts no other heap (dispose it; the file
    /// can be opened again by its path).</exception>
    /// <exception cref="InvalidOperationException">Called inside an operation of another <see cref="BufferedDurableHeap"/>
    /// on the same thread, or while another Dispose of this heap runs (its last advance waits for this heap's version,
    /// which a thread nesting the two heaps in the other order could hold for ever): nothing is disposed. Or: called from
    /// a deferred action of this heap's epoch (<see cref="VersionScheme"/>'s epoch), whose drain may hold the transition
    /// its last advance waits for: nothing is disposed. Or: called
    /// inside a call of the heap's file on the same thread (a
    /// <see cref="PersistentHeap.ForEachAllocated"/> visitor of <see cref="Heap"/>, say), which goes on using the mapping
    /// once its callback returns: nothing is disposed. Or: called on a thread that is running one of the heap's advance cycles
    /// (from a callback such as a <see cref="EpochProtectedVersionScheme.StateMachineFaulted"/> handler on the advancer's
    /// thread): nothing is disposed, and the heap can be disposed from another thread. Or: called on the thread of a
    /// Dispose of this heap that is still running (from a callback inside it), which cannot complete before this call
    /// returns; that Dispose completes regardless. Or: called inside an operation while another thread's Dispose runs,
    /// which waits for that operation to end (end it; the other Dispose completes then). Or: the last advance failed or could not run (an advance cycle failed
    /// earlier, see <see cref="BeginOperation"/>; or, in <see cref="DurabilityMode.Buffered"/> and
    /// <see cref="DurabilityMode.Strict"/> mode, Dispose was called inside an operation): operations after
    /// <see cref="DurableFrontier"/> are not durable. The heap is closed anyway, without a clean-shutdown mark;
    /// recovery keeps the frontier prefix. The message also says when a thread was still inside an operation (the
    /// mapping was then quarantined, as for <see cref="TimeoutException"/>).</exception>
    /// <exception cref="ThreadInterruptedException">The call waited for another Dispose and was interrupted.</exception>
    public void Dispose()
    {
        RefuseDisposeOnThisThread();

        // Interlocked.Exchange: full fence; exactly one caller disposes.
        if (Interlocked.Exchange(ref _disposed, 1) != 0)
        {
            // Another Dispose closes the heap: return once it has (a call from inside it, on its thread, throws; so does a
            // call inside an operation, which that Dispose waits for: the first version of this wait hung there).
            _disposal.WaitForCompletion(nameof(BufferedDurableHeap), insideOperation: _scheme.Epoch.ThisInstanceProtected());
            return;
        }

        _disposal.Begin();

        // This Dispose stops the background threads (see the finalizer).
        GC.SuppressFinalize(this);

        // All of it runs to its end if the thread is interrupted: its waits absorb the interrupt, requested again when
        // Dispose ends (an interrupt an inner shield absorbed used to be requested again inside it, and break a later wait).
        using InterruptShield.Scope shield = InterruptShield.Enter();
        try
        {
            if ((_faults & DurabilityFaults.SyncWaitsThroughDispose) == 0)
            {
                _cycleWaitsEnd.Cancel();
            }

            // Operations waiting in the scheme for a transition give up (they would find the heap disposed once in).
            RefuseEntry();
            _scheme.TransitionStalled -= OnTransitionStalled;
            StopWatchingTheStall();

            DisposeCore();
        }
        finally
        {
            _disposal.Complete();
        }
    }

    /// <summary>
    /// <see cref="Dispose"/> without blocking the caller: the refusals that depend on the calling thread (inside a cycle,
    /// a deferred action of the heap's epoch, a call of the heap's file, or an operation of another heap) are made here,
    /// on the caller's thread, and the rest of Dispose — its waits for the operations in flight (up to
    /// <see cref="BufferedDurableHeapOptions.SyncTimeout"/>), for the last advance's write-back and fence, and for the
    /// background threads — runs on a thread-pool thread. Called inside an operation of this heap, or from a callback inside
    /// a Dispose of it, Dispose runs on the calling thread, as <see cref="Dispose"/> does there (it cannot wait for what the
    /// caller holds).
    /// </summary>
    /// <returns>A task that completes once the heap is closed, or faults with what <see cref="Dispose"/> throws (a refusal
    /// included: nothing is disposed then).</returns>
    public ValueTask DisposeAsync() =>
        AsyncDisposal.Run(RefuseDisposeOnThisThread, () => DisposeAsyncOnTheCallerForTesting || _disposal.OnTheDisposingThread || _scheme.Epoch.ThisInstanceProtected(), Dispose);

    /// <summary>Broken control for tests: <see cref="DisposeAsync"/> runs all of Dispose on the caller's thread, which then waits as Dispose does.</summary>
    internal bool DisposeAsyncOnTheCallerForTesting { get; set; }

    /// <summary>The refusals of <see cref="Dispose"/> that depend on the calling thread, made before anything changes.</summary>
    private void RefuseDisposeOnThisThread()
    {
        if (Monitor.IsEntered(_cycleGate))
        {
            // A callback raised inside a cycle on this thread (a VersionScheme.StateMachineFaulted handler on the
            // advancer's thread, say): Dispose would wait for the cycle it is called from (the advancer's join timed out
            // after 30 s, then the heap closed under the cycle still running). Refused before anything changes.
            ThrowDisposeInsideCycle();
        }

        // From a deferred action of the heap's epoch: its last advance could wait for a transition pending behind that
        // action in the same drain. Refused before anything changes.
        ThrowIfDraining(nameof(Dispose));

        // Inside a call of the heap file on this thread (a ForEachAllocated visitor of Heap, say): refused before
        // anything changes (see HeapFile.ThrowIfDisposeInsideACall).
        _heap.File.ThrowIfDisposeInsideACall();

        // Inside an operation of another heap: the last advance waits for this heap's version, which a thread inside an
        // operation of this heap disposing that one (or syncing it) holds back for ever, as it holds this one's. Refused
        // before anything changes, as Sync is there. (Inside an operation of this heap, Dispose closes it: see above.)
        RefuseDisposeInsideAnotherHeapsOperation();
    }

    /// <summary>The test hooks of the Dispose that waits for another one.</summary>
    internal DisposalGate DisposalForTesting => _disposal;

    /// <remarks>Every wait here absorbs an interrupt (Dispose's shield; requested again when Dispose ends):
    /// thrown from one of them, it skipped the closing of the heap and the file (mapped and locked for good: a later
    /// Dispose does nothing).</remarks>
    private void DisposeCore()
    {
        // A failure before the closing below (stopping the advancer, taking the gate: both may allocate) is this Dispose's
        // failure like a failed last advance: it used to escape with the file mapped and locked for good.
        Exception? failure;
        try
        {
            failure = StopBackgroundThreads();
        }
        catch (Exception e)
        {
            failure = e;
        }

        // From here on only this thread runs advance cycles: a thread that passed its disposed check before the flag
        // and waits for the cycle gate (back-pressure) would otherwise run one after this Dispose's last, while the heap
        // is being unmapped. Set under the gate when it comes within the timeout, so a cycle already running finishes
        // first (one stuck behind a straggler keeps the gate; the last advance below then times out and says so).
        // One deadline for this and the last advance below, so that Dispose waits at most SyncTimeout for both.
        long deadline = Deadline(_syncTimeout);
        bool gated;
        try
        {
            gated = InterruptShield.TryLock(_cycleGate, CycleGateWait(Remaining(deadline)));
        }
        catch (Exception e)
        {
            gated = false;
            failure ??= e;
        }

        // Volatile.Write: read under the gate by RunCycle (Volatile.Read there, as this write may come without it).
        Volatile.Write(ref _disposingThread, Environment.CurrentManagedThreadId);
        if (gated)
        {
            ExitCycleGate();
        }

        bool machineInFlight = false;
        bool cyclesEnded = false;
        bool drained = false;
        bool released = false;
        bool disposeTimedOut = false; // the Dispose's own wait for the operations (its message says so), not the final Sync's
        bool lastAdvanceDone = false;
        try
        {
            // Not for an operation that can never end (a thread exited inside it): the heap fails first, so the last advance
            // below does not wait for that version; it still writes back a version whose cut came before it.
            if (_mode != DurabilityMode.Transient && failure is null && (_faults & DurabilityFaults.DisposeAdvancesPastAnExitedThread) == 0)
            {
                FailIfAThreadExitedInsideAnOperation();
            }

            if (_mode != DurabilityMode.Transient && failure is null)
            {
                // An interrupt breaks the cycle's waits, not the cycle (a transition left in flight is the next one's):
                // go on with the time left.
                long version = CurrentVersion;
                while (true)
                {
                    try
                    {
                        SyncCore(version, Remaining(deadline), nameof(Dispose));
                        lastAdvanceDone = true;
                        break;
                    }
                    catch (ThreadInterruptedException) when (InterruptShield.Absorbs())
                    {
                    }
                }

                SavedStateFailure = SaveStateForReopen();
            }
        }
        catch (Exception e)
        {
            failure = e;
        }
        finally
        {
            // The file is closed and its lock released whatever happens in this block (an allocation failure in it used to
            // skip the closing: the file stayed mapped and locked for good, and a later Dispose did nothing). Until the
            // operations are known to have drained, closing quarantines the mapping and leaves no clean-shutdown mark.
            try
            {
                // Not taken (see CycleGateWait): a transition may be in flight, so the scheme is left to the collector.
                if (InterruptShield.TryLock(_cycleGate, CycleGateWait(Timeout.InfiniteTimeSpan)))
                {
                    // No cycle runs now, and none will (only this thread runs them since the flag above).
                    cyclesEnded = true;
                    try
                    {
                        machineInFlight = _inflight is not null;
                    }
                    finally
                    {
                        ExitCycleGate();
                    }
                }
                else
                {
                    machineInFlight = true;
                }

                AfterDisposeClosedCyclesForTesting?.Invoke();

                // After the last advance, every SyncAsync still waiting is one that began before this Dispose (a later one
                // is refused): the operations it covers completed before it, so in a version at or below the one that advance
                // made durable, though its target, read after the advance's transition, may be the version above (it was
                // failed as if its operations were lost).
                if (lastAdvanceDone && (_faults & DurabilityFaults.DisposeFailsCoveredWaiters) == 0)
                {
                    CompleteWaiters(long.MaxValue);
                }

                // SyncAsync waiters the last advance did not complete (it failed, or did not run) would otherwise wait for
                // ever (an infinite SyncTimeout) or time out against a disposed heap.
                FailWaiters(new ObjectDisposedException(nameof(BufferedDurableHeap), "The heap was disposed before this SyncAsync's operations became durable."), close: true);

                // No operation may still be inside the mapping when it is unmapped: wait (briefly if the sync already
                // waited its full timeout) until every thread that entered before the flag has left.
                // (Not for a thread that exited inside an operation: it never ends its operation.)
                string? exited = FailIfAThreadExitedInsideAnOperation();
                drained = exited is null && WaitForOperations(failure is TimeoutException ? TimeSpan.FromMilliseconds(100) : _syncTimeout);
                if (!drained)
                {
                    exited ??= FailIfAThreadExitedInsideAnOperation();
                    disposeTimedOut = failure is null;
                    failure ??= new TimeoutException(exited is null
                        ? $"BufferedDurableHeap.Dispose: a thread stayed inside an operation for {_syncTimeout.TotalSeconds:0.#} s; the heap was closed without unmapping under it (see the remarks of Dispose)."
                        : $"BufferedDurableHeap.Dispose: the heap was closed without unmapping under the operation left open. {exited}");
                }

                if (failure is not null)
                {
                    // Whatever was not made durable is not there after the next open: that open must not be told the
                    // previous one shut down cleanly (nor may a caller-owned file say so when its owner disposes it).
                    _heap.File.ForgoCleanShutdown();
                }

                // A background thread that did not stop may still run a cycle or a stocking through all of it: closed as
                // with a thread still inside an operation (the file quarantined, not unmapped, and no other heap on it).
                released = drained && !BackgroundMayStillWrite;
                if (!machineInFlight && released)
                {
                    DisposeScheme();
                }

                // An operation a thread left open here (never disposed) no longer counts as one inside another heap for it.
                // Volatile.Read: acquire; pairs with the release in RegisterThread.
                foreach (ThreadBuffers left in Volatile.Read(ref _registry))
                {
                    left.MarkHeapDisposed();
                }

                if (released)
                {
                    _local.Dispose();
                }
            }
            finally
            {
                try
                {
                    _heap.Dispose(released, fileClosesNext: _ownsFile);
                }
                finally
                {
                    if (_ownsFile)
                    {
                        _heap.File.Dispose(released);

                        // Quarantined for a thread left inside an operation: freed once the threads inside now have left
                        // the scheme, and then the file's calls (a transition still in flight reaches the file through
                        // them). Not when a background thread may still write, nor when a cycle may still run (the gate
                        // was not had above): a cycle is inside neither epoch, and writes through the mapping.
                        if (!released && !_backgroundStillRunning && cyclesEnded)
                        {
                            _heap.File.ReleaseQuarantineOnceLeft(_scheme.Epoch);
                        }
                    }
                }
            }
        }

        if (failure is TimeoutException && _backgroundStillRunning)
        {
            throw new TimeoutException($"{failure.Message} The heap is closed without it, as with a thread left inside an operation: a file the heap opened is quarantined (not unmapped under the thread), a file of the caller's hosts no other heap (dispose it; the file can be opened again by its path). The file has no clean-shutdown mark; a reopen recovers at least up to version {DurableFrontier}.", failure);
        }

        if (disposeTimedOut)
        {
            throw failure!;
        }

        if (failure is TimeoutException)
        {
            // The final Sync's timeout, whose message speaks of Sync and of waiting longer: say what happened to the heap.
            string straggler = drained ? string.Empty : " A thread was still inside an operation: the mapping was quarantined, not unmapped under it.";
            throw new TimeoutException($"BufferedDurableHeap.Dispose: the heap is closed (the file has no clean-shutdown mark; a reopen recovers at least up to version {DurableFrontier}; a second Dispose does nothing).{straggler} Its final Sync timed out: {failure.Message}", failure);
        }

        if (failure is not null)
        {
            string straggler = drained ? string.Empty : " A thread was still inside an operation: the mapping was quarantined, not unmapped under it.";
            throw new InvalidOperationException($"BufferedDurableHeap.Dispose: the heap is closed, but operations after version {DurableFrontier} were not made durable: {failure.Message} (The file has no clean-shutdown mark; a reopen recovers up to that version.){straggler}", failure);
        }
    }

    /// <summary>An advancer or stocker that did not stop may still write through the file (the broken control says not).</summary>
    private bool BackgroundMayStillWrite => _backgroundStillRunning && (_faults & DurabilityFaults.ReleaseTheFileUnderARunningBackgroundThread) == 0;

    /// <summary>
    /// How long Dispose waits for the cycle gate: <paramref name="wait"/>, or not at all once the advancer or the stocker
    /// did not stop (an advancer stuck inside its cycle holds the gate for ever, and no last advance runs after it anyway).
    /// </summary>
    private TimeSpan CycleGateWait(TimeSpan wait) => _backgroundStillRunning ? TimeSpan.Zero : wait;

    /// <summary>
    /// Disposes the version scheme once the operations have drained. A thread that begins an operation after the wait
    /// for operations sees the disposed flag and leaves at once, without touching the mapping; while it is still
    /// inside the scheme refuses to be disposed, so retry (briefly) instead of failing the whole Dispose. If the scheme
    /// still refuses (a thread holds the public <see cref="VersionScheme"/> itself), it is left to the collector; the
    /// file is closed regardless.
    /// </summary>
    private void DisposeScheme()
    {
        TimeSpan bound = TimeSpan.FromSeconds(30);
        long deadline = Deadline(_syncTimeout == Timeout.InfiniteTimeSpan || _syncTimeout > bound ? bound : _syncTimeout);
        var spinner = new SpinWait();
        while (true)
        {
            try
            {
                _scheme.Dispose();
                return;
            }
            catch (InvalidOperationException) when (Remaining(deadline) > TimeSpan.Zero && (_faults & DurabilityFaults.DisposeSchemeOnce) == 0)
            {
                InterruptShield.SpinOnce(ref spinner); // sleeps at times
            }
            catch (InvalidOperationException) when ((_faults & DurabilityFaults.DisposeSchemeOnce) == 0)
            {
                return;
            }
        }
    }

    private bool WaitForOperations(TimeSpan timeout)
    {
        if (_scheme.Epoch.ThisInstanceProtected())
        {
            // Dispose from inside an operation: that operation is in flight by definition.
            return false;
        }

        if ((_faults & DurabilityFaults.SkipDisposeWait) != 0)
        {
            return true;
        }

        try
        {
            // The action runs once every thread protected before the bump has left: waited for in slices, looking between
            // them for a thread that exited inside an operation (it never leaves: no use waiting the whole timeout).
            Task left = _scheme.Epoch.BumpCurrentEpochAsync(static () => { });
            long deadline = Deadline(timeout);
            while (true)
            {
                if (InterruptShield.WaitFor(left, Slice(deadline)))
                {
                    return true;
                }

                if (Remaining(deadline) == TimeSpan.Zero || FailIfAThreadExitedInsideAnOperation(looking: true) is not null)
                {
                    return false;
                }
            }
        }
        catch (AggregateException)
        {
            return false;
        }
        catch (ObjectDisposedException)
        {
            // The scheme's epoch was disposed under the heap (this Dispose disposes it only later). It refuses to be disposed
            // while any thread is protected, and no thread can enter it afterwards, so no operation is in flight: the
            // mapping can be unmapped. (This used to report a thread still inside an operation, and quarantine the mapping.)
            return true;
        }
    }

    /// <summary>
    /// Records a block the operation allocated in <paramref name="version"/>: in the version's list, which the cycle that
    /// ends the version writes back (<see cref="DurabilityMode.Buffered"/>) and seals (both durable modes), and in
    /// <see cref="DurabilityMode.Strict"/> also in the operation's own list, written back when it ends.
    /// </summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    internal void Track(ThreadBuffers buffers, long version, PayloadRef block)
    {
        if (_mode == DurabilityMode.Transient)
        {
            return;
        }

        // The operation's list first: should the second append fail (out of memory), the block is written back and not
        // sealed, never sealed without being written back.
        if (_mode == DurabilityMode.Strict)
        {
            buffers.StrictPending.Add(block.Offset);
        }

        // (The broken control leaves strict payloads out of the version's list: never sealed.)
        if (_mode == DurabilityMode.Buffered || (_faults & DurabilityFaults.LeaveStrictPayloadsUnsealed) == 0)
        {
            buffers.WriteBack[ThreadBuffers.Slot(version)].Add(block.Offset);
        }
    }

    /// <summary>
    /// Records an update in place of a block of the operation's own version: <see cref="DurabilityMode.Strict"/> writes
    /// it back again when the operation ends. (It is in its version's list already: it was allocated in this version.)
    /// </summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    internal void TrackRewrite(ThreadBuffers buffers, PayloadRef block)
    {
        if (_mode == DurabilityMode.Strict)
        {
            buffers.StrictPending.Add(block.Offset);
        }
    }

    /// <summary>Undoes the <see cref="Track"/> of <paramref name="block"/>, the last block this thread tracked for <paramref name="version"/>.</summary>
    internal void Untrack(ThreadBuffers buffers, long version, PayloadRef block)
    {
        if (_mode == DurabilityMode.Transient)
        {
            return;
        }

        bool inVersionList = _mode == DurabilityMode.Buffered || (_faults & DurabilityFaults.LeaveStrictPayloadsUnsealed) == 0;
        if ((inVersionList && !buffers.WriteBack[ThreadBuffers.Slot(version)].RemoveLast(block.Offset))
            || (_mode == DurabilityMode.Strict && !buffers.StrictPending.RemoveLast(block.Offset)))
        {
            ThrowHelper.ThrowInvalidOperation($"Internal error: {block} was not the last block tracked by this operation.");
        }
    }

    internal DurabilityFaults Faults => _faults;

    /// <summary>
    /// <see cref="DurableRecoveryReport.SalvagedThrough"/>: the structures resolve what a salvage left among payloads of
    /// this version or older, whether or not they were opened in the salvaging session (the word changes only at recovery).
    /// </summary>
    internal long SalvagedThrough => Recovery.SalvagedThrough;

    /// <summary>Broken control for tests: a structure's salvage resolution takes any two payloads of Equal keys for a salvage's
    /// leftover, whatever their bytes (as it used to: a map opened with a key type of the same size and another equality
    /// deleted entries for good).</summary>
    internal bool SalvageAnyEqualKeysForTesting { get; set; }

    /// <summary>Bytes of replaced and deleted payloads not yet freed, over all threads (approximate while they run).</summary>
    internal long ReclaimBacklog
    {
        get
        {
            long backlog = 0;
            // Volatile.Read: acquire; pairs with the release in RegisterThread.
            foreach (ThreadBuffers buffers in Volatile.Read(ref _registry))
            {
                // Volatile.Read: acquire, and untorn on a 32-bit runtime; RetiredBytes is the owner's counter (a stale
                // value only delays help), ReclaimedBytes pairs with the Volatile.Write in Collect.
                backlog += Volatile.Read(ref buffers.RetiredBytes) - Volatile.Read(ref buffers.ReclaimedBytes);
            }

            return backlog;
        }
    }

    // An eighth of the heap: the floor is small, so that on a small heap the limit stays a fraction of it (a 1 MiB
    // floor was the whole of a 1 MiB heap, which fast writers then filled with replaced payloads).
    internal long BacklogLimit => _backlogLimit != 0 ? _backlogLimit : Math.Max(64L * 1024, _heap.File.Size / 8);

    /// <summary>
    /// The slow path of <see cref="BeginOperation"/>, every BacklogLimit / 16 retired bytes and every
    /// <see cref="LagCheckInterval"/> operations of this thread: if the backlog over all threads exceeds the limit, help
    /// the advancer (up to a few advances) before entering; if the current version has run for longer than
    /// <see cref="BufferedDurableHeapOptions.MaxVersionAge"/> (the advancer fell behind), run the advance that ends it.
    /// </summary>
    [MethodImpl(MethodImplOptions.NoInlining)]
    private void ApplyBackPressure(ThreadBuffers buffers)
    {
        // The cycles run here, and the wake of the version's waiters after a help, run to their end if the thread is
        // interrupted (see InterruptShield); a wait for a version's cut that throws has changed nothing.
        using InterruptShield.Scope shield = InterruptShield.Enter();
        long limit = BacklogLimit;
        buffers.NextBacklogCheck = buffers.RetiredBytes + Math.Max(4 * 1024, limit / 16);
        buffers.OperationsUntilCheck = LagCheckInterval;

        // After a failed cycle nothing is reclaimed any more, so the backlog never falls: helping would only run into
        // the failure again (and make the reads that are still allowed throw it).
        if ((_faults & DurabilityFaults.NoBackPressure) != 0 || _advancerFault is not null || _scheme.Epoch.ThisInstanceProtected() || _scheme.Epoch.ThisInstanceDraining())
        {
            // (Nested operations cannot help: the advance would wait for the enclosing one. Nor can an operation of a
            // deferred action of the heap's epoch: the advance would wait for a transition pending in that drain.)
            return;
        }

        if (ReclaimBacklog <= limit)
        {
            HelpOldVersion();
            return;
        }

        ThrowIfDisposed();
        BeforeBackPressureCyclesForTesting?.Invoke();
        long deadline = Deadline(_syncTimeout);
        long started = System.Diagnostics.Stopwatch.GetTimestamp();
        try
        {
            // A payload retired in v is freed when the frontier passes v + 1: a few advances free the whole backlog.
            for (int i = 0; i < ThreadBuffers.Slots && ReclaimBacklog > limit / 2; i++)
            {
                RunCycle(long.MaxValue, deadline, _syncTimeout);
            }
        }
        catch (TimeoutException)
        {
            // Another thread stays inside an operation: nothing can be reclaimed now; carry on (an allocation may
            // then find the heap full, which is what the limit tries to prevent, not guarantee).
        }
        finally
        {
            CountBackPressure(started);
        }
    }

    /// <summary>After <see cref="Dispose()"/>: why no state was saved for a fast reopen; null when it was saved.</summary>
    internal string? SavedStateFailure { get; private set; } = "not disposed yet";

    /// <summary>
    /// At a clean shutdown, after the final advance: reclaims what is still waiting (two more advances at most), so
    /// that the allocated blocks are exactly the live payloads, and saves the allocator state for a fast reopen.
    /// </summary>
    private string? SaveStateForReopen()
    {
        long deadline = Deadline(_syncTimeout);
        for (int i = 0; i < ThreadBuffers.Slots && !Drained(); i++)
        {
            RunCycle(long.MaxValue, deadline, _syncTimeout);
        }

        if (!Drained())
        {
            return "payloads were still waiting for reclamation";
        }

        // Every deferred free made durable: the allocated blocks are exactly the live payloads.
        using (InterruptShield.Hold(_cycleGate))
        {
            _heap.FlushPendingFrees();
        }

        WakeCycleGateWaiters(released: true);

        return _heap.TrySaveStateForReopen();
    }

    private bool Drained()
    {
        // Volatile.Read: acquire; pairs with the release in RegisterThread.
        foreach (ThreadBuffers buffers in Volatile.Read(ref _registry))
        {
            if (!buffers.IsDrained)
            {
                return false;
            }
        }

        return true;
    }

    /// <summary>
    /// Under the cycle gate, after a cycle drained what it could: forgets the buffers of threads that have exited with
    /// nothing left to write back or reclaim, and gives their allocator caches' free blocks back to the pools. Without
    /// it every thread that ever operated on the heap stayed registered (about 25 KB of memory each, walked by every
    /// cycle) with its cached free blocks, so short-lived threads grew the file to its maximum size and the process's
    /// memory without bound.
    /// </summary>
    private void ForgetExitedThreads()
    {
        if ((_heap.Faults & HeapFaults.KeepExitedThreadCaches) != 0)
        {
            return;
        }

        using (InterruptShield.Hold(_registryGate))
        {
            // Join(0): true once the thread has terminated, and a synchronization with its end (its last appends and its
            // operation count are visible). Drained by the cycles, an exited thread's buffers never fill again. (The
            // broken control does not check that they are drained: writes of the version after the cut are lost.)
            // Published with a release write, as in RegisterThread; a drained thread's retired and reclaimed bytes are
            // equal, so the backlog does not change.
            bool ignoreDrain = (_faults & DurabilityFaults.ForgetUndrainedExitedThreads) != 0;
            CopyOnWriteArray.RemoveAll(ref _registry, buffers =>
                !buffers.Owner.IsAlive && buffers.Owner.Join(0) && !buffers.HasOpenOperations && (buffers.IsDrained || ignoreDrain));
        }

        _heap.ReleaseExitedThreadCaches();
    }

    /// <summary>How many threads the heap keeps buffers for (tests: exited threads' are forgotten).</summary>
    internal int RegisteredThreadsForTesting => Volatile.Read(ref _registry).Length;

    internal PersistentHeap Allocator => _heap;

    internal void EndOperation(ThreadBuffers buffers)
    {
        try
        {
            if (_mode == DurabilityMode.Strict && buffers.StrictPending.Count != 0)
            {
                // Emptied only when the outermost operation ends: the list is the thread's, so a nested operation's end
                // writes back its enclosing operations' payloads too, as they are now, and they must be written back
                // again when those end (they may still write them). A nested end used to empty it: an enclosing
                // operation's later stores were never written back, and the cycle sealed them over stale bytes.
                WriteBackStrict(buffers.StrictPending, outermost: !buffers.HasOpenOperations);
            }
        }
        finally
        {
            // Left even when the write-back failed (the medium's error goes to the caller): a thread left protected
            // would hold back every version transition.
            _scheme.Leave();
        }
    }

    /// <summary>Test hook: runs in a <see cref="DurabilityMode.Strict"/> operation's end before it writes back its payloads; a throw is a failed write-back.</summary>
    internal Action? BeforeStrictWriteBackForTesting { get; set; }

    /// <summary>Strict mode: payloads whose operation's write-back failed, for the next advance cycle to write back (see <see cref="WriteBackStrict"/>).</summary>
    private readonly List<long> _strictCarried = new();

    /// <summary>
    /// Strict mode: writes back and fences the payloads the thread's operations wrote (the ending one's and, when it is
    /// nested, its enclosing operations' so far), inside its region; the list is emptied when the outermost operation
    /// ends (<paramref name="outermost"/>). If that fails,
    /// the operation throws the medium's error and its payloads go to the advance cycles, before it leaves its region:
    /// the cycle that ends its version (or an earlier one) writes them back before it persists a frontier over them,
    /// and fails — the advancer's fault — if it cannot (see <see cref="WriteBackCarriedStrictPayloads"/>). They used to
    /// stay with the thread until its next operation, while cycles moved the frontier over their version: a Sync that
    /// returned claimed them durable, and a thread that never operated again never wrote them back.
    /// </summary>
    private void WriteBackStrict(OffsetList pending, bool outermost)
    {
        // The operation's durability: not given up for an interrupt of the thread (see InterruptShield).
        using InterruptShield.Scope shield = InterruptShield.Enter();
        try
        {
            BeforeStrictWriteBackForTesting?.Invoke();
            for (int i = 0; i < pending.Count; i++)
            {
                long offset = pending[i];
                _domain.WriteBackOwned(offset, HeapLayout.HeaderSize + (long)PayloadSize(offset));
            }

            _domain.FenceOwned();
        }
        catch
        {
            // (The broken control leaves them with the thread, for its next operation, if any.)
            if ((_faults & DurabilityFaults.KeepFailedStrictPayloadsWithThread) == 0)
            {
                using (InterruptShield.Hold(_strictCarried))
                {
                    for (int i = 0; i < pending.Count; i++)
                    {
                        _strictCarried.Add(pending[i]);
                    }
                }

                if (outermost)
                {
                    // Only at the outermost end: the enclosing operations may still store into these blocks (a carried copy
                    // may be written back by the cycle of an earlier version, before those stores), so their own end
                    // writes them back again.
                    pending.Clear();
                }
            }

            throw;
        }

        if (outermost)
        {
            pending.Clear();
        }
    }

    /// <summary>
    /// Strict mode, in an advance cycle before it persists the frontier: writes back and fences the payloads of operations
    /// whose own write-back failed. Each was handed over inside its operation's region, so before the cut of its version;
    /// none is freed before the cycle after that version's (a payload retired in version w is freed two cycles later), so
    /// each is still the allocated block its operation wrote. A failure here is the cycle's (the advancer's) fault.
    /// </summary>
    private void WriteBackCarriedStrictPayloads()
    {
        long[] carried;
        using (InterruptShield.Hold(_strictCarried))
        {
            if (_strictCarried.Count == 0)
            {
                return;
            }

            carried = _strictCarried.ToArray();
            _strictCarried.Clear();
        }

        foreach (long offset in carried)
        {
            _domain.WriteBackOwned(offset, HeapLayout.HeaderSize + (long)PayloadSize(offset));
        }

        // In the cycle's write-back time, so its fence is among the cycle's fences.
        Fence();
    }

    /// <summary>The payload size recorded in the header of an allocated block (no checks: internal callers hold a valid reference).</summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    internal int PayloadSize(long offset) => HeapLayout.ShapeSize(*(ulong*)(_base + offset + HeapLayout.ShapeOffset));

    /// <summary>The payload bytes of an allocated block (no checks: internal callers hold a valid reference inside an operation).</summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    internal Span<byte> PayloadUnchecked(long offset) => new(_base + offset + HeapLayout.HeaderSize, PayloadSize(offset));

    /// <summary>The first payload byte of an allocated block (no checks: internal callers hold a valid reference inside an operation).</summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    internal byte* PayloadPointer(long offset) => _base + offset + HeapLayout.HeaderSize;

    /// <summary>The header's uid and epoch tag of an allocated block.</summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    internal (long Uid, long Tag, int TypeId) HeaderWords(long offset)
    {
        ulong* h = (ulong*)(_base + offset);
        return ((long)h[0], (long)h[1], HeapLayout.ShapeTypeId(h[2]));
    }

    private static BufferedDurableHeap Own(HeapFile file, BufferedDurableHeapOptions? options)
    {
        try
        {
            RefuseTransientOverDurableData(file, options?.Mode ?? DurabilityMode.Buffered);
        }
        catch
        {
            // Refused before anything was read or written beyond the superblock: a cleanly closed file closes with its
            // clean-shutdown mark back (the next open is still a fast one), a crashed one without (as it came).
            if (!file.WasCleanShutdown)
            {
                file.ForgoCleanShutdown();
            }

            file.Dispose();
            throw;
        }

        try
        {
            var heap = new BufferedDurableHeap(file, ownsFile: true, options);
            return heap;
        }
        catch
        {
            // A failed open closed nothing in order: the file keeps the clean-shutdown word the open cleared, so the next
            // open does not report a clean shutdown the file never had (a crashed file refused as damaged used to read
            // as cleanly closed afterwards). Everything recovery wrote was persisted as it went.
            file.ForgoCleanShutdown();
            file.Dispose();
            throw;
        }
    }

    private ThreadBuffers RegisterThread()
    {
        var buffers = new ThreadBuffers(Environment.CurrentManagedThreadId);
        using (InterruptShield.Hold(_registryGate))
        {
            // Released: the advancer's acquire read of the array sees the initialized buffers.
            CopyOnWriteArray.Append(ref _registry, buffers);
        }

        return buffers;
    }

    [DoesNotReturn]
    [MethodImpl(MethodImplOptions.NoInlining)]
    private void ThrowSchemeGone(ObjectDisposedException e)
    {
        // The heap's own ObjectDisposedException if it is disposed (or being disposed): the other objects are its parts.
        ThrowIfDisposed();
        throw new InvalidOperationException($"No operation begins on this heap any more: its version scheme, or the scheme's epoch, was disposed under it (BufferedDurableHeap.VersionScheme is for diagnostics: dispose neither), so no operation can enter it. Dispose the heap and reopen the file: recovery keeps every version up to DurableFrontier ({DurableFrontier} now).", e);
    }

    /// <summary>What the heap says when its version scheme, or the scheme's epoch, was disposed under it.</summary>
    private const string SchemeDisposedUnderHeap = "The heap's version scheme was disposed under it, or the scheme's epoch was (BufferedDurableHeap.VersionScheme is for diagnostics: dispose neither), so no version can end and nothing more can become durable: dispose the heap and reopen the file.";

    [DoesNotReturn]
    [MethodImpl(MethodImplOptions.NoInlining)]
    private void ThrowNotBegun()
    {
        ThrowIfDisposed();
        Exception fault = _advancerFault!;
        throw new InvalidOperationException($"No operation begins on this heap any more: an advance cycle failed or can never complete, so nothing more can become durable (DurableFrontier stays at {DurableFrontier}; dispose the heap and reopen the file to recover up to it): {fault.Message}", fault);
    }

    [DoesNotReturn]
    [MethodImpl(MethodImplOptions.NoInlining)]
    private static void ThrowDisposeInsideCycle() =>
        ThrowHelper.ThrowInvalidOperation("BufferedDurableHeap.Dispose was called on a thread that is running one of the heap's advance cycles (the background advancer, or a Sync, AdvanceVersion or back-pressure help in progress on this thread), from a callback such as a VersionScheme.StateMachineFaulted handler. Dispose waits for the cycle, which cannot end before the callback returns. Nothing was disposed: dispose the heap from another thread (for example Task.Run(heap.Dispose)).");

    internal void ThrowIfDisposed()
    {
        // Volatile.Read: acquire; pairs with the exchange in Dispose (best effort: use during Dispose is misuse).
        if (Volatile.Read(ref _disposed) != 0)
        {
            ThrowHelper.ThrowObjectDisposed(this);
        }
    }
}
