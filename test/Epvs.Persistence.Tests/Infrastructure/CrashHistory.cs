using System;
using System.Collections.Concurrent;
using System.Collections.Generic;
using System.Linq;

namespace Epvs.Persistence.Tests;

/// <summary>
/// The oracle of the crash tests: every block operation with the crash-point counter read before it started and after
/// it completed. For a crash at point c (the image is the state just before event c), an operation that completed
/// with counter ≤ c is durable, and one that started with counter &gt; c left no trace.
/// </summary>
internal sealed class CrashHistory
{
    private readonly ConcurrentDictionary<long, BlockRecord> _byUid = new();

    internal IEnumerable<BlockRecord> Records => _byUid.Values;

    internal void Add(BlockRecord record) => _byUid[record.Uid] = record;

    /// <summary>Returns every way the recovered heap disagrees with the history at crash point <paramref name="point"/> (empty when it agrees).</summary>
    internal List<string> Check(long point, PersistentHeap recovered)
    {
        var violations = new List<string>();
        var found = new Dictionary<long, (PayloadRef Ref, PayloadHeader Header)>();
        recovered.ForEachAllocated((block, header) =>
        {
            lock (found)
            {
                found[block.Offset] = (block, header);
            }
        });

        var offsetsSeen = new HashSet<long>();
        foreach ((long offset, (PayloadRef block, PayloadHeader header)) in found)
        {
            if (!_byUid.TryGetValue(header.Uid, out BlockRecord? record) || record.Offset != offset)
            {
                violations.Add($"phantom block at 0x{offset:X}: {header} matches no allocation in the history");
                continue;
            }

            if (header.Size != record.Size || header.TypeId != record.TypeId || header.EpochTag != record.Epoch || header.Kind != PayloadKind.Alloc)
            {
                violations.Add($"block 0x{offset:X} header {header} differs from its allocation (size {record.Size}, type {record.TypeId}, epoch {record.Epoch})");
            }

            if (record.AllocStart > point || record.FreeEnd <= point)
            {
                violations.Add($"block 0x{offset:X} uid {record.Uid} is present but {(record.AllocStart > point ? "its allocation started after the crash" : "its free was durable")}");
            }

            if (record.ContentKnown && record.AllocEnd <= point && record.FreeStart > point && !Stamp.Matches(recovered.GetPayload(block), record.Uid))
            {
                violations.Add($"block 0x{offset:X} uid {record.Uid} was persisted but its payload differs");
            }
        }

        foreach (BlockRecord record in _byUid.Values)
        {
            bool mustBePresent = record.AllocEnd <= point && record.FreeStart > point;
            if (mustBePresent && !(found.TryGetValue(record.Offset, out var hit) && hit.Header.Uid == record.Uid))
            {
                violations.Add($"block 0x{record.Offset:X} uid {record.Uid} was durably allocated (persist done at {record.AllocEnd} ≤ {point}) but is missing");
            }
        }

        HeapStatistics stats = recovered.RecoveryStatistics;
        if (!stats.AddsUp)
        {
            violations.Add($"accounting does not add up: {stats}");
        }

        if (stats.LiveBlocks != found.Count)
        {
            violations.Add($"accounting counts {stats.LiveBlocks} live blocks, the scan finds {found.Count}");
        }

        return violations;
    }

    /// <summary>
    /// Carries the history into the next cycle: blocks present after recovery are durable from now on (their content
    /// known only if it was persisted); everything else is forgotten.
    /// </summary>
    internal CrashHistory CarryOver(long point, PersistentHeap recovered)
    {
        var next = new CrashHistory();
        recovered.ForEachAllocated((block, header) =>
        {
            BlockRecord old = _byUid[header.Uid];
            next.Add(new BlockRecord(old.Uid, old.Offset, old.Size, old.TypeId, old.Epoch)
            {
                AllocStart = -1,
                AllocEnd = -1,
                ContentKnown = old.ContentKnown && old.AllocEnd <= point,
            });
        });
        return next;
    }
}

/// <summary>One block's life in a crash workload. Counters are <see cref="SimulatedPersistenceDomain.CrashPointCount"/> values.</summary>
internal sealed class BlockRecord
{
    internal BlockRecord(long uid, long offset, int size, int typeId, long epoch)
    {
        Uid = uid;
        Offset = offset;
        Size = size;
        TypeId = typeId;
        Epoch = epoch;
    }

    internal long Uid { get; }

    internal long Offset { get; }

    internal int Size { get; }

    internal int TypeId { get; }

    internal long Epoch { get; }

    internal long AllocStart { get; set; } = long.MaxValue;

    /// <summary>Counter after the block's persist returned; <see cref="long.MaxValue"/> if it was never persisted.</summary>
    internal long AllocEnd { get; set; } = long.MaxValue;

    internal long FreeStart { get; set; } = long.MaxValue;

    internal long FreeEnd { get; set; } = long.MaxValue;

    /// <summary>Whether the payload is the block's stamp once the allocation is durable.</summary>
    internal bool ContentKnown { get; set; } = true;
}
