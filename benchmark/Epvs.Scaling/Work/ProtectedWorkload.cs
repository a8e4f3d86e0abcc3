using System;
using Epvs.Scaling.Harness;

namespace Epvs.Scaling.Work;

/// <summary>
/// One synchronization mechanism running the protected-work microbenchmark: each operation acquires protection (or
/// a shared latch), hashes thread-local bytes, and with probability <see cref="WorkSpec.P"/> triggers a version
/// change (exclusive access running <see cref="WorkSpec.CriticalRounds"/> of work). Each implementation owns its whole
/// loop, so the measured path has no virtual call per operation.
/// </summary>
public abstract class ProtectedWorkload : IDisposable
{
    /// <summary>Operations between two looks at the stop flag.</summary>
    protected const int Batch = 16;

    /// <summary>Creates the workload's instances.</summary>
    protected ProtectedWorkload(WorkSpec spec) => Spec = spec;

    /// <summary>The parameters.</summary>
    protected WorkSpec Spec { get; }

    /// <summary>Version changes that ran (for sanity checks).</summary>
    public long VersionChanges;

    /// <summary>Runs on worker thread <paramref name="thread"/> until <paramref name="stop"/> is set.</summary>
    /// <returns>Operations completed.</returns>
    public abstract long Run(int thread, StopFlag stop);

    /// <summary>The critical section's work.</summary>
    protected void CriticalWork(ulong[] scratch)
    {
        if (Spec.CriticalRounds > 0)
            HashWork.Run(scratch, Spec.CriticalRounds);
        VersionChanges++;
    }

    /// <summary>Disposes the instances; no worker may be running.</summary>
    public virtual void Dispose()
    {
    }
}
