using System;
using System.Collections.Generic;
using System.Diagnostics.CodeAnalysis;
using System.Linq;
using System.Runtime.CompilerServices;
using System.Threading;

namespace Epvs.Persistence;

/// <summary>
/// Threads that exited inside an operation, and the operations that wait for them.
/// </summary>
/// <remarks>
/// A thread that exits with an operation open (a <see cref="DurableOperation"/> it never disposed) stays inside the
/// version scheme's region for good: nothing can make it leave. The transition out of its version then never completes,
/// so no later version becomes durable, and every operation that begins waits in the scheme for that transition — for
/// ever, and past the heap's Dispose, which cannot dispose a scheme with a thread inside. Operations therefore enter with
/// a token (<see cref="EpochProtectedVersionScheme.Enter(CancellationToken)"/>) that ends their wait when the heap
/// refuses entry: at Dispose, and as soon as the heap finds such a thread (a stalled transition's report, a Sync that
/// timed out, Dispose). The heap then fails as a failed cycle does, naming the thread; its operation's version, never
/// cut, is not in the durable prefix, so reopening the file recovers a consistent state without it.
/// </remarks>
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
        $"{(threads.Count == 1 ? "Thread" : "Threads")} {string.Join(", ", threads)} exited inside an operation of this heap (a DurableOperation that was never disposed). A thread that has exited can never end its operation, so the version transition that waits for it never completes and nothing after version {DurableFrontier} can become durable. No operation begins on this heap any more: dispose it and reopen the file (recovery keeps every version up to the durable frontier; the unfinished operation's version is not among them).";

    /// <summary>
    /// If a thread exited inside an operation: fails the heap (as a failed cycle does: Sync and writes fail with the
    /// reason), and ends the waits of operations blocked behind the transition that waits for it. Returns the reason, or
    /// null if no such thread was found.
    /// </summary>
    private string? FailIfAThreadExitedInsideAnOperation()
    {
        List<int> exited = ThreadsExitedInsideOperations();
        if (exited.Count == 0 || (_faults & DurabilityFaults.IgnoreThreadsExitedInsideOperations) != 0)
        {
            return null;
        }

        string why = ExitedInsideOperations(exited);
        var fault = new InvalidOperationException(why);

        // As a failed cycle records its fault: the first one stays the one reported.
        Interlocked.CompareExchange(ref _advancerFault, fault, null);
        FailWaiters(new InvalidOperationException($"The heap's advancer failed: {fault.Message}", fault));
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

    /// <summary>Starts watching the stalled transition (one watch at a time; the next stall report starts another once this
    /// one ended).</summary>
    private void WatchTheStall()
    {
        lock (_stallWatchGate)
        {
            if (_stallWatch is not null || Volatile.Read(ref _disposed) != 0)
            {
                return;
            }

            TimeSpan period = _scheme.StallThreshold < TimeSpan.FromMilliseconds(10) ? TimeSpan.FromMilliseconds(10) : _scheme.StallThreshold;
            _stallWatch = new Timer(static state => ((BufferedDurableHeap)state!).LookAgain(), this, period, period);
            _stalled = _scheme.CurrentState;
        }
    }

    /// <summary>The (intermediate) state of the watched transition.</summary>
    private VersionSchemeState _stalled;

    /// <summary>A tick of the stall watch (on a thread-pool thread): fails the heap if a thread exited inside an operation,
    /// and stops once the watched transition has completed, or the heap is disposed or failed.</summary>
    private void LookAgain()
    {
        VersionSchemeState now = _scheme.CurrentState;
        bool moved;
        lock (_stallWatchGate)
        {
            moved = !now.IsIntermediate || now.Version != _stalled.Version || now.Phase != _stalled.Phase;
        }

        if (moved || Volatile.Read(ref _disposed) != 0 || Volatile.Read(ref _advancerFault) is not null || FailIfAThreadExitedInsideAnOperation() is not null)
        {
            StopWatchingTheStall();
        }
    }

    private void StopWatchingTheStall()
    {
        lock (_stallWatchGate)
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
        Exception fault = _advancerFault ?? e;
        throw new InvalidOperationException($"No operation begins on this heap any more: {fault.Message}", fault);
    }

    /// <summary>Test-only: ends the waits of operations blocked in the scheme whatever the faults (a control's writer, left
    /// waiting behind a thread that exited inside an operation, would otherwise spin until the test process ends).</summary>
    internal void RefuseEntryForTesting() => _entryRefused.Cancel();
}
