namespace Epvs.Tests;

/// <summary>A machine of one step (to rest at its target version), available only once <see cref="Gate"/> is set: a
/// blocking start or wait for it spins until something (typically a deferred action) opens the gate.</summary>
internal sealed class GateMachine : VersionSchemeStateMachine
{
    public volatile bool Gate;

    public override bool GetNextStep(VersionSchemeState currentState, out VersionSchemeState nextState)
    {
        nextState = VersionSchemeState.Make(VersionSchemeState.Rest, ActualToVersion);
        return Gate;
    }

    public override void OnEnteringState(VersionSchemeState fromState, VersionSchemeState toState)
    {
    }

    public override void AfterEnteringState(VersionSchemeState state)
    {
    }
}
