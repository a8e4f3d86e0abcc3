namespace Epvs.Persistence;

/// <summary>
/// The advancer's one-step transition: rest at version v to rest at v + 1, persisting the epoch clock inside the
/// critical section (one 8-byte store and persist — the only work done in mutual exclusion with the operations).
/// </summary>
internal sealed class AdvanceStateMachine : VersionSchemeStateMachineAdapter
{
    private readonly BufferedDurableHeap _heap;

    internal AdvanceStateMachine(BufferedDurableHeap heap) => _heap = heap;

    public override void OnEnteringState(Epvs.VersionSchemeState fromState, Epvs.VersionSchemeState toState) =>
        _heap.PersistClockInCriticalSection(fromState.Version, toState.Version);
}
