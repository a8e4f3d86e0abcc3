using System;
using System.Collections.Generic;
using System.Linq;
using System.Threading;

namespace Epvs.Persistence.Tests;

/// <summary>Recovers a crash image and compares it with the op log: prefix of versions ≤ the recovered cut, promises kept, no uid twice, no leak.</summary>
internal static class DurableCrashCheck
{
    internal static List<string> Check(byte[] image, long capacity, OpLog log, long point, DurabilityFaults recoveryFaults, out long cut, out Dictionary<long, byte[]> contents, HeapFaults heapFaults = HeapFaults.None)
    {
        var violations = new List<string>();
        using var domain = SimulatedPersistenceDomain.FromImage(image, capacity);
        using HeapFile file = HeapFile.Open(domain);
        BufferedDurableHeap opened;
        try
        {
            opened = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, Faults = recoveryFaults, HeapFaults = heapFaults, RecoveryParallelism = 2 });
        }
        catch (HeapFileException damage) when (damage.Error == HeapFileError.Corrupt)
        {
            // The heap's integrity checks fired: a crash alone never damages a block, so this is a violation too.
            cut = -1;
            contents = new Dictionary<long, byte[]>();
            violations.Add($"damaged blocks reported at recovery: {damage.Message}");
            return violations;
        }

        using BufferedDurableHeap heap = opened;
        cut = heap.Recovery.RecoveredVersion;
        PersistentByteMap<long> map;
        try
        {
            map = new PersistentByteMap<long>(heap, DurableWorkload.MapTypeId);
        }
        catch (System.IO.InvalidDataException inner)
        {
            // The structure's own consistency check (two live payloads for one key) fired: report, not crash.
            contents = new Dictionary<long, byte[]>();
            violations.Add($"inconsistent heap at cut {cut}: {inner.Message}");
            return violations;
        }

        contents = DurableWorkload.Contents(map);
        violations.AddRange(log.Compare(cut, contents));
        long promised = log.PromisedAt(point);
        if (cut < promised)
        {
            violations.Add($"version {promised} was promised durable (Sync returned or frontier persisted) before crash point {point}, but recovery kept only versions ≤ {cut}");
        }

        violations.AddRange(UidsAndLeaks(heap, map.Count));
        return violations;
    }

    internal static List<string> UidsAndLeaks(BufferedDurableHeap heap, long entries)
    {
        var violations = new List<string>();
        var uids = new Dictionary<long, int>();
        heap.Heap.ForEachAllocated((_, header) =>
        {
            lock (uids)
            {
                uids[header.Uid] = uids.TryGetValue(header.Uid, out int n) ? n + 1 : 1;
            }
        });
        foreach ((long uid, int count) in uids.Where(u => u.Value > 1).Take(3))
        {
            violations.Add($"uid {uid} is held by {count} blocks after recovery");
        }

        HeapStatistics stats = heap.Heap.GetStatistics();
        if (stats.LiveBlocks != entries)
        {
            violations.Add($"leak: {stats.LiveBlocks} live blocks after recovery for {entries} live entries");
        }

        if (!stats.AddsUp)
        {
            violations.Add($"accounting does not add up: {stats}");
        }

        return violations;
    }
}
