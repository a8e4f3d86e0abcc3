using System.Collections.Generic;
using System.Threading;

namespace Epvs;

public sealed unsafe partial class LightEpoch
{
    /// <summary>
    /// Takes a snapshot of the table and the pending actions for debugging, without stopping other threads. Every thread
    /// that holds a slot is listed, as <see cref="Dispose"/> counts them: those stepped aside inside a
    /// <see cref="EpochProtectedVersionScheme.Refresh"/> too (<see cref="EpochSlotInfo.IsSteppedAside"/>).
    /// </summary>
    /// <returns>The snapshot; <see cref="EpochTableSnapshot.ToString"/> prints a readable dump.</returns>
    public EpochTableSnapshot GetSnapshot() => GetSnapshot(EpochSlotTable.ParkedMarker);

    /// <summary>Snapshot listing only the threads that announced <paramref name="atOrBelow"/> or older (<see cref="EpochSlotTable.ParkedMarker"/>: parked ones too).</summary>
    internal EpochTableSnapshot GetSnapshot(long atOrBelow)
    {
        var threads = new List<EpochSlotInfo>();
        int baseIndex = 0;
        for (Segment<EpochSlot>? s = table.First; s is not null; s = Volatile.Read(ref s.Next))
        {
            EpochSlot[] slots = s.Items;
            for (int i = 0; i < slots.Length; i++)
            {
                long e = Volatile.Read(ref slots[i].Epoch);
                if (e != 0 && e <= atOrBelow)
                    threads.Add(new EpochSlotInfo(baseIndex + i, e, Volatile.Read(ref slots[i].OwnerThreadId)));
            }
            baseIndex += slots.Length;
        }
        threads.Sort((a, b) => a.Epoch.CompareTo(b.Epoch));
        return new EpochTableSnapshot(CurrentEpoch, SafeToReclaimEpoch, table.Capacity, drainList.Capacity,
            threads, drainList.PendingEpochs());
    }
}
