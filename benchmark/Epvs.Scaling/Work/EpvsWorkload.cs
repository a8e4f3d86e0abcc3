using System;
using Epvs.Scaling.Harness;

namespace Epvs.Scaling.Work;

/// <summary>How an <see cref="EpvsWorkload"/> lays out its schemes and threads.</summary>
public enum EpvsMode
{
    /// <summary>Enter and Leave around every operation.</summary>
    EnterLeave,

    /// <summary>Long-running threads: Enter once, Refresh after every operation (the paper's EPVS-pinned).</summary>
    Pinned,
}

/// <summary>
/// EPVS (this library): operations run inside <see cref="EpochProtectedVersionScheme.Enter()"/> … <c>Leave</c> (or
/// between <c>Refresh</c> calls when pinned); a version change is requested from inside the region with
/// <c>TryAdvanceVersionWithCriticalSection(cs, v + 1)</c> (or a <see cref="PhasedMachine"/>) and runs once the
/// requester and everyone else have left or refreshed.
/// </summary>
public sealed class EpvsWorkload : ProtectedWorkload
{
    private readonly EpochProtectedVersionScheme[] schemes;
    private readonly LightEpoch[] epochs;
    private readonly EpvsMode mode;
    private readonly Action<long, long> criticalSection;
    private readonly ulong[] criticalScratch = new ulong[8];

    /// <summary>Creates <see cref="WorkSpec.Instances"/> schemes, on one shared epoch or each on its own.</summary>
    /// <param name="spec">Parameters; <see cref="WorkSpec.TableSize"/> sets the epoch table's initial size.</param>
    /// <param name="mode">Enter/Leave or pinned.</param>
    /// <param name="shareEpoch">Whether the schemes share one <see cref="LightEpoch"/> (required for nesting).</param>
    public EpvsWorkload(WorkSpec spec, EpvsMode mode, bool shareEpoch)
        : base(spec)
    {
        this.mode = mode;
        int tableSize = spec.TableSize > 0 ? spec.TableSize : 16;
        epochs = new LightEpoch[shareEpoch ? 1 : spec.Instances];
        for (int i = 0; i < epochs.Length; i++)
            epochs[i] = new LightEpoch(tableSize);
        schemes = new EpochProtectedVersionScheme[spec.Instances];
        for (int i = 0; i < schemes.Length; i++)
            schemes[i] = new EpochProtectedVersionScheme(epochs[shareEpoch ? 0 : i]);
        criticalSection = (_, _) => CriticalWork(criticalScratch);
        if (spec.Depth > 1 && !shareEpoch)
            throw new ArgumentException("Nested EPVS regions must share one epoch (G8).");
    }

    /// <inheritdoc/>
    public override long Run(int thread, StopFlag stop)
    {
        var local = new ulong[8];
        var rng = new FastRandom((ulong)thread + 1);
        ulong threshold = FastRandom.Threshold(Spec.P);
        int rounds = Spec.Rounds, depth = Spec.Depth;
        var mine = new EpochProtectedVersionScheme[depth];
        for (int d = 0; d < depth; d++)
            mine[d] = schemes[Spec.InstanceFor(thread, d)];
        EpochProtectedVersionScheme first = mine[0];
        long ops = 0;

        if (mode == EpvsMode.Pinned)
        {
            VersionSchemeState state = first.Enter();
            try
            {
                while (!stop.IsSet)
                {
                    for (int i = 0; i < Batch; i++)
                    {
                        HashWork.Run(local, rounds);
                        if (rng.NextUInt64() < threshold)
                            Trigger(first, state);
                        state = first.Refresh();
                    }
                    ops += Batch;
                }
            }
            finally
            {
                first.Leave();
            }
            return ops;
        }

        if (depth == 1)
        {
            while (!stop.IsSet)
            {
                for (int i = 0; i < Batch; i++)
                {
                    VersionSchemeState state = first.Enter();
                    HashWork.Run(local, rounds);
                    if (rng.NextUInt64() < threshold)
                        Trigger(first, state);
                    first.Leave();
                }
                ops += Batch;
            }
            return ops;
        }

        while (!stop.IsSet)
        {
            for (int i = 0; i < Batch; i++)
            {
                VersionSchemeState state = first.Enter();
                for (int d = 1; d < depth; d++)
                    mine[d].Enter();
                HashWork.Run(local, rounds);
                if (rng.NextUInt64() < threshold)
                    Trigger(first, state);
                for (int d = depth - 1; d >= 0; d--)
                    mine[d].Leave();
            }
            ops += Batch;
        }
        return ops;
    }

    private void Trigger(EpochProtectedVersionScheme scheme, VersionSchemeState observed)
    {
        if (Spec.Phases <= 1)
            scheme.TryAdvanceVersionWithCriticalSection(criticalSection, observed.Version + 1);
        else if (scheme.CurrentState.Version == observed.Version && scheme.CurrentState.Phase == VersionSchemeState.Rest)
            scheme.TryExecuteStateMachine(new PhasedMachine(Spec.Phases, Spec.CriticalRounds, criticalScratch));
    }

    /// <inheritdoc/>
    public override void Dispose()
    {
        // Version changes requested at the very end may still be completing on the thread that leaves last.
        foreach (EpochProtectedVersionScheme s in schemes)
        {
            for (int spins = 0; s.CurrentState.IsIntermediate && spins < 1000; spins++)
                s.SignalStepAvailable();
        }
        foreach (EpochProtectedVersionScheme s in schemes)
        {
            try
            {
                s.Dispose();
            }
            catch (InvalidOperationException)
            {
                // A machine still finishing; the process ends soon anyway and nothing else uses the scheme.
            }
        }
        foreach (LightEpoch e in epochs)
        {
            try
            {
                e.Dispose();
            }
            catch (InvalidOperationException)
            {
            }
        }
    }
}
