using System.Threading.Tasks;

namespace Epvs.Samples.ResizableArray;

/// <summary>
/// Fig. 5: REST(v) → COPYING(v) → REST(v + 1). Entering COPYING allocates the new array (critical section) and starts
/// the copy on a background task (<see cref="AfterEnteringState"/>, no exclusion); the step back to REST is available
/// once the copy is done, and swings the array reference (critical section).
/// </summary>
internal sealed class ArrayGrowthStateMachine : VersionSchemeStateMachine
{
    private readonly TwoPhaseEpvsResizableArray array;
    private long[]? grown;
    private volatile bool copyDone;

    public ArrayGrowthStateMachine(TwoPhaseEpvsResizableArray array, long toVersion)
        : base(toVersion)
    {
        this.array = array;
    }

    public override bool GetNextStep(VersionSchemeState currentState, out VersionSchemeState nextState)
    {
        if (currentState.Phase == VersionSchemeState.Rest)
        {
            nextState = VersionSchemeState.Make(TwoPhaseEpvsResizableArray.Copying, currentState.Version);
            return true;
        }
        nextState = VersionSchemeState.Make(VersionSchemeState.Rest, currentState.Version + 1);
        return copyDone; // volatile read: pairs with the copy task's volatile write
    }

    public override void OnEnteringState(VersionSchemeState fromState, VersionSchemeState toState)
    {
        if (toState.Phase == TwoPhaseEpvsResizableArray.Copying)
            grown = array.BeginGrowth(this);
        else
            array.EndGrowth(grown!);
    }

    public override void AfterEnteringState(VersionSchemeState state)
    {
        if (state.Phase != TwoPhaseEpvsResizableArray.Copying)
            return;
        long[] target = grown!;
        // Asynchronously, as in Fig. 5: whichever thread published COPYING returns to its own work at once.
        // Copying two valid arrays cannot fail; were it to, the array would stay in COPYING (reads and pushes still
        // work, writes to old indices wait) rather than swing to an incomplete copy.
        Task.Run(() =>
        {
            array.CopyInto(target);
            copyDone = true; // volatile write: the copy happens-before GetNextStep seeing it
            array.Scheme.SignalStepAvailable();
        });
    }
}
