using System;
using System.Collections.Generic;
using System.Diagnostics.CodeAnalysis;
using System.Linq;
using System.Runtime.CompilerServices;
using System.Threading;
using System.Threading.Tasks;

namespace Epvs.Persistence;

// Threads that exited inside an operation, and the operations that wait for them.
// A thread that exits with an operation open (a DurableOperation it never disposed) stays inside the
// version scheme's region for good: nothing can make it leave. The transition out of its version then never completes,
// so no later version becomes durable, and every operation that begins waits in the scheme for that transition — for
// ever, and past the heap's Dispose, which cannot dispose a scheme with a thread inside. Operations therefore enter with
// a token (EpochProtectedVersionScheme.Enter(CancellationToken)) that ends their wait when the heap
// refuses entry: at Dispose, and as soon as the heap finds such a thread (a stalled transition's report, a Sync that
// timed out, Dispose). The heap then fails as a failed cycle does, naming the thread; its operation's version, never
// cut, is not in the durable prefix, so reopening the file recovers a consistent state without it.
public sealed partial class BufferedDurableHeap
{
    /// <summary>Cancelled when no operation may enter any more (Dispose began, or a thread exited inside an operation):
    /// ends the waits of operations blocked in the scheme behind a transition that may never complete.</summary>
    private readonly CancellationTokenSource _entryRefused = new();

    /// <summary><see cref="_entryRefused"/>'s token, read once (its property checks for disposal on every read).</summary>
    private readonly CancellationToken _entryToken;

    /// <summary>The threads that exited with an operation of this heap open (empty almost always).</summary>
    private List<int> ThreadsExitedInsideOperations()
    {
        var exited = new List<int>();
        // Volatile.Read: acquire; pairs with the release publication of a thread's buffers (RegisterThread).
        foreach (ThreadBuffers buffers in Volatile.Read(ref _registry))
        {
            // Join(0): true once the thread has terminated, and a synchronization with its end (its operation count is
            // visible). Only its owner ends an operation, so one open now stays open for good.
            if (!buffers.Owner.IsAlive && buffers.Owner.Join(0) && buffers.HasOpenOperations)
            {
                exited.Add(buffers.Owner.ManagedThreadId);
            }
        }

        return exited;
    }

    /// <summary>Why the heap fails when <paramref name="threads"/> exited inside an operation.</summary>
    private string ExitedInsideOperations(List<int> threads) =>
        $"{(threads.Count == 1 ? "Thread" : "Threads")} {string.Join(", ", threads)} exited inside an operation of this heap (a DurableOperation that was never disposed). A thread that has exited can never end its operation, so the version transition that waits for it never completes" +
        (_mode == DurabilityMode.Transient
            ? ". No operation begins on this heap any more: dispose it."
            : " and nothing after the durable frontier can become durable (a version whose operations all ended before it is still written back). No operation begins on this heap any more: dispose it and reopen the file (recovery keeps every version up to the durable frontier; the unfinished operation's version is not among them).");

    /// <summary>Why the heap failed if a thread exited inside an operation (null otherwise): what a refused entry says.</summary>
    private string? _exitedInsideOperation;

    /// <summary>The fault recorded for a thread that exited inside an operation (null otherwise).</summary>
    private Exception? _exitedFault;

    /// <summary>Whether <paramref name="fault"/>, the heap's fault read with an acquire, is that of a thread that exited inside
    /// an operation: a failure that leaves every version whose cut came before it writable (see <see cref="FinishACutThatCame"/>).</summary>
    /// <remarks>The caller reads the heap's fault first and passes it: the exited fault is stored (a full fence) before it is
    /// recorded as the heap's fault, so a reader whose acquire saw the heap's fault sees the exited one too. Read the other
    /// way round, or the heap's fault with a plain load, an ARM64 core may satisfy the exited fault's load first (still null)
    /// and the heap's fault's after both stores: an exited thread's fault taken for a failed cycle, and the version whose
    /// cut came left unwritten.</remarks>
    private bool IsExitedFault(Exception fault) => ReferenceEquals(fault, Volatile.Read(ref _exitedFault));

    /// <summary>
    /// Under the cycle gate, after the heap failed because a thread exited inside an operation: if the transition in flight
    /// has completed (its cut came: every operation of its version ended, so the exited one is in a later version), writes
    /// that version back and moves the frontier over it, as the cycle would have. It was dropped: Dispose skipped the
    /// last advance, and the stall watch's failure made the next cycle refuse, so operations of a version that could
    /// still become durable were lost. Returns whether it wrote a version back.
    /// </summary>
    private bool FinishACutThatCame()
    {
        if (_inflight is not { } machine || !machine.Completion.IsCompleted || machine.Fault is not null || (_faults & DurabilityFaults.DropACutThatCameBeforeAnExitedThread) != 0)
        {
            return false;
        }

        _inflight = null;

        // As in RunCycle: the write-back runs to its end if the thread (a Sync's, a Dispose's) is interrupted.
        using InterruptShield.Scope shield = InterruptShield.Enter();
        AfterTransition(Volatile.Read(ref _versionBase) + machine.ActualToVersion - 1);
        return true;
    }

    /// <summary>How often the heap's own waits look for a thread that exited inside an operation (see <see cref="Slice"/>).</summary>
    private static readonly TimeSpan ExitedThreadLookPeriod = TimeSpan.FromMilliseconds(100);

    /// <summary>The next slice of a wait until <paramref name="deadline"/>: at most <see cref="ExitedThreadLookPeriod"/>.</summary>
    private static TimeSpan Slice(long deadline)
    {
        TimeSpan left = Remaining(deadline);
        return left == Timeout.InfiniteTimeSpan || left > ExitedThreadLookPeriod ? ExitedThreadLookPeriod : left;
    }

    /// <summary>
    /// A cycle's wait for its version's cut (<paramref name="cut"/>), until <paramref name="deadline"/>: in slices, looking
    /// between them for a thread that exited inside an operation, whose cut never comes — with an infinite timeout and no
    /// stall report (no writer waiting in the scheme) the wait lasted until Dispose, and Dispose's own last advance for
    /// ever. Then throws the heap's failure.
    /// </summary>
    /// <returns>Whether the cut came (false: the deadline passed).</returns>
    private bool WaitForTheCut(Task cut, long deadline, CancellationToken cancellationToken)
    {
        while (true)
        {
            if (cut.Wait(Slice(deadline), cancellationToken))
            {
                return true;
            }

            if (Remaining(deadline) == TimeSpan.Zero)
            {
                return false;
            }

            // (A cut that came just now is this version's: a thread found below exited inside a later one.)
            if (FailIfAThreadExitedInsideAnOperation(looking: true) is { } why && !cut.IsCompleted)
            {
                throw new InvalidOperationException($"The heap's advancer failed, so nothing more can become durable: {why}", _advancerFault);
            }
        }
    }

    /// <summary>
    /// If a thread exited inside an operation: fails the heap (as a failed cycle does: Sync and writes fail with the
    /// reason), and ends the waits of operations blocked behind the transition that waits for it. Returns the reason, or
    /// null if no such thread was found.
    /// </summary>
    /// <param name="looking">Called between the slices of one of the heap's own waits (the broken control does not look there).</param>
    private string? FailIfAThreadExitedInsideAnOperation(bool looking = false)
    {
        if ((_faults & DurabilityFaults.IgnoreThreadsExitedInsideOperations) != 0 || (looking && (_faults & DurabilityFaults.HeapWaitsDoNotLookForExitedThreads) != 0))
        {
            return null;
        }

        List<int> exited = ThreadsExitedInsideOperations();
        if (exited.Count == 0)
        {
            return null;
        }

        string why = ExitedInsideOperations(exited);

        // Volatile.Write: release; read by ThrowEntryRefused on the threads whose wait the cancellation below ends (the
        // cancellation's own interlocked write orders it before them).
        Volatile.Write(ref _exitedInsideOperation, why);

        // As a failed cycle records its fault (the first one stays the one reported): Sync and writes fail with it.
        // The first one found stays (a later look must not replace it: the heap's fault is compared with it by reference).
        // Interlocked.CompareExchange: full fence, before the fault is published below.
        Exception fault = Interlocked.CompareExchange(ref _exitedFault, new InvalidOperationException(why), null) ?? _exitedFault!;
        RecordBackgroundFault(fault);
        RefuseEntry();

        // A Sync's (or a writer's help's) wait for the version in a cycle, which can never end now: it gets the reason.
        if ((_faults & DurabilityFaults.SyncWaitsThroughHeapFailure) == 0)
        {
            _cycleWaitsEnd.Cancel();
        }

        StopWatchingTheStall();
        return why;
    }

    /// <summary>Ends the wait of every operation blocked in the scheme (and of every later one that would wait).</summary>
    private void RefuseEntry()
    {
        if ((_faults & DurabilityFaults.OperationsWaitThroughRefusedEntry) == 0)
        {
            _entryRefused.Cancel();
        }
    }

    /// <summary>The scheme reports a transition waiting past its stall threshold (on a thread waiting for it): a thread
    /// that exited inside an operation is one reason, and the only one that never ends. The scheme reports each step
    /// once; if the threads holding it are alive now, one may still exit inside its operation later, so the stall is
    /// watched until the transition completes (without a background advancer nothing else would look again).</summary>
    private void OnTransitionStalled(object? sender, TransitionStalledEventArgs e)
    {
        if (FailIfAThreadExitedInsideAnOperation() is null && (_faults & DurabilityFaults.StallWatchedOnce) == 0)
        {
            WatchTheStall();
        }
    }

    private readonly object _stallWatchGate = new();

    /// <summary>Looks again every stall threshold while a stalled transition is pending; null when none is watched.</summary>
    private Timer? _stallWatch;

    /// <summary>Starts watching stalled transitions: one watch at a time, which goes on while transitions are pending. A
    /// report while it runs makes it look at least once more (the watched transition may have completed and this one
    /// begun since its last tick, which may find the scheme at rest in between).</summary>
    private void WatchTheStall()
    {
        using (InterruptShield.Hold(_stallWatchGate))
        {
            // Volatile.Read: Dispose sets the flag before it stops the watch under this lock: either it finds the watch
            // made here, or this finds the flag.
            if (Volatile.Read(ref _disposed) != 0)
            {
                return;
            }

            _stallReportedSinceTick = true;
            if (_stallWatch is null)
            {
                // Not the reporting thread's ExecutionContext (a user's thread: its AsyncLocals would live as long as the watch).
                using (ExecutionContext.SuppressFlow())
                {
                    _stallWatch = new Timer(static state => ((BufferedDurableHeap)state!).LookAgain(), this, ExitedThreadLookPeriod, ExitedThreadLookPeriod);
                }
            }
        }
    }

    /// <summary>Whether a stall was reported since the watch's last tick (under <see cref="_stallWatchGate"/>).</summary>
    private bool _stallReportedSinceTick;

    /// <summary>A tick of the stall watch (on a thread-pool thread): fails the heap if a thread exited inside an operation,
    /// and stops once no transition is pending and none was reported since the last tick (a later stall is reported
    /// anew), or the heap is disposed or failed. (It stopped at the first change of state, and dropped a report of the
    /// next transition's stall that came while it still existed.)</summary>
    private void LookAgain()
    {
        bool done;
        try
        {
            // Volatile.Read: acquire; pairs with the exchange in Dispose. (Not at an earlier fault of another kind: writers
            // may still wait in the scheme behind a thread that exits later, and only the refusal of entry ends their wait.)
            done = Volatile.Read(ref _disposed) != 0 || Volatile.Read(ref _exitedInsideOperation) is not null
                || ((_faults & DurabilityFaults.StallWatchStopsAtAnEarlierFault) != 0 && Volatile.Read(ref _advancerFault) is not null)
                || FailIfAThreadExitedInsideAnOperation() is not null;
        }
        catch (Exception)
        {
            // An exception escaping a timer's callback ends the process. Nothing here is known to throw (an allocation
            // might): the watch stops, and the heap's own waits and Dispose still look.
            done = true;
        }

        using (InterruptShield.Hold(_stallWatchGate))
        {
            bool reported = _stallReportedSinceTick;
            _stallReportedSinceTick = false;
            if (done || (!reported && !_scheme.CurrentState.IsIntermediate))
            {
                _stallWatch?.Dispose();
                _stallWatch = null;
            }
        }
    }

    private void StopWatchingTheStall()
    {
        using (InterruptShield.Hold(_stallWatchGate))
        {
            _stallWatch?.Dispose();
            _stallWatch = null;
        }
    }

    /// <summary>An operation's wait to enter ended because the heap refuses entry: disposed, or failed (see above).</summary>
    [DoesNotReturn]
    [MethodImpl(MethodImplOptions.NoInlining)]
    private void ThrowEntryRefused(OperationCanceledException e)
    {
        ThrowIfDisposed();

        // Volatile.Read: acquire; pairs with the release write before the cancellation that ended our wait.
        throw new InvalidOperationException(Volatile.Read(ref _exitedInsideOperation) ?? "No operation begins on this heap any more.", Volatile.Read(ref _advancerFault) ?? e);
    }

    /// <summary>Test-only: ends the waits of operations blocked in the scheme whatever the faults (a control's writer, left
    /// waiting behind a thread that exited inside an operation, would otherwise spin until the test process ends).</summary>
    internal void RefuseEntryForTesting() => _entryRefused.Cancel();
}
