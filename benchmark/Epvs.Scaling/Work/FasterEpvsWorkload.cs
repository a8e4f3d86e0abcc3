using System;
using Epvs.Scaling.Harness;
using FasterEpoch = FASTER.core.LightEpoch;
using FasterEpvs = FASTER.core.EpochProtectedVersionScheme;

namespace Epvs.Scaling.Work;

/// <summary>
/// FASTER.core 2.6.5's scheme running the same loop as <see cref="EpvsWorkload"/> (Enter/Leave). FASTER.core cannot
/// nest on one epoch, so each instance has its own <c>LightEpoch</c>; its table has 128 entries, so it is never run
/// with more threads than that.
/// </summary>
public sealed class FasterEpvsWorkload : ProtectedWorkload
{
    private readonly FasterEpoch[] epochs;
    private readonly FasterEpvs[] schemes;
    private readonly Action<long, long> criticalSection;
    private readonly ulong[] criticalScratch = new ulong[8];

    /// <summary>Creates <see cref="WorkSpec.Instances"/> schemes, each on its own epoch.</summary>
    public FasterEpvsWorkload(WorkSpec spec)
        : base(spec)
    {
        epochs = new FasterEpoch[spec.Instances];
        schemes = new FasterEpvs[spec.Instances];
        for (int i = 0; i < schemes.Length; i++)
        {
            epochs[i] = new FasterEpoch();
            schemes[i] = new FasterEpvs(epochs[i]);
        }
        criticalSection = (_, _) => CriticalWork(criticalScratch);
    }

    /// <inheritdoc/>
    public override long Run(int thread, StopFlag stop)
    {
        var local = new ulong[8];
        var rng = new FastRandom((ulong)thread + 1);
        ulong threshold = FastRandom.Threshold(Spec.P);
        int rounds = Spec.Rounds, depth = Spec.Depth;
        var mine = new FasterEpvs[depth];
        for (int d = 0; d < depth; d++)
            mine[d] = schemes[Spec.InstanceFor(thread, d)];
        FasterEpvs first = mine[0];
        long ops = 0;
        while (!stop.IsSet)
        {
            for (int i = 0; i < Batch; i++)
            {
                var state = first.Enter();
                for (int d = 1; d < depth; d++)
                    mine[d].Enter();
                HashWork.Run(local, rounds);
                if (rng.NextUInt64() < threshold)
                {
                    if (Spec.Phases <= 1)
                        first.TryAdvanceVersionWithCriticalSection(criticalSection, state.Version + 1);
                    else if (first.CurrentState().Version == state.Version && first.CurrentState().Phase == FASTER.core.VersionSchemeState.REST)
                        first.TryExecuteStateMachine(new FasterPhasedMachine(Spec.Phases, Spec.CriticalRounds, criticalScratch));
                }
                for (int d = depth - 1; d >= 0; d--)
                    mine[d].Leave();
            }
            ops += Batch;
        }
        return ops;
    }

    /// <inheritdoc/>
    public override void Dispose()
    {
        foreach (FasterEpoch e in epochs)
            e.Dispose();
    }
}
