using System.Collections.Generic;
using System.Text;

namespace Epvs;

/// <summary>
/// A point-in-time view of a <see cref="LightEpoch"/>: the global epochs, the protected threads and the pending
/// deferred actions. Taken without stopping anyone, so it is approximate under concurrency; meant for debugging
/// stalls (<see cref="ToString"/> prints a readable dump).
/// </summary>
public sealed class EpochTableSnapshot
{
    internal EpochTableSnapshot(long currentEpoch, long safeToReclaimEpoch, int tableCapacity, int drainListCapacity,
        IReadOnlyList<EpochSlotInfo> protectedThreads, IReadOnlyList<long> pendingActionEpochs)
    {
        CurrentEpoch = currentEpoch;
        SafeToReclaimEpoch = safeToReclaimEpoch;
        TableCapacity = tableCapacity;
        DrainListCapacity = drainListCapacity;
        ProtectedThreads = protectedThreads;
        PendingActionEpochs = pendingActionEpochs;
    }

    /// <summary>The global epoch.</summary>
    public long CurrentEpoch { get; }

    /// <summary>The largest epoch last found safe.</summary>
    public long SafeToReclaimEpoch { get; }

    /// <summary>Slots in the thread table (it grows with the peak number of protected threads).</summary>
    public int TableCapacity { get; }

    /// <summary>Slots in the pending-action list (it grows with the peak number of pending actions).</summary>
    public int DrainListCapacity { get; }

    /// <summary>Threads protected at the time of the snapshot, oldest announcement first (those stepped aside in a Refresh last: see <see cref="EpochSlotInfo.IsSteppedAside"/>).</summary>
    public IReadOnlyList<EpochSlotInfo> ProtectedThreads { get; }

    /// <summary>For each pending deferred action, the epoch that must become safe before it runs (sorted).</summary>
    public IReadOnlyList<long> PendingActionEpochs { get; }

    /// <inheritdoc/>
    public override string ToString()
    {
        var sb = new StringBuilder();
        sb.Append("LightEpoch: current epoch ").Append(CurrentEpoch)
          .Append(", safe to reclaim ").Append(SafeToReclaimEpoch)
          .Append(", table ").Append(TableCapacity).Append(" slots, drain list ").Append(DrainListCapacity).AppendLine(" slots");
        sb.Append("  protected threads: ").Append(ProtectedThreads.Count).AppendLine();
        foreach (EpochSlotInfo slot in ProtectedThreads)
            sb.Append("    ").Append(slot.ToString()).AppendLine();
        sb.Append("  pending actions: ").Append(PendingActionEpochs.Count);
        if (PendingActionEpochs.Count > 0)
        {
            sb.Append(" (waiting for epochs ").Append(PendingActionEpochs[0]);
            if (PendingActionEpochs.Count > 1)
                sb.Append("..").Append(PendingActionEpochs[PendingActionEpochs.Count - 1]);
            sb.Append(" to become safe)");
        }
        return sb.AppendLine().ToString();
    }
}
