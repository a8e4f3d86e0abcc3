using System.Threading;
using Epvs.Scaling.Harness;

namespace Epvs.Scaling.Work;

/// <summary>The C# reader–writer latch: operations take <see cref="ReaderWriterLockSlim"/> shared, version changes
/// take it exclusive.</summary>
public sealed class ReaderWriterLockWorkload : ProtectedWorkload
{
    private readonly ReaderWriterLockSlim[] locks;

    /// <summary>Creates <see cref="WorkSpec.Instances"/> latches.</summary>
    public ReaderWriterLockWorkload(WorkSpec spec)
        : base(spec)
    {
        locks = new ReaderWriterLockSlim[spec.Instances];
        for (int i = 0; i < locks.Length; i++)
            locks[i] = new ReaderWriterLockSlim(LockRecursionPolicy.NoRecursion);
    }

    /// <inheritdoc/>
    public override long Run(int thread, StopFlag stop)
    {
        var local = new ulong[8];
        var scratch = new ulong[8];
        var rng = new FastRandom((ulong)thread + 1);
        ulong threshold = FastRandom.Threshold(Spec.P);
        int rounds = Spec.Rounds, depth = Spec.Depth;
        var mine = new ReaderWriterLockSlim[depth];
        for (int d = 0; d < depth; d++)
            mine[d] = locks[Spec.InstanceFor(thread, d)];
        long ops = 0;
        while (!stop.IsSet)
        {
            for (int i = 0; i < Batch; i++)
            {
                for (int d = 0; d < depth; d++)
                    mine[d].EnterReadLock();
                HashWork.Run(local, rounds);
                for (int d = depth - 1; d >= 0; d--)
                    mine[d].ExitReadLock();
                if (rng.NextUInt64() < threshold)
                {
                    mine[0].EnterWriteLock();
                    CriticalWork(scratch);
                    mine[0].ExitWriteLock();
                }
            }
            ops += Batch;
        }
        return ops;
    }

    /// <inheritdoc/>
    public override void Dispose()
    {
        foreach (ReaderWriterLockSlim l in locks)
            l.Dispose();
    }
}
