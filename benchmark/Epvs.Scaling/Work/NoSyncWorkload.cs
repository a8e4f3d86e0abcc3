using Epvs.Scaling.Harness;

namespace Epvs.Scaling.Work;

/// <summary>The paper's latch-free baseline: the work with no synchronization at all (version changes run their work
/// inline, unsynchronized). The upper bound.</summary>
public sealed class NoSyncWorkload : ProtectedWorkload
{
    /// <summary>Creates it.</summary>
    public NoSyncWorkload(WorkSpec spec)
        : base(spec)
    {
    }

    /// <inheritdoc/>
    public override long Run(int thread, StopFlag stop)
    {
        var local = new ulong[8];
        var scratch = new ulong[8];
        var rng = new FastRandom((ulong)thread + 1);
        ulong threshold = FastRandom.Threshold(Spec.P);
        int rounds = Spec.Rounds;
        long ops = 0;
        while (!stop.IsSet)
        {
            for (int i = 0; i < Batch; i++)
            {
                HashWork.Run(local, rounds);
                if (rng.NextUInt64() < threshold && Spec.CriticalRounds > 0)
                    HashWork.Run(scratch, Spec.CriticalRounds);
            }
            ops += Batch;
        }
        return ops;
    }
}
