namespace Epvs.Persistence;

/// <summary>What recovery makes of a block position (see <see cref="HeapLayout.Classify"/>).</summary>
internal enum BlockState
{
    /// <summary>The checked unused commit word formatting wrote: never allocated since the segment was formatted.</summary>
    Unused,

    /// <summary>A checked free commit word: freed.</summary>
    Free,

    /// <summary>An allocation whose header check fails, or a seal of the version in flight whose check fails: a crash interrupted it (the block is free).</summary>
    Torn,

    /// <summary>A complete allocation, not sealed (its payload is not checked).</summary>
    Allocated,

    /// <summary>A sealed block whose check over header and payload holds.</summary>
    Sealed,

    /// <summary>A commit word no crash can leave (zero included, or an unused or free word whose check fails), or a sealed block whose check fails and that is no torn write of the version in flight: damage.</summary>
    Damaged,
}
