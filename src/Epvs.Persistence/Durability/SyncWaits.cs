using System;
using System.Threading;
using System.Threading.Tasks;

namespace Epvs.Persistence;

/// <summary>The bounded wait behind <see cref="BufferedDurableHeap.SyncAsync(CancellationToken)"/> (an async method cannot live in the heap's unsafe class).</summary>
internal static class SyncWaits
{
    internal static async Task WaitAsync(Task task, TimeSpan timeout, CancellationToken cancellationToken, Action throwTimeout)
    {
        try
        {
            await task.WaitAsync(timeout, cancellationToken).ConfigureAwait(false);
        }
        catch (TimeoutException)
        {
            throwTimeout();
            throw;
        }
    }
}
