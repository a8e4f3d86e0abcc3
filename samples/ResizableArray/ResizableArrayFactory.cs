using System;

namespace Epvs.Samples.ResizableArray;

/// <summary>Creates any variant by kind, so a harness can loop over <see cref="ResizableArrayKind"/>.</summary>
public static class ResizableArrayFactory
{
    /// <summary>Every kind, baseline first.</summary>
    public static ResizableArrayKind[] AllKinds { get; } =
    [
        ResizableArrayKind.Latched,
        ResizableArrayKind.LatchFreeMock,
        ResizableArrayKind.SimpleEpvs,
        ResizableArrayKind.TwoPhaseEpvs,
        ResizableArrayKind.EpvsPinned,
    ];

    /// <summary>Creates an array.</summary>
    /// <param name="kind">The variant.</param>
    /// <param name="initialCapacity">The initial capacity. For <see cref="ResizableArrayKind.LatchFreeMock"/>, which
    /// never grows, pass <paramref name="mockCapacity"/> too.</param>
    /// <param name="mockCapacity">The latch-free mock's fixed capacity: at least the initial capacity plus every push
    /// the run will make. Ignored by the other kinds; defaults to <paramref name="initialCapacity"/>.</param>
    /// <param name="resizeDelay">Extra time per resize (Fig. 13); ignored by the mock.</param>
    /// <returns>The array.</returns>
    /// <exception cref="ArgumentOutOfRangeException">A capacity is below 1, or <paramref name="kind"/> is unknown.</exception>
    public static IResizableArray Create(ResizableArrayKind kind, int initialCapacity, int mockCapacity = 0, TimeSpan resizeDelay = default) =>
        kind switch
        {
            ResizableArrayKind.Latched => new LatchedResizableArray(initialCapacity, resizeDelay),
            ResizableArrayKind.LatchFreeMock => new LatchFreeMockResizableArray(Math.Max(initialCapacity, mockCapacity)),
            ResizableArrayKind.SimpleEpvs => new SimpleEpvsResizableArray(initialCapacity, resizeDelay),
            ResizableArrayKind.TwoPhaseEpvs => new TwoPhaseEpvsResizableArray(initialCapacity, resizeDelay),
            ResizableArrayKind.EpvsPinned => new EpvsPinnedResizableArray(initialCapacity, resizeDelay),
            _ => throw new ArgumentOutOfRangeException(nameof(kind), kind, "Unknown resizable-array kind."),
        };
}
