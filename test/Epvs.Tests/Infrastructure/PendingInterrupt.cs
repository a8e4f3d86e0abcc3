using System.Threading;

namespace Epvs.Tests;

/// <summary>
/// Whether a <see cref="Thread.Interrupt"/> is still pending on the calling thread, found by a zero-timeout wait on a
/// private monitor (nobody else can pulse it: it never waits, only surfaces and consumes the interrupt).
/// </summary>
internal static class PendingInterrupt
{
    /// <summary>Consumes a pending interrupt of the calling thread.</summary>
    /// <returns><see langword="true"/> if one was pending (it is consumed, so it cannot hit a later wait of the thread).</returns>
    public static bool TryConsume()
    {
        object gate = new();
        lock (gate)
        {
            try
            {
                Monitor.Wait(gate, 0);
                return false;
            }
            catch (ThreadInterruptedException)
            {
                return true;
            }
        }
    }
}
