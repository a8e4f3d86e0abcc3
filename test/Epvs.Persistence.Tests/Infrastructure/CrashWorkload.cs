using System;
using System.Collections.Generic;

namespace Epvs.Persistence.Tests;

/// <summary>
/// A deterministic (per seed and thread) mix of allocations of many sizes (some large), payload stamps, persists,
/// unpersisted allocations, and durable frees, recorded in a <see cref="CrashHistory"/>. With <c>tinyPayloads</c>, every
/// payload is 0 to 16 bytes: the 48-byte class only, whose headers straddle cache lines and whose segments end in a
/// 16-byte tail.
/// </summary>
internal static class CrashWorkload
{
    internal static void Run(PersistentHeap heap, SimulatedPersistenceDomain domain, CrashHistory history, int seed, int operations, List<BlockRecord> owned, bool tinyPayloads = false)
    {
        var random = new Random(seed);
        for (int op = 0; op < operations; op++)
        {
            if (owned.Count > 0 && random.Next(3) == 0)
            {
                int index = random.Next(owned.Count);
                BlockRecord victim = owned[index];
                owned[index] = owned[^1];
                owned.RemoveAt(owned.Count - 1);
                victim.FreeStart = domain.CrashPointCount;
                heap.Free(new PayloadRef(victim.Offset));
                heap.WriteBackHeader(new PayloadRef(victim.Offset));
                heap.Fence();
                victim.FreeEnd = domain.CrashPointCount;
                continue;
            }

            int size = tinyPayloads ? random.Next(0, 17) : random.Next(20) == 0 ? 70_000 + random.Next(70_000) : random.Next(8) == 0 ? random.Next(2_000, 9_000) : random.Next(0, 600);
            int typeId = random.Next(1, 100);
            long epoch = random.Next(1, 1000);
            long uid = heap.NewUid();
            long start = domain.CrashPointCount;
            if (!heap.TryAllocate(size, typeId, out PayloadRef block, epoch, uid: uid))
            {
                continue;
            }

            var record = new BlockRecord(uid, block.Offset, size, typeId, epoch) { AllocStart = start };
            history.Add(record);
            Stamp.Write(heap.GetPayload(block), uid);
            if (random.Next(6) != 0)
            {
                heap.Persist(block);
                record.AllocEnd = domain.CrashPointCount;
            }

            owned.Add(record);
        }
    }
}
