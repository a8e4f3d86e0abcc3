namespace Epvs.Persistence;

/// <summary>How a <see cref="BufferedDurableHeap"/> makes operations durable.</summary>
public enum DurabilityMode
{
    /// <summary>
    /// Buffered durable linearizability (Montage): operations only store; a background advancer writes back each
    /// completed version's payloads and moves the durable frontier. After a crash the heap holds a consistent prefix
    /// of the operations, missing at most the last period or so; <see cref="BufferedDurableHeap.Sync(System.TimeSpan)"/>
    /// waits until everything completed before it is durable.
    /// </summary>
    Buffered = 0,

    /// <summary>
    /// For comparison (benchmarks): every operation writes back its payloads and fences before it returns, paying the
    /// write-back cost a strictly durable structure pays. It does not make an operation recoverable on its own: recovery
    /// is the same as <see cref="Buffered"/> (the frontier prefix), so an operation that returned is lost in a crash
    /// until an advance cycle covers its version (<see cref="BufferedDurableHeap.Sync(System.TimeSpan)"/> waits for that,
    /// as in Buffered mode). An
    /// operation whose write-back fails throws the medium's error with its writes in place; the next advance cycle (the
    /// one a <see cref="BufferedDurableHeap.Sync(System.TimeSpan)"/> runs, say) writes its payloads back before the frontier
    /// covers them, or fails, and then nothing more becomes durable.
    /// </summary>
    Strict = 1,

    /// <summary>
    /// For comparison (benchmarks): nothing is written back and the epoch clock and frontier are never persisted, so
    /// a reopened heap is empty. Epoch-based reclamation still runs. A file that holds durable data (one used in
    /// <see cref="Buffered"/> or <see cref="Strict"/> mode) is refused with <see cref="System.InvalidOperationException"/>:
    /// a transient heap would overwrite it in place.
    /// </summary>
    Transient = 2,
}
