using System;
using System.Collections.Concurrent;
using System.Threading;

namespace Epvs.Tests;

/// <summary>
/// A test machine: REST(v) → phase 1(v) → ... → phase n-1(v) → REST(target). Records every callback; a step can be
/// held back (<see cref="HoldStep"/>) to test <see cref="EpochProtectedVersionScheme.SignalStepAvailable"/>.
/// </summary>
internal sealed class PhaseMachine : VersionSchemeStateMachine
{
    private readonly int phases;
    private int heldStep = -1;

    public PhaseMachine(int phases, long toVersion = -1)
        : base(toVersion) => this.phases = phases;

    public ConcurrentQueue<string> Log { get; } = new();

    public Action<VersionSchemeState, VersionSchemeState>? OnEntering { get; set; }

    public Action<VersionSchemeState>? AfterEntering { get; set; }

    /// <summary>GetNextStep returns false while leaving phase <paramref name="phase"/>, until <see cref="ReleaseStep"/>.</summary>
    public void HoldStep(byte phase) => Volatile.Write(ref heldStep, phase);

    public void ReleaseStep() => Volatile.Write(ref heldStep, -1);

    public override bool GetNextStep(VersionSchemeState currentState, out VersionSchemeState nextState)
    {
        if (currentState.Phase == Volatile.Read(ref heldStep))
        {
            nextState = default;
            return false;
        }
        int next = currentState.Phase + 1;
        nextState = next >= phases
            ? VersionSchemeState.Make(VersionSchemeState.Rest, ActualToVersion)
            : VersionSchemeState.Make((byte)next, currentState.Version);
        return true;
    }

    public override void OnEnteringState(VersionSchemeState fromState, VersionSchemeState toState)
    {
        Log.Enqueue($"on {fromState}->{toState}");
        OnEntering?.Invoke(fromState, toState);
    }

    public override void AfterEnteringState(VersionSchemeState state)
    {
        Log.Enqueue($"after {state}");
        AfterEntering?.Invoke(state);
    }
}
