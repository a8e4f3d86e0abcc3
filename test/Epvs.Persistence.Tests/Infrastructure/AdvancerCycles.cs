using System;
using System.Threading.Tasks;

namespace Epvs.Persistence.Tests;

/// <summary>Gives a heap's background advancer a cycle to run: an idle heap's advancer runs none.</summary>
internal static class AdvancerCycles
{
    /// <summary>
    /// Registers a SyncAsync, so that the advancer's next period runs a cycle on its own thread (a write instead could
    /// leave the transition to the writing thread). Its outcome, often a failure the test provokes, is not looked at; a
    /// heap that has failed or is disposed already refuses it, which is fine too.
    /// </summary>
    internal static void AskForOne(BufferedDurableHeap heap)
    {
        try
        {
            _ = heap.SyncAsync().ContinueWith(static t => t.Exception, TaskScheduler.Default);
        }
        catch (Exception e) when (e is InvalidOperationException or ObjectDisposedException)
        {
        }
    }
}
