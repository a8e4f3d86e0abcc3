using System;

namespace Epvs.Persistence;

/// <summary>
/// Deliberately broken behaviours of the epoch-persistence layer, switched on only by tests, so that each crash and
/// concurrency check is shown to catch the bug it exists for. None is reachable through the public API.
/// </summary>
[Flags]
internal enum DurabilityFaults : long
{
    None = 0,

    /// <summary>Recovery keeps payloads whose tag is beyond the durable frontier.</summary>
    KeepTagsBeyondFrontier = 1,

    /// <summary>An update of a payload of an older version is done in place instead of on a copy.</summary>
    UpdateOlderVersionInPlace = 2,

    /// <summary>The advancer persists the frontier (and so a clock that implies it) before writing back the version's payloads.</summary>
    PersistFrontierBeforeWriteBack = 4,

    /// <summary>Sync waits only for the version before the current one (returns before the frontier covers its version).</summary>
    SyncBeforeFrontierCovers = 8,

    /// <summary>Recovery leaves superseded and cancelled payloads allocated (a leak).</summary>
    KeepCancelledPayloads = 16,

    /// <summary>Reclamation frees anti-payloads without first making the deferred frees of the payloads they cancel durable, and recovery frees anti-payloads first: an anti-payload's free can reach the file before a cancelled copy's.</summary>
    FreeAntiPayloadsWithoutOrdering = 32,

    /// <summary>Operations never help reclaim, however large the backlog of retired payloads grows (no back-pressure).</summary>
    NoBackPressure = 64,

    /// <summary>Dispose does not wait for operations in flight and unmaps under them (the old behaviour; a crash).</summary>
    SkipDisposeWait = 128,

    /// <summary>Reclamation hands freed blocks out again before their frees are durable (a reuse can reach the file over an old seal).</summary>
    ReuseBeforeFreeIsDurable = 256,

    /// <summary>Recovery takes every sealed block whose check fails for damage, those of the version whose cycle the crash interrupted too (sealed in the pass that writes them back, their seals may be durable over bytes that are not: a plain crash then reads as damage).</summary>
    TornSealsAreDamage = 512,

    /// <summary>The hash map's lock-free reads skip the slot's sequence check (they may return a torn value).</summary>
    TornIndexReads = 1024,

    /// <summary>The hash map's index grows by emptying each old slot it copies instead of leaving it readable (a reader still on the old table may miss a present key).</summary>
    ClearOldSlotsOnGrow = 2048,

    /// <summary>The hash map's index grows without locking the slots it copies (an update racing the copy is lost).</summary>
    GrowWithoutSlotLocks = 4096,

    /// <summary>The hash map inserts a key it found absent without looking again under the key's stripe lock (two racing inserts of one key both add it).</summary>
    InsertWithoutRecheck = 8192,

    /// <summary>The hash map's index growth copies a slot it saw live without looking again once it holds the slot's lock, and lets new updates and removes run during the growth (a key removed meanwhile comes back).</summary>
    GrowWithoutRecheck = 16384,

    /// <summary>The hash map's slot lock makes readers of the key wait for the whole update (allocation included), not just for the store of the value.</summary>
    ReadersWaitForSlotLock = 32768,

    /// <summary>Not a broken behaviour but a simulated environment: every growth of the hash map's index throws <see cref="OutOfMemoryException"/>.</summary>
    IndexGrowthOutOfMemory = 65536,

    /// <summary>A version older than MaxVersionAge slows down only the thread helping to end it: the other writers carry on adding to it.</summary>
    OnlyTheHelperWaits = 131072,

    /// <summary>Dispose tries the version scheme's Dispose once, as before: a thread that began an operation just after the wait for operations (and is about to leave) makes the whole Dispose fail.</summary>
    DisposeSchemeOnce = 262144,

    /// <summary>A fault of the transition's critical section is thrown by the cycle that ran it and not recorded as the advancer's fault (the old behaviour: later cycles run as if nothing had happened).</summary>
    ForgetTransitionFaults = 524288,

    /// <summary>The heap's transition does not check that it starts where the heap's last one ended (a state machine run on the public version scheme ends versions nobody writes back).</summary>
    AllowForeignTransitions = 1048576,

    /// <summary>A cycle does not check that every operation of the version it writes back has ended (an operation whose region was refreshed keeps writing into a version declared durable).</summary>
    IgnoreOperationsPastTheirCut = 2097152,

    /// <summary>Strict mode: the payloads of an operation whose write-back failed stay with its thread until that thread's next operation (the old behaviour: a cycle can move the frontier over them, and a thread that never operates again never writes them back).</summary>
    KeepFailedStrictPayloadsWithThread = 4194304,

    /// <summary>A cycle forgets an exited thread's buffers without checking that they are drained (a write of the version after the cut, made by a thread that then exited, is never written back).</summary>
    ForgetUndrainedExitedThreads = 8388608,

    /// <summary>Strict mode: the advancer never seals the payloads (the old behaviour: their payload bytes are not checked, and a damaged header reads as a torn allocation, freed without a report).</summary>
    LeaveStrictPayloadsUnsealed = 16777216,

    /// <summary>Recovery leaves the blocks of a version whose seals a crash interrupted unsealed (the old behaviour: they stay checked by their header only, for good).</summary>
    LeaveRecoveredBlocksUnsealed = 33554432,

    /// <summary>The advancer persists a version's frontier before sealing its blocks (the old order: a crash in between leaves a durable version checked by its headers only, and the sealed-frontier word below the frontier).</summary>
    PersistFrontierBeforeSeals = 67108864,

    /// <summary>Recovery frees the torn blocks it finds when the sealed-frontier word is below the frontier without reporting them (a damaged header of a durable version then reads as an interrupted allocation: freed without a word).</summary>
    TrustTornBlocksBelowTheSealedFrontier = 134217728,

    /// <summary>With a background advancer, the cycle stocks the heap's pools itself instead of leaving it to the stocker thread (the old behaviour: the next transition waits for the stocking).</summary>
    StockInsideTheCycle = 268435456,

    /// <summary>Dispose stops the stocker thread without waiting for a stocking in progress (which then runs on while the heap closes under it).</summary>
    DisposeWithoutWaitingForTheStocker = 536870912,

    /// <summary>A Sync holding the cycle gate keeps waiting for the version's operations when Dispose begins (the old behaviour: Dispose waits behind it, for ever behind a Sync with an infinite timeout and an operation that does not end).</summary>
    SyncWaitsThroughDispose = 1073741824,

    /// <summary>A Sync that Dispose overtook fails at once instead of waiting for Dispose's outcome (although Dispose's last advance may make its operations durable).</summary>
    SyncFailsWhenDisposeOvertakesIt = 2147483648,

    /// <summary>Each frontier is persisted with clock = frontier + 1 and the transition never persists the clock: a version runs with the durable clock below it (after a crash, recovery's new versions can repeat tags still on the file).</summary>
    ClockLeftBehind = 4294967296,

    /// <summary>The stocker stocks the pools only after each cycle, for twice the demand since its previous stocking (the old behaviour: allocating threads whose pool ran dry in a burst formatted segments themselves, a write-back and a fence inside their operations).</summary>
    StockOnlyAfterCycles = 8589934592,

    /// <summary>Dispose releases the heap's file although the advancer or the stocker did not stop within its wait: another heap may then open on the file while the old thread still formats and writes through it.</summary>
    ReleaseTheFileUnderARunningBackgroundThread = 17179869184,

    /// <summary>A structure with keys of 31 bytes or more writes no key-size record: a reopen with another such key size is accepted, and its payloads misread (as before the record).</summary>
    SkipKeySizeRecord = 34359738368,

    /// <summary>Recovery trusts the superblock's clock over the blocks: an intact block tagged above it is dropped and freed as a payload beyond the frontier (a stale superblock then loses durable data without a word), not reported as damage.</summary>
    TrustTheClockOverTheBlocks = 68719476736,

    /// <summary>An operation may begin in a version a foreign transition began (above the persisted clock), as before: its blocks may reach the file tagged above the clock, and a reopen after a crash is refused as a stale superblock.</summary>
    BeginAboveTheClock = 137438953472,

    /// <summary>The heap does not look for threads that exited inside an operation (as before): operations blocked behind the transition that waits for one wait until Dispose, and Sync's and Dispose's timeouts advise waiting for the thread to end its operation.</summary>
    IgnoreThreadsExitedInsideOperations = 274877906944,

    /// <summary>Operations blocked in the version scheme behind a transition wait through the heap's refusal of entry (as before): an operation waiting behind a thread that exited inside an operation waits for ever, past Dispose.</summary>
    OperationsWaitThroughRefusedEntry = 549755813888,

    /// <summary>A Sync (or a writer's help) waiting for a version behind a thread that exited inside an operation waits through the heap's failure (as before): with an infinite timeout, until Dispose.</summary>
    SyncWaitsThroughHeapFailure = 1099511627776,

    /// <summary>The heap looks for threads that exited inside an operation only on a transition's one stall report (as before): a thread that exits after it leaves writers waiting until a Sync or Dispose.</summary>
    StallWatchedOnce = 2199023255552,

    /// <summary>Dispose runs its last advance before it looks for threads that exited inside an operation (as before): it waits its whole SyncTimeout (for ever, if infinite) for an operation that can never end.</summary>
    DisposeAdvancesPastAnExitedThread = 4398046511104,

    /// <summary>The heap's own waits (a cycle's wait for its version's cut, Dispose's wait for operations) do not look for threads that exited inside an operation between their slices (as before): with an infinite timeout and no writer to report a stall, they wait until Dispose, or for ever.</summary>
    HeapWaitsDoNotLookForExitedThreads = 8796093022208,

    /// <summary>Once the heap fails for a thread that exited inside an operation, a transition whose cut had already come is not written back (as before): the operations of that version, which all ended, are lost at the next open.</summary>
    DropACutThatCameBeforeAnExitedThread = 17592186044416,

    /// <summary>The stall watch stops at the heap's first fault of any kind (as before): a writer waiting behind a thread that exits inside its operation afterwards waits until Dispose.</summary>
    StallWatchStopsAtAnEarlierFault = 35184372088832,

    /// <summary>The public Replace and Delete retire a payload that was already replaced or deleted (as before): the retirement is found twice only at reclamation, where the heap fails.</summary>
    AcceptDoubleRetirement = 70368744177664,

    /// <summary>An operation of this heap begins inside another heap's operation on the same thread (two threads nesting in opposite orders then deadlocked).</summary>
    NestAcrossHeaps = 140737488355328,

    /// <summary>A replace within its version undoes its copy only when the anti-payload finds the heap full, and runs without an interrupt shield (as before): an interrupt between the two allocations left two live payloads of one key.</summary>
    UndoCopyOnlyWhenFull = 281474976710656,

    /// <summary>Sync, AdvanceVersion and Dispose run from a deferred action of the heap's epoch (as before): one whose drain holds the transition's critical section behind it waited for ever.</summary>
    WaitInsideTheEpochsDrain = 562949953421312,

    /// <summary>Transitions go on past the last writable version (as before): the clock reaches 2^42 − 1, the next transition fails the heap, and no open can begin a version again.</summary>
    AdvancePastTheVersionSpace = 1125899906842624,

    /// <summary>A thread that needs the cycle gate (a Sync, a helping writer) waits for the gate alone (as before), not for the gate or the durable frontier at its target: it waits through cycles that made its version durable, as long as another thread keeps the gate.</summary>
    WaitForTheCycleGateAlone = 2251799813685248,

    /// <summary>Dispose fails every SyncAsync its last advance left waiting (as before), also those whose operations that advance made durable (their target read after its transition).</summary>
    DisposeFailsCoveredWaiters = 4503599627370496,

    /// <summary>A wide-key structure's first open whose key-size record finds no room keeps its type id reserved (as before): every retry in the heap's session is refused as a second open of the type id.</summary>
    KeepTypeIdOfAFailedOpen = 9007199254740992,

    /// <summary>The background advancer ends a version every period even when nothing was written (as before): an idle heap wrote its sealed frontier and its frontier back with two fences every period, through the page cache 100 pwrite and 100 fdatasync calls a second at the default period.</summary>
    AdvanceWhenIdle = 18014398509481984,

    /// <summary>The background advancer takes the heap for idle when no operation is open, whatever the threads wrote, retired or carried and whoever waits in SyncAsync: a write whose operation ended before the period's look is never made durable by the advancer.</summary>
    IdleWithWorkPending = 36028797018963968,

    /// <summary>The background advancer takes the heap for idle with a sweep the sweep log's marks do not record yet: the sweep stays unmarked for as long as the heap is idle (damage to its batches then reads as the log's end).</summary>
    IdleWithSweepUnmarked = 72057594037927936,

    /// <summary>The background advancer takes the heap for idle with exited threads not yet forgotten: their buffers and allocation caches stay with the heap for as long as it is idle.</summary>
    IdleWithExitedThreads = 144115188075855872,

    /// <summary>An idle period leaves the current version's date as it is: the first operation after an idle stretch longer than MaxVersionAge finds its version old and ends it itself (held back by the back-pressure for a cycle).</summary>
    IdleWithoutRedating = 288230376151711744,
}
