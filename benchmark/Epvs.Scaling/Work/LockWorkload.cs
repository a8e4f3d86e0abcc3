using System.Threading;
using Epvs.Scaling.Harness;

namespace Epvs.Scaling.Work;

/// <summary>The paper's latched baseline: every operation in mutual exclusion (<see cref="Lock"/>, .NET 9+).</summary>
public sealed class LockWorkload : ProtectedWorkload
{
    private readonly Lock[] locks;

    /// <summary>Creates <see cref="WorkSpec.Instances"/> locks.</summary>
    public LockWorkload(WorkSpec spec)
        : base(spec)
    {
        locks = new Lock[spec.Instances];
        for (int i = 0; i < locks.Length; i++)
            locks[i] = new Lock();
    }

    /// <inheritdoc/>
    public override long Run(int thread, StopFlag stop)
    {
        var local = new ulong[8];
        var scratch = new ulong[8];
        var rng = new FastRandom((ulong)thread + 1);
        ulong threshold = FastRandom.Threshold(Spec.P);
        int rounds = Spec.Rounds, depth = Spec.Depth;
        var mine = new Lock[depth];
        for (int d = 0; d < depth; d++)
            mine[d] = locks[Spec.InstanceFor(thread, d)];
        long ops = 0;
        while (!stop.IsSet)
        {
            for (int i = 0; i < Batch; i++)
            {
                for (int d = 0; d < depth; d++)
                    mine[d].Enter();
                HashWork.Run(local, rounds);
                if (rng.NextUInt64() < threshold)
                    CriticalWork(scratch); // already exclusive
                for (int d = depth - 1; d >= 0; d--)
                    mine[d].Exit();
            }
            ops += Batch;
        }
        return ops;
    }
}
