using Epvs.Baselines;
using Epvs.Scaling.Harness;

namespace Epvs.Scaling.Work;

/// <summary>BRAVO: operations take the read side (fast path while biased), version changes take the write side
/// (revoking the bias).</summary>
public sealed class BravoWorkload : ProtectedWorkload
{
    private readonly BravoReaderWriterLock[] locks;

    /// <summary>Creates <see cref="WorkSpec.Instances"/> locks on one visible-readers table of
    /// <see cref="WorkSpec.TableSize"/> slots (4096 by default, as in the paper).</summary>
    public BravoWorkload(WorkSpec spec, BravoHashing hashing)
        : base(spec)
    {
        var table = new VisibleReadersTable(spec.TableSize > 0 ? spec.TableSize : VisibleReadersTable.DefaultSize);
        locks = new BravoReaderWriterLock[spec.Instances];
        for (int i = 0; i < locks.Length; i++)
            locks[i] = new BravoReaderWriterLock(table, hashing);
    }

    /// <inheritdoc/>
    public override long Run(int thread, StopFlag stop)
    {
        var local = new ulong[8];
        var scratch = new ulong[8];
        var rng = new FastRandom((ulong)thread + 1);
        ulong threshold = FastRandom.Threshold(Spec.P);
        int rounds = Spec.Rounds, depth = Spec.Depth;
        var mine = new BravoReaderWriterLock[depth];
        var tokens = new int[depth];
        for (int d = 0; d < depth; d++)
            mine[d] = locks[Spec.InstanceFor(thread, d)];
        long ops = 0;
        while (!stop.IsSet)
        {
            for (int i = 0; i < Batch; i++)
            {
                for (int d = 0; d < depth; d++)
                    tokens[d] = mine[d].EnterReadLock();
                HashWork.Run(local, rounds);
                for (int d = depth - 1; d >= 0; d--)
                    mine[d].ExitReadLock(tokens[d]);
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
        foreach (BravoReaderWriterLock l in locks)
            l.Dispose();
    }
}
