using Epvs.Scaling.Harness;
using FasterMachine = FASTER.core.VersionSchemeStateMachine;
using FasterState = FASTER.core.VersionSchemeState;

namespace Epvs.Scaling.Work;

/// <summary>The same machine as <see cref="PhasedMachine"/> on FASTER.core's scheme.</summary>
public sealed class FasterPhasedMachine : FasterMachine
{
    private readonly int phases;
    private readonly int roundsPerPhase;
    private readonly ulong[] scratch;

    /// <summary>Creates a machine for the next version.</summary>
    public FasterPhasedMachine(int phases, int totalRounds, ulong[] scratch)
        : base(-1)
    {
        this.phases = phases;
        roundsPerPhase = totalRounds / phases;
        this.scratch = scratch;
    }

    /// <inheritdoc/>
    public override bool GetNextStep(FasterState currentState, out FasterState nextState)
    {
        int next = currentState.Phase + 1;
        nextState = next < phases
            ? FasterState.Make((byte)next, currentState.Version)
            : FasterState.Make(FasterState.REST, actualToVersion);
        return true;
    }

    /// <inheritdoc/>
    public override void OnEnteringState(FasterState fromState, FasterState toState)
    {
        if (roundsPerPhase > 0)
            HashWork.Run(scratch, roundsPerPhase);
    }

    /// <inheritdoc/>
    public override void AfterEnteringState(FasterState state)
    {
    }
}
