using System;
using System.Collections.Concurrent;
using System.Collections.Generic;
using System.Threading;

namespace Epvs.Persistence;

/// <summary>
/// A payload replaced or deleted twice through the public <see cref="DurableOperation.Replace(PayloadRef, int)"/> and
/// <see cref="DurableOperation.Delete(PayloadRef)"/> (their precondition: not yet replaced or deleted) was retired
/// twice: both calls returned, and the heap failed at the version's reclamation ("parked for the sweep twice"), taking
/// every later write with it; or, retired again while a sweep freed it, its block was freed a second time under a new
/// payload. The second call is now refused as it is made: each retirement is claimed until its block's header is free,
/// after which the header check every such call makes first refuses it, until the block holds a new payload (a later
/// version's tag).
/// </summary>
public sealed unsafe partial class BufferedDurableHeap
{
    /// <summary>The payloads the public Replace and Delete retired whose blocks are not free yet (offset → version of the
    /// retirement). The library's structures, whose indexes never retire a payload twice, skip it
    /// (<see cref="DurableOperation.ReplaceOwned"/>, <see cref="DurableOperation.DeleteOwned"/>).</summary>
    private readonly ConcurrentDictionary<long, long> _retiredByCallers = new();

    /// <summary>How many claims <see cref="_retiredByCallers"/> holds (its Count and IsEmpty take every lock).</summary>
    private long _claims;

    /// <summary>Test hook: how many retirements are claimed (see <see cref="_claims"/>).</summary>
    internal long RetirementClaimsForTesting => Volatile.Read(ref _claims);

    /// <summary>
    /// Claims <paramref name="current"/>'s retirement for a public Replace or Delete in <paramref name="version"/>, before
    /// anything is allocated for it: throws if it was retired already (claimed, or, retired by another path, parked for the
    /// sweep). A claim older than <paramref name="tag"/>, the block's tag now, belongs to an earlier payload of the block
    /// (freed and reused since) and is taken over. Give it back with <see cref="ReleaseRetirement"/> if the call then
    /// fails before it retires the payload.
    /// </summary>
    internal void ClaimRetirement(PayloadRef current, long version, long tag)
    {
        if ((_faults & DurabilityFaults.AcceptDoubleRetirement) != 0)
        {
            return;
        }

        bool claimed;
        while (true)
        {
            if (_retiredByCallers.TryAdd(current.Offset, version))
            {
                Interlocked.Increment(ref _claims);
                claimed = true;
                break;
            }

            if (!_retiredByCallers.TryGetValue(current.Offset, out long earlier))
            {
                continue; // forgotten meanwhile (its block freed): claim it afresh
            }

            // A claim as new as the block's payload is a retirement of it; an older one, of an earlier payload of the block,
            // whose free may be forgetting it right now (a transient heap hands a freed block out before it forgets).
            if (earlier >= tag)
            {
                claimed = false;
                break;
            }

            if (_retiredByCallers.TryUpdate(current.Offset, version, earlier))
            {
                claimed = true;
                break;
            }
        }

        // The header again, after the claim: the sweep marks a block free before it forgets its claim, so a block freed
        // since the caller's header check is seen here.
        if (!claimed || _heap.IsParked(current) || !_heap.IsAllocated(current))
        {
            if (claimed)
            {
                Forget(current.Offset, version);
            }

            ThrowHelper.ThrowInvalidOperation($"The payload at offset {current.Offset} was already replaced or deleted (its block is not reused yet): a second Replace or Delete would retire it twice. Use the payload the first Replace returned, or nothing once it is deleted.");
        }
    }

    /// <summary>Gives back a claim (if <paramref name="claimed"/>) whose Replace or Delete failed before it retired anything.</summary>
    internal void ReleaseRetirement(PayloadRef current, long version, bool claimed)
    {
        if (claimed && (_faults & DurabilityFaults.AcceptDoubleRetirement) == 0)
        {
            Forget(current.Offset, version);
        }
    }

    /// <summary>Whether a public call retired <paramref name="current"/>, whose tag is <paramref name="tag"/>, and its block is not free yet (an update in place of a deleted payload).</summary>
    internal bool RetiredByACaller(PayloadRef current, long tag) =>
        Volatile.Read(ref _claims) != 0 && _retiredByCallers.TryGetValue(current.Offset, out long version) && version >= tag;

    /// <summary>
    /// Blocks just marked free (by a sweep, before it hands them out; or by reclamation's eager frees): forgets the claims
    /// of their retirements, those of version <paramref name="upTo"/> or older (an eager free of a transient heap hands
    /// a block out at once, and a later payload in it may have been claimed since).
    /// </summary>
    private void ForgetFreed(ReadOnlySpan<long> offsets, long upTo)
    {
        // Volatile.Read: a block's claim is counted before the block is retired, so before it is reclaimed and freed.
        if (Volatile.Read(ref _claims) == 0)
        {
            return;
        }

        foreach (long offset in offsets)
        {
            if (_retiredByCallers.TryGetValue(offset, out long version) && version <= upTo)
            {
                Forget(offset, version);
            }
        }
    }

    /// <summary>The sweep's <see cref="PersistentHeap.BlocksFreed"/>: its blocks were parked by earlier reclamations, and none is handed out yet.</summary>
    private void ForgetSwept(List<long> offsets) => ForgetFreed(System.Runtime.InteropServices.CollectionsMarshal.AsSpan(offsets), long.MaxValue);

    private void Forget(long offset, long version)
    {
        if (_retiredByCallers.TryRemove(new KeyValuePair<long, long>(offset, version)))
        {
            Interlocked.Decrement(ref _claims);
        }
    }
}
