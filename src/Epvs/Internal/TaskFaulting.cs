using System;
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
/// another thread in between): the task is then the runtime's, and is left alone rather than spun on.</para>
/// </remarks>
internal static class TaskFaulting
{
    /// <summary>Test hook: runs first, before the task is touched; a hook that throws stands for an allocation failure
    /// while preparing the fault.</summary>
    internal static Action? HookForTesting;

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
            // The rehearsal: about what TrySetException allocates after its reservation (the stack-trace copy, the holder and
            // its list), made once for nothing. Kept alive to the end so the JIT cannot put it on the stack.
            var rehearsal = new object[8];
            rehearsal[0] = ExceptionDispatchInfo.Capture(fault);
            GC.KeepAlive(rehearsal);
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
