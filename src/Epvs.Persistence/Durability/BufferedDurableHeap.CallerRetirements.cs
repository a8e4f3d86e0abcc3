using System.Collections.Concurrent;
using System.Threading;

namespace Epvs.Persistence;

/// <summary>
/// A payload replaced or deleted twice through the public <see cref="DurableOperation.Replace(PayloadRef, int)"/> and
/// <see cref="DurableOperation.Delete(PayloadRef)"/> (their precondition: not yet replaced or deleted) was retired
/// twice: both calls returned, and the heap failed at the version's reclamation ("parked for the sweep twice"), taking
/// every later write with it. The second call is now refused as it is made.
/// </summary>
public sealed unsafe partial class BufferedDurableHeap
{
    /// <summary>The payloads the public Replace and Delete retired whose version is not reclaimed yet (offset → version).
    /// The library's structures, whose indexes never retire a payload twice, skip it (<see cref="DurableOperation.ReplaceOwned"/>,
    /// <see cref="DurableOperation.DeleteOwned"/>).</summary>
    private readonly ConcurrentDictionary<long, long> _retiredByCallers = new();

    /// <summary>
    /// Claims <paramref name="current"/>'s retirement for a public Replace or Delete in <paramref name="version"/>, before
    /// anything is allocated for it: throws if it was retired already, in a version not yet reclaimed (claimed here) or in
    /// one reclaimed whose blocks still wait for the sweep (parked: a block the sweep has freed fails the header check
    /// every such call makes first). Give it back with <see cref="ReleaseRetirement"/> if the call then fails, or record
    /// it with <see cref="RecordRetirement"/> once retired.
    /// </summary>
    internal void ClaimRetirement(PayloadRef current, long version)
    {
        if ((_faults & DurabilityFaults.AcceptDoubleRetirement) != 0)
        {
            return;
        }

        // The claim first, then the parked bit and the header: reclamation parks a version's blocks before it forgets their
        // claims, and the sweep frees a parked block's header after it clears its bit, so a retirement is seen in one of
        // the three until the block is handed out again (a stale reference to a block reused since is not).
        bool claimed = _retiredByCallers.TryAdd(current.Offset, version);
        if (!claimed && _retiredByCallers.TryGetValue(current.Offset, out long earlier) && earlier <= Volatile.Read(ref _lastReclaimedVersion))
        {
            // Left by a call that failed after its claim (out of memory recording it): its version is reclaimed, so it is
            // no retirement of the block as it is now.
            claimed = _retiredByCallers.TryUpdate(current.Offset, version, earlier);
        }

        bool parked = claimed && _heap.IsParked(current);
        bool freed = claimed && !parked && !_heap.IsAllocated(current);
        if (!claimed || parked || freed)
        {
            if (claimed)
            {
                _retiredByCallers.TryRemove(current.Offset, out _);
            }

            ThrowHelper.ThrowInvalidOperation($"The payload at offset {current.Offset} was already replaced or deleted (its block is not reused yet): a second Replace or Delete would retire it twice. Use the payload the first Replace returned, or nothing once it is deleted.");
        }
    }

    /// <summary>Gives back a claim (if <paramref name="claimed"/>) whose Replace or Delete failed before it retired anything.</summary>
    internal void ReleaseRetirement(PayloadRef current, bool claimed)
    {
        if (claimed && (_faults & DurabilityFaults.AcceptDoubleRetirement) == 0)
        {
            _retiredByCallers.TryRemove(current.Offset, out _);
        }
    }

    /// <summary>Records a claimed retirement (if <paramref name="claimed"/>) in its version's list, to be forgotten when the version is reclaimed.</summary>
    internal void RecordRetirement(ThreadBuffers buffers, int slot, PayloadRef current, bool claimed)
    {
        if (claimed && (_faults & DurabilityFaults.AcceptDoubleRetirement) == 0)
        {
            buffers.CallerRetired[slot].Add(current.Offset);
        }
    }

    /// <summary>Whether a public call retired <paramref name="current"/> in a version not reclaimed yet (an update in place of a deleted payload).</summary>
    internal bool RetiredByACaller(PayloadRef current) => _retiredByCallers.ContainsKey(current.Offset); // lock-free (IsEmpty takes every lock)

    /// <summary>The last version whose retired blocks reclamation has parked or freed (claims of it or older are stale).</summary>
    private long _lastReclaimedVersion;

    /// <summary>Under the cycle gate, once version <paramref name="version"/>'s retired blocks are parked or free: forgets their claims.</summary>
    private void ForgetCallerRetirements(ThreadBuffers[] registry, long version)
    {
        // Volatile.Write: atomic 64-bit store for ClaimRetirement's look on any thread.
        Volatile.Write(ref _lastReclaimedVersion, version);
        int slot = ThreadBuffers.Slot(version);
        foreach (ThreadBuffers buffers in registry)
        {
            OffsetList list = buffers.CallerRetired[slot];
            if (list.Count == 0)
            {
                continue;
            }

            for (int i = 0; i < list.Count; i++)
            {
                _retiredByCallers.TryRemove(list[i], out _);
            }

            list.Clear();
        }
    }
}
