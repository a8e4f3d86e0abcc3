using System;

namespace Epvs;

/// <summary>Describes a deferred action that threw while a <see cref="LightEpoch"/> drained it.</summary>
public sealed class DeferredActionFailedEventArgs : EventArgs
{
    /// <summary>Creates the event data.</summary>
    /// <param name="exception">What the action threw.</param>
    public DeferredActionFailedEventArgs(Exception exception) => Exception = exception;

    /// <summary>What the action threw.</summary>
    public Exception Exception { get; }
}
