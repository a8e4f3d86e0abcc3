using System;

namespace Epvs.Tests;

/// <summary>A one-step machine whose next state is computed by a delegate (for invalid-step tests).</summary>
internal sealed class DelegateMachine : VersionSchemeStateMachine
{
    private readonly Func<VersionSchemeState, VersionSchemeState> next;

    public DelegateMachine(long toVersion, Func<VersionSchemeState, VersionSchemeState> next)
        : base(toVersion) => this.next = next;

    public override bool GetNextStep(VersionSchemeState currentState, out VersionSchemeState nextState)
    {
        nextState = next(currentState);
        return true;
    }

    public override void OnEnteringState(VersionSchemeState fromState, VersionSchemeState toState)
    {
    }

    public override void AfterEnteringState(VersionSchemeState state)
    {
    }
}
