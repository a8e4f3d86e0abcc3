using System;

namespace Epvs;

/// <summary>
/// The one-step machine behind <see cref="EpochProtectedVersionScheme.TryAdvanceVersionWithCriticalSection"/>:
/// from rest at version v to rest at the target, running a critical section in between.
/// </summary>
internal sealed class CriticalSectionStateMachine : VersionSchemeStateMachine
{
    private readonly Action<long, long> criticalSection;

    public CriticalSectionStateMachine(Action<long, long> criticalSection, long toVersion)
        : base(toVersion)
    {
        this.criticalSection = criticalSection;
    }

    public override bool GetNextStep(VersionSchemeState currentState, out VersionSchemeState nextState)
    {
        nextState = VersionSchemeState.Make(VersionSchemeState.Rest, ActualToVersion);
        return true;
    }

    public override void OnEnteringState(VersionSchemeState fromState, VersionSchemeState toState) =>
        criticalSection(fromState.Version, toState.Version);

    public override void AfterEnteringState(VersionSchemeState state)
    {
    }
}
