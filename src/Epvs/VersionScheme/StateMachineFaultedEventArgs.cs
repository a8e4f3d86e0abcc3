using System;

namespace Epvs;

/// <summary>Describes a state machine that ended because one of its callbacks threw.</summary>
public sealed class StateMachineFaultedEventArgs : EventArgs
{
    /// <summary>Creates the event data.</summary>
    /// <param name="stateMachine">The machine that ended.</param>
    /// <param name="exception">What its callback threw.</param>
    /// <param name="state">The scheme's state after the fault was handled.</param>
    public StateMachineFaultedEventArgs(VersionSchemeStateMachine stateMachine, Exception exception, VersionSchemeState state)
    {
        StateMachine = stateMachine;
        Exception = exception;
        State = state;
    }

    /// <summary>The machine that ended (for a critical section, an internal one-step machine).</summary>
    public VersionSchemeStateMachine StateMachine { get; }

    /// <summary>What the callback threw.</summary>
    public Exception Exception { get; }

    /// <summary>The scheme's state after the fault was handled: the step's starting state if
    /// <see cref="VersionSchemeStateMachine.OnEnteringState"/> threw, else the last state entered.</summary>
    public VersionSchemeState State { get; }
}
