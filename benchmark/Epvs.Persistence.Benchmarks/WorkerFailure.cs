using System;
using System.Threading;

namespace Epvs.Persistence.Benchmarks;

/// <summary>
/// The first exception of a run's worker threads, caught on the worker and rethrown by the thread that joins them. An
/// exception left unhandled on a worker ends the process at once, without the main thread's <c>finally</c> blocks
/// (which delete the heap files); rethrown on the main thread, it unwinds through them.
/// </summary>
internal sealed class WorkerFailure
{
    private Exception? first;

    /// <summary>Whether a worker has failed.</summary>
    internal bool HasFailed => Volatile.Read(ref first) is not null;

    /// <summary>A thread body that runs <paramref name="body"/> and keeps the first exception of any guarded body.</summary>
    internal ThreadStart Guard(Action body) => () =>
    {
        try
        {
            body();
        }
        catch (Exception e)
        {
            // Interlocked.CompareExchange: the first failure wins; the joining thread reads it after Join, which
            // orders the write before the read.
            Interlocked.CompareExchange(ref first, e, null);
        }
    };

    /// <summary>Throws the first worker's exception, wrapped, on the calling thread; call after joining the workers.</summary>
    /// <exception cref="InvalidOperationException">A worker failed; its exception is the inner exception.</exception>
    internal void ThrowIfFailed()
    {
        if (Volatile.Read(ref first) is { } e)
        {
            throw new InvalidOperationException($"A worker thread failed: {e.GetType().Name}: {e.Message}", e);
        }
    }
}
