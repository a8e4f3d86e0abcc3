using System;
using System.Collections.Generic;
using System.Threading.Tasks;

namespace Epvs.Samples.CprCheckpoint;

/// <summary>
/// Fig. 10: REST(v) → WAIT_FLUSH(v) → REST(v + 1). The critical section into WAIT_FLUSH takes the cut (the
/// de-duplication vector; the records of version ≤ v are frozen by the phase itself); the file is written on a
/// background task after WAIT_FLUSH is published; the step back to REST is available once the file is complete (or
/// failed, so that a disk error never wedges the store).
/// </summary>
internal sealed class CheckpointStateMachine : VersionSchemeStateMachine
{
    private readonly CprStore store;
    private List<KeyValuePair<long, long>>? vector;
    private volatile bool flushDone;

    public CheckpointStateMachine(CprStore store) => this.store = store;

    public long CheckpointVersion { get; private set; } = -1;

    public CheckpointInfo? Info { get; private set; }

    public Exception? FlushError { get; private set; }

    public override bool GetNextStep(VersionSchemeState currentState, out VersionSchemeState nextState)
    {
        if (currentState.Phase == VersionSchemeState.Rest)
        {
            nextState = VersionSchemeState.Make(CprStore.WaitFlush, currentState.Version);
            return true;
        }
        nextState = VersionSchemeState.Make(VersionSchemeState.Rest, currentState.Version + 1);
        return flushDone; // volatile read: pairs with the flush task's volatile write
    }

    public override void OnEnteringState(VersionSchemeState fromState, VersionSchemeState toState)
    {
        if (toState.Phase == CprStore.WaitFlush)
        {
            CheckpointVersion = toState.Version;
            vector = store.CaptureClients();
        }
    }

    public override void AfterEnteringState(VersionSchemeState state)
    {
        if (state.Phase != CprStore.WaitFlush)
            return;
        long version = state.Version;
        List<KeyValuePair<long, long>> cut = vector!;
        Task.Run(() =>
        {
            try
            {
                Info = store.WriteCheckpoint(version, cut);
            }
            catch (Exception ex)
            {
                FlushError = ex; // reported by TakeCheckpointAsync; the previous checkpoint stays the latest
            }
            flushDone = true; // volatile write: Info/FlushError happen-before GetNextStep sees it
            store.Scheme.SignalStepAvailable();
        });
    }
}
