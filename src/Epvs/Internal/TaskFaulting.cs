using System;
using System.Collections.Generic;
using System.Runtime.ExceptionServices;
using System.Threading.Tasks;

namespace Epvs;

/// <summary>
/// Gives a task its fault on a path that may run out of memory (a drain, Dispose's final run, a machine's retirement),
/// without leaving the task incomplete when that fails: a task its awaiter waits on for ever is worse than one that
/// says less than it could.
/// </summary>
/// <remarks>
/// <para>What allocates, from dotnet/runtime (Task.cs, TaskCompletionSource.cs) and measured with
/// <see cref="GC.GetAllocatedBytesForCurrentThread"/> on .NET 10:</para>
/// <list type="bullet">
/// <item><description><see cref="TaskCompletionSource{TResult}.TrySetException(Exception)"/> first creates the task's
/// optional state (its <c>ContingentProperties</c>, 80 bytes) if it has none, then reserves the task's completion, and only
/// then allocates the exception holder, a list and an <see cref="ExceptionDispatchInfo"/> with a copy of the stack trace
/// (about 250 bytes and more). A failure after the reservation leaves the task reserved and incomplete for good: no public
/// API can complete it any more, and every <c>TrySet…</c> of its source would spin until it completes, that is, for ever.
/// A cached or preallocated exception changes none of this.</description></item>
/// <item><description><see cref="TaskCompletionSource{TResult}.TrySetCanceled()"/> reserves, then needs the same optional
/// state and nothing else: it allocates nothing when the state exists.</description></item>
/// <item><description><see cref="TaskCompletionSource{TResult}.TrySetResult"/> allocates nothing, but would report
/// success.</description></item>
/// </list>
/// <para>So the task's optional state is created first without reserving anything (reading the task's
/// <see cref="IAsyncResult.AsyncWaitHandle"/> does, at about 180 bytes and a wait handle: too dear for every task, cheap
/// on a fault path), and the fault is rehearsed (its largest allocations are made once for nothing) before the task is
/// touched. A failure in either leaves the task untouched: it is canceled then, which allocates nothing more. What stays
/// open is a failure inside the runtime after it reserved the task, just after the rehearsal succeeded (memory taken by
/// another thread in between): the task is then the runtime's, and is left alone rather than spun on. The failure is
/// still returned, so that it is reported (<see cref="LightEpoch.DeferredActionFailed"/>, the machine's fault event).</para>
/// <para>Why this cannot be closed with public APIs (checked on .NET 10): every way to fault a task creates the task's
/// exception holder (a finalizable object) and its list only after the task is reserved or running:
/// <c>TrySetException</c> (both overloads), <c>TrySetFromTask</c>/<c>SetFromTask</c>, <c>Unwrap</c> and continuations
/// (which copy an inner task's fault into the proxy after reserving it, inside the runtime's own continuation), and a
/// task body that throws. No public API creates the holder ahead, and a preallocated exception only saves the exception,
/// not the holder. Measured with <see cref="GC.GetAllocatedBytesForCurrentThread"/>: once the optional state exists,
/// <c>TrySetException</c> allocates everything after its reservation, 336 bytes for an exception thrown under a test
/// runner's stack and 4,304 with 64 more frames (the stack-trace copy grows), and the rehearsal as much (it used to be 24
/// bytes short); <c>TrySetCanceled</c> allocates 0. A test checks that the rehearsal keeps covering the runtime's share.
/// The rehearsal's objects
/// are garbage when the runtime allocates, so a collection that the runtime runs before it gives up reclaims them for it:
/// what remains is another thread taking that memory back in the few instructions in between.
/// <see cref="GC.TryStartNoGCRegion(long)"/> would reserve the memory, but it is process-wide (it fails while another
/// region is active, and a library must not end a caller's region) and starts with a full blocking collection.</para>
/// </remarks>
internal static class TaskFaulting
{
    /// <summary>Test hook: runs first, before the task is touched; a hook that throws stands for an allocation failure
    /// while preparing the fault.</summary>
    internal static Action? HookForTesting;

    /// <summary>
    /// The rehearsal: what TrySetException allocates after its reservation, in the same shapes, made once for nothing: a
    /// finalizable holder of the same size (registering it for finalization may grow the runtime's finalization queue,
    /// which can fail too), a one-item list of <see cref="ExceptionDispatchInfo"/> and the stack-trace copy. Kept alive to
    /// the end so the JIT cannot put it on the stack. (It was an eight-slot array and the copy: 24 bytes short of the
    /// runtime's share, and no finalizable object; a test compares the two.)
    /// </summary>
    internal static void Rehearse(Exception fault)
    {
        var holder = new RehearsalHolder(fault);
        holder.Exceptions = new List<ExceptionDispatchInfo>(1) { ExceptionDispatchInfo.Capture(fault) };
        GC.SuppressFinalize(holder);
        GC.KeepAlive(holder);
    }

    /// <summary>The shape of the runtime's task exception holder (a task, a list, a cancellation, a flag; a finalizer).</summary>
    private sealed class RehearsalHolder
    {
        public readonly object? Task;
        public List<ExceptionDispatchInfo>? Exceptions;
        public readonly object? Cancellation;
        public readonly bool Handled;

        public RehearsalHolder(object task)
        {
            Task = task;
            Cancellation = null;
            Handled = false;
        }

        ~RehearsalHolder()
        {
            // Never runs (suppressed at once): it only makes the allocation register for finalization, as the holder's does.
            GC.KeepAlive(Task ?? Cancellation);
            _ = Handled;
        }
    }

    /// <summary>
    /// Faults <paramref name="completion"/> with <paramref name="fault"/>, or cancels it when that cannot be prepared.
    /// Never throws.
    /// </summary>
    /// <returns>Null if nothing failed; otherwise the failure, to report. The task is then canceled if the fault could not be
    /// prepared, faulted if it failed after completing it (queueing a continuation), or, see the remarks, left to the
    /// runtime.</returns>
    public static Exception? Fault(TaskCompletionSource<bool> completion, Exception fault)
    {
        try
        {
            HookForTesting?.Invoke();
            // Creates the task's optional state without reserving it: from here, canceling it allocates nothing, and
            // TrySetException allocates only after it reserved the task.
            _ = ((IAsyncResult)completion.Task).AsyncWaitHandle;
            Rehearse(fault);
        }
        catch (Exception preparing)
        {
            try
            {
                completion.TrySetCanceled(); // the task is untouched: canceling cannot find it reserved and spin
            }
            catch (Exception)
            {
                // Out of memory again, before the task had its optional state: the runtime holds it now (see the remarks).
            }
            return preparing;
        }

        try
        {
            completion.TrySetException(fault);
            return null;
        }
        catch (Exception completing)
        {
            // The optional state existed, so this came after the reservation (or after completion, from a continuation):
            // never touch the task again, a TrySet… on a reserved task spins for ever.
            return completing;
        }
    }
}
