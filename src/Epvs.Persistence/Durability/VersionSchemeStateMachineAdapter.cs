using Epvs;

namespace Epvs.Persistence;

/// <summary>A one-step machine: from rest at version v straight to rest at v + 1.</summary>
internal abstract class VersionSchemeStateMachineAdapter : VersionSchemeStateMachine
{
    public override bool GetNextStep(VersionSchemeState currentState, out VersionSchemeState nextState)
    {
        nextState = VersionSchemeState.Make(VersionSchemeState.Rest, ActualToVersion);
        return true;
    }

    public override void AfterEnteringState(VersionSchemeState state)
    {
    }
}
