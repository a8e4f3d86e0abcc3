namespace Epvs.Samples.ResizableArray;

/// <summary>The resizable-array variants of the paper's §6.1, for <see cref="ResizableArrayFactory"/>.</summary>
public enum ResizableArrayKind
{
    /// <summary><see cref="LatchedResizableArray"/>: reader–writer latch.</summary>
    Latched,

    /// <summary><see cref="LatchFreeMockResizableArray"/>: preallocated, never resizes (upper bound).</summary>
    LatchFreeMock,

    /// <summary><see cref="SimpleEpvsResizableArray"/>: resize as one critical section (Fig. 3).</summary>
    SimpleEpvs,

    /// <summary><see cref="TwoPhaseEpvsResizableArray"/>: REST → COPYING state machine (Figs. 4–6).</summary>
    TwoPhaseEpvs,

    /// <summary><see cref="EpvsPinnedResizableArray"/>: simple EPVS with pinned sessions that refresh.</summary>
    EpvsPinned,
}
