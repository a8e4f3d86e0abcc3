using System;
using System.Threading.Tasks;

namespace Epvs.Persistence;

/// <summary>
/// The <c>DisposeAsync</c> of the heap types: the refusals that depend on the calling thread (inside a call of the heap
/// on this thread, say) are made on the caller's thread, then the Dispose, whose waits (for the operations and calls in
/// flight, the last advance's write-back and fence) would block the caller, runs on a thread-pool thread. The returned
/// task carries Dispose's outcome: completed, or faulted with what Dispose throws (a refusal included, nothing disposed).
/// </summary>
internal static class AsyncDisposal
{
    /// <param name="refuseOnTheCallingThread">Throws what Dispose throws for a call on this thread that it refuses before changing anything.</param>
    /// <param name="runsHere">Dispose must run on the calling thread (it cannot wait for something the caller holds, and
    /// the synchronous Dispose decides what to do about it there); or the broken control of the tests: every Dispose
    /// runs on the caller, which then waits as Dispose does.</param>
    /// <param name="dispose">The type's Dispose.</param>
    internal static ValueTask Run(Action refuseOnTheCallingThread, Func<bool> runsHere, Action dispose)
    {
        try
        {
            refuseOnTheCallingThread();
            if (runsHere())
            {
                dispose();
                return default;
            }
        }
        catch (Exception e)
        {
            return ValueTask.FromException(e);
        }

        return new ValueTask(Task.Run(dispose));
    }
}
