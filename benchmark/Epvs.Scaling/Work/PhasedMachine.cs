using Epvs.Scaling.Harness;

namespace Epvs.Scaling.Work;

/// <summary>
/// A version change split into <c>phases</c> transitions (REST v → 1 v → … → k−1 v → REST v+1), each critical section
/// doing an equal share of a fixed amount of work (the paper's Fig. 19).
/// </summary>
public sealed class PhasedMachine : VersionSchemeStateMachine
{
    private readonly int phases;
    private readonly int roundsPerPhase;
    private readonly ulong[] scratch;

    /// <summary>Creates a machine for the next version.</summary>
    public PhasedMachine(int phases, int totalRounds, ulong[] scratch)
    {
        this.phases = phases;
        roundsPerPhase = totalRounds / phases;
        this.scratch = scratch;
    }

    /// <inheritdoc/>
    public override bool GetNextStep(VersionSchemeState currentState, out VersionSchemeState nextState)
    {
        int next = currentState.Phase + 1;
        nextState = next < phases
            ? VersionSchemeState.Make((byte)next, currentState.Version)
            : VersionSchemeState.Make(VersionSchemeState.Rest, ActualToVersion);
        return true;
    }

    /// <inheritdoc/>
    public override void OnEnteringState(VersionSchemeState fromState, VersionSchemeState toState)
    {
        if (roundsPerPhase > 0)
            HashWork.Run(scratch, roundsPerPhase);
    }

    /// <inheritdoc/>
    public override void AfterEnteringState(VersionSchemeState state)
    {
    }
}
