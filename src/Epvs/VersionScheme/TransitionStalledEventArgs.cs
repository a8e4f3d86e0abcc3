using System;
using System.Collections.Generic;

namespace Epvs;

/// <summary>Describes a state-machine step that has waited longer than the scheme's stall threshold.</summary>
public sealed class TransitionStalledEventArgs : EventArgs
{
    /// <summary>Creates the event data.</summary>
    /// <param name="fromState">The state the waiting step starts from.</param>
    /// <param name="elapsed">How long the step has been in flight.</param>
    /// <param name="blockingThreads">The protected threads the step waits for.</param>
    public TransitionStalledEventArgs(VersionSchemeState fromState, TimeSpan elapsed, IReadOnlyList<EpochSlotInfo> blockingThreads)
    {
        FromState = fromState;
        Elapsed = elapsed;
        BlockingThreads = blockingThreads;
    }

    /// <summary>The state the waiting step starts from.</summary>
    public VersionSchemeState FromState { get; }

    /// <summary>How long the step has been in flight when the event was raised.</summary>
    public TimeSpan Elapsed { get; }

    /// <summary>The protected threads the step waits for, oldest announcement first.</summary>
    public IReadOnlyList<EpochSlotInfo> BlockingThreads { get; }
}
