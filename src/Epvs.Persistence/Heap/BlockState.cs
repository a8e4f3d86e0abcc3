namespace Epvs.Persistence;

/// <summary>What recovery makes of a block position (see <see cref="HeapLayout.Classify"/>).</summary>
internal enum BlockState
{
    /// <summary>Commit word 0: never used since the segment was formatted.</summary>
    Unused,

    /// <summary>Freed.</summary>
    Free,

    /// <summary>An allocation whose header check fails: a crash interrupted it (the block is free).</summary>
    Torn,

    /// <summary>A complete allocation, not sealed (its payload is not checked).</summary>
    Allocated,

    /// <summary>A sealed block whose check over header and payload holds.</summary>
    Sealed,

    /// <summary>
    /// A sealed block whose check fails: damage, unless it belongs to the version whose write-back the crash
    /// interrupted (the seal may have become durable before the payload did); the caller decides by the 8 tag bits of
    /// the commit word itself.
    /// </summary>
    SealFailed,

    /// <summary>
    /// A sealed block of the version whose write-back a crash interrupted, whose check fails: torn, so free — and its
    /// free must be written, because a later recovery no longer knows which write-back was interrupted.
    /// </summary>
    TornSeal,

    /// <summary>A commit word no crash can leave (wrong tag, state or generation): damage.</summary>
    Damaged,
}
