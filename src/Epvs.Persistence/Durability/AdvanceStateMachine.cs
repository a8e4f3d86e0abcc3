namespace Epvs.Persistence;

/// <summary>
/// The advancer's one-step transition: rest at version v to rest at v + 1. The critical section dates the new version;
/// it persists the epoch clock only when the clock on the file is below v + 1 (the first transition after opening:
/// every later one finds v + 1 persisted with frontier v − 1, see <see cref="BufferedDurableHeap"/>'s advance cycle).
/// </summary>
internal sealed class AdvanceStateMachine : VersionSchemeStateMachineAdapter
{
    private readonly BufferedDurableHeap _heap;

    internal AdvanceStateMachine(BufferedDurableHeap heap) => _heap = heap;

    public override void OnEnteringState(Epvs.VersionSchemeState fromState, Epvs.VersionSchemeState toState) =>
        _heap.PersistClockInCriticalSection(fromState.Version, toState.Version);
}
