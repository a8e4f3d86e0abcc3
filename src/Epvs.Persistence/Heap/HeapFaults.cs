using System;

namespace Epvs.Persistence;

/// <summary>
/// Deliberately broken behaviours, switched on only by tests, so that each crash and concurrency check is shown to
/// catch the bug it exists for. None is reachable through the public API.
/// </summary>
[Flags]
internal enum HeapFaults
{
    None = 0,

    /// <summary>Allocation skips the Uid store of the header (a header written incompletely).</summary>
    SkipUidStore = 1,

    /// <summary>Recovery accepts a header by its commit word's state bits alone, without the check over the other words.</summary>
    AcceptTornHeaders = 2,

    /// <summary>Refilling a thread cache copies a shared batch without removing it (a lost pop: blocks handed out twice).</summary>
    ShareRefillBatch = 4,

    /// <summary>Recovery does not return blocks with invalid headers to the free lists (a leak).</summary>
    LoseInvalidBlocksAtRecovery = 8,

    /// <summary>Opening neither requires the clean-shutdown flag for the saved state nor clears it, and trusts it without checking block headers (a stale saved state).</summary>
    TrustStaleSavedState = 16,

    /// <summary>Opening ignores the saved state and rescans (the reference a fast reopen is compared with).</summary>
    IgnoreSavedState = 32,

    /// <summary>A sweep of deferred frees hands the blocks out before their frees are written back and fenced (a reuse can reach the file over an old seal).</summary>
    HandOutSweptFreesEarly = 64,

    /// <summary>Formatting a segment (the advancer stocking a pool, or an allocating thread) does not make its zeroing durable before its descriptor (a reused segment's old headers survive under the new generation).</summary>
    StockWithoutDurableZeroing = 128,

    /// <summary>Recovery takes a torn allocation (a header whose check fails) as free without making the free durable, so a later allocation at that offset can complete the old header.</summary>
    LeaveTornHeaders = 512,

    /// <summary>A heap that cannot grow gives back the segments whose blocks all sit in a class pool, but leaves their blocks in the pool (a block can then be handed out inside a segment reused for something else).</summary>
    ReleaseSegmentsLeavingBlocksPooled = 1024,

    /// <summary>The caches of threads that have exited are kept with their free blocks (the old behaviour: a heap used by short-lived threads fills up and its memory grows with every thread).</summary>
    KeepExitedThreadCaches = 2048,

    /// <summary>A sweep marks, writes back, fences and hands out its blocks under the sweep's lock (the old behaviour: a thread that needs a sweep of its own, or parks frees, waits for the whole of another's).</summary>
    SweepUnderTheGate = 4096,

    /// <summary>A flush of every parked free returns without waiting for sweeps in flight on other threads (whose frees are not durable yet: an anti-payload freed after it could reach the file first).</summary>
    FlushWithoutWaitingForSweepsInFlight = 8192,

    /// <summary>A flush or a refill waits until no sweep at all is in flight, not only for those taken before its own look (the first version: sweeps other threads keep starting can hold it for ever).</summary>
    WaitForEverySweepInFlight = 16384,

    /// <summary>Recovery takes a sealed block whose check fails for a torn write of the version in flight by its version tag alone, whatever its Epoch word holds (damage to a block of the last durable version that flips its tag to the next version's is then freed without a word).</summary>
    TornSealsByVersionTagOnly = 32768,

    /// <summary>Recovery takes a sealed block whose check fails for a torn write of the version in flight by its Epoch word alone (that version), whatever its version tag (a durable block whose Epoch word was damaged into the next version is then freed without a word).</summary>
    TornSealsByEpochWordOnly = 65536,

    /// <summary>Formatting leaves 0 in the Epoch words (format 6's empty mark), frees leave the block's Epoch word as it was, and recovery leaves it in free and unused blocks (a torn seal over a formatted or reused block can then hold 0 or an older version there, and a plain crash reads as damage).</summary>
    LeaveEpochWordsUnmarked = 131072,

    /// <summary>Recovery takes a sealed block whose Epoch word holds its empty mark for damage, not for a free a crash interrupted (its mark durable, its free word not): a plain crash then reads as damage.</summary>
    MarkedFreesAreDamage = 262144,

    /// <summary>A raw <see cref="PersistentHeap.Free(PayloadRef)"/> hands its block out again at once, before its free is durable (the old behaviour: after a crash, the freed payload's durable header could come back over the next payload's bytes).</summary>
    ReuseRawFreesAtOnce = 524288,

    /// <summary>
    /// A sweep hands its blocks out with their frees in the working image only, neither logged nor fenced (a
    /// reuse can reach the file over an old seal, which recovery reports as damage). Besides a broken control, the
    /// persistence benchmark's <c>--unsafe-sweeps-not-durable</c> experiment: what the cycles would gain if the frees
    /// cost no page writes before reuse (an upper bound for a cheaper scheme). Never crash-safe.
    /// </summary>
    SweepFreesStayInMemory = 1048576,

    /// <summary>
    /// With <see cref="SweepFreesStayInMemory"/>: the sweep still fences, having written nothing, after it has handed
    /// its blocks out (its frees stay in memory all the same). The benchmark's <c>--unsafe-sweeps-fence-only</c>: what
    /// the fences of a scheme that makes the frees durable in a few bytes (a record of the swept blocks) would still cost
    /// the cycles (not the wait of a thread sweeping for itself, which would fence before taking its blocks). Never
    /// crash-safe.
    /// </summary>
    SweepFencesWithoutFrees = 2097152,

    /// <summary>Recovery does not read the sweep log: a block freed through it is classified by its header alone (an old copy comes back, a reuse torn over it reads as damage).</summary>
    IgnoreSweepLogAtRecovery = 4194304,

    /// <summary>A fast reopen starts the sweep log afresh (a new epoch) instead of going on with it: the saved state's frees that were durable in the log only are then durable nowhere.</summary>
    FastReopenVoidsTheSweepLog = 8388608,

    /// <summary>The cycles write no marks of the sweep log: after a crash, damage to a half's last batches reads as the end of its batches again, and the frees they held are lost without a word.</summary>
    SweepLogWithoutMarks = 16777216,

    /// <summary>Recovery takes the sweep log's marks whatever epoch they name: the marks of a log that a recovery scan has emptied since then say it reached further than the new log does, and a plain crash reads as damage.</summary>
    SweepLogMarksOfAnyEpoch = 33554432,

    /// <summary>
    /// An allocating thread whose class's pool is empty sweeps parked frees for itself once, and only with two batches of
    /// its class parked (the old behaviour): when another thread took its swept blocks from the pool first, or the
    /// parked frees were in another thread's sweep in flight, it went on to the heap-full path inside its operation
    /// (every parked free flushed, pooled segments given back and formatted again, or the file grown).
    /// </summary>
    RefillSweepsOnce = 67108864,

    /// <summary>The Dispose of a raw heap on a caller's file returns without waiting for the heap's calls in flight (the old behaviour: a call parked inside went on into disposed per-thread caches, and a heap attached to the file next could hand out the same blocks).</summary>
    DisposeWithoutWaitingForCalls = 134217728,

    /// <summary>Dispose disposes the per-thread caches (the old behaviour: a call on another thread still inside, such as a buffered heap's allocator's public NewUid or Fence, then read a disposed ThreadLocal, which throws or returns null).</summary>
    DisposeThreadCaches = 268435456,
}
