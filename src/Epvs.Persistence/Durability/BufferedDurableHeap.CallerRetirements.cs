using System;
using System.Collections.Concurrent;
using System.Collections.Generic;
using System.Threading;

namespace Epvs.Persistence;

// A payload replaced or deleted twice through the public DurableOperation.Replace(PayloadRef, int) and
// DurableOperation.Delete(PayloadRef) (their precondition: not yet replaced or deleted) was retired
// twice: both calls returned, and the heap failed at the version's reclamation ("parked for the sweep twice"), taking
// every later write with it; or, retired again while a sweep freed it, its block was freed a second time under a new
// payload. The second call is now refused as it is made: each retirement is claimed until its block's header is free,
// after which the header check every such call makes first refuses it, until the block holds a new payload (a later
// version's tag).
public sealed unsafe partial class BufferedDurableHeap
{
    /// <summary>The payloads the public Replace and Delete retired whose blocks are not free yet (offset → the payload's
    /// epoch tag, which tells it from any later payload of the block: a block is handed out again at least two versions
    /// after the version that retired it, at or after the tag). The library's structures, whose indexes never retire a
    /// payload twice, skip it (<see cref="DurableOperation.ReplaceOwned"/>, <see cref="DurableOperation.DeleteOwned"/>).</summary>
    private readonly ConcurrentDictionary<long, long> _retiredByCallers = new();

    /// <summary>How many claims <see cref="_retiredByCallers"/> holds (its Count and IsEmpty take every lock).</summary>
    private long _claims;

    /// <summary>Test hook: runs as a public Replace or Delete claims a retirement, after it read the payload's header.</summary>
    internal Action? BeforeClaimForTesting { get; set; }

    /// <summary>Test hook: how many retirements are claimed (see <see cref="_claims"/>).</summary>
    internal long RetirementClaimsForTesting => Volatile.Read(ref _claims);

    /// <summary>
    /// Claims the retirement of the payload in <paramref name="current"/> whose header the caller read with epoch tag
    /// <paramref name="tag"/>, before anything is allocated for it: throws if that payload was retired already (claimed,
    /// or, retired by another path, parked for the sweep), or is no longer in the block. A claim of an older tag belongs
    /// to an earlier payload of the block (freed and reused since) and is taken over. Give it back with
    /// <see cref="ReleaseRetirement"/> if the call then fails before it retires the payload.
    /// </summary>
    internal void ClaimRetirement(PayloadRef current, long tag)
    {
        BeforeClaimForTesting?.Invoke();
        if ((_faults & DurabilityFaults.AcceptDoubleRetirement) != 0)
        {
            return;
        }

        bool claimed;
        while (true)
        {
            if (_retiredByCallers.TryAdd(current.Offset, tag))
            {
                Interlocked.Increment(ref _claims);
                claimed = true;
                break;
            }

            if (!_retiredByCallers.TryGetValue(current.Offset, out long earlier))
            {
                continue; // forgotten meanwhile (its block freed): claim it afresh
            }

            // The same tag: this payload's retirement. A later one: the block was reused after the caller read its header.
            // An older one: an earlier payload of the block, whose free may be forgetting it right now (a transient heap
            // hands a freed block out before it forgets).
            if (earlier >= tag)
            {
                claimed = false;
                break;
            }

            if (_retiredByCallers.TryUpdate(current.Offset, tag, earlier))
            {
                claimed = true;
                break;
            }
        }

        // The header again, after the claim: the sweep marks a block free before it forgets its claim, so a block freed, or
        // freed and reused, since the caller read its header is seen here (another payload has another tag).
        if (!claimed || _heap.IsParked(current) || !_heap.HoldsPayloadTagged(current, tag))
        {
            if (claimed)
            {
                Forget(current.Offset, tag);
            }

            ThrowHelper.ThrowInvalidOperation($"The payload at offset {current.Offset} was already replaced or deleted (its block is not reused yet): a second Replace or Delete would retire it twice. Use the payload the first Replace returned, or nothing once it is deleted.");
        }
    }

    /// <summary>Gives back a claim (if <paramref name="claimed"/>) whose Replace or Delete failed before it retired anything.</summary>
    internal void ReleaseRetirement(PayloadRef current, long tag, bool claimed)
    {
        if (claimed && (_faults & DurabilityFaults.AcceptDoubleRetirement) == 0)
        {
            ClaimGivenBackForTesting?.Invoke();
            Forget(current.Offset, tag);
        }
    }

    /// <summary>Test hook: a failed Replace or Delete is about to give its claim back (on its thread).</summary>
    internal Action? ClaimGivenBackForTesting { get; set; }

    /// <summary>Whether a public call retired <paramref name="current"/>, whose tag is <paramref name="tag"/>, and its block is not free yet (an update in place of a deleted payload).</summary>
    internal bool RetiredByACaller(PayloadRef current, long tag) =>
        Volatile.Read(ref _claims) != 0 && _retiredByCallers.TryGetValue(current.Offset, out long claimed) && claimed == tag;

    /// <summary>
    /// Blocks just marked free (by a sweep, before it hands them out; or by reclamation's eager frees): forgets the claims
    /// of their retirements, those of payloads tagged <paramref name="upTo"/> or older (an eager free of a transient heap
    /// hands a block out at once, and a later payload in it, tagged at least two versions later, may be claimed since).
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
            if (_retiredByCallers.TryGetValue(offset, out long tag) && tag <= upTo)
            {
                Forget(offset, tag);
            }
        }
    }

    /// <summary>The sweep's <see cref="PersistentHeap.BlocksFreed"/>: its blocks were parked by earlier reclamations, and none is handed out yet.</summary>
    private void ForgetSwept(List<long> offsets) => ForgetFreed(System.Runtime.InteropServices.CollectionsMarshal.AsSpan(offsets), long.MaxValue);

    private void Forget(long offset, long tag)
    {
        // Always to its end (its own shield): in a sweep or a cycle an interrupt at the dictionary's stripe lock failed
        // the heap for good, and in a failed Replace or Delete giving its claim back it left the claim on a live payload,
        // refusing every later Replace or Delete of it. The interrupt throws before the removal, which is retried.
        using InterruptShield.Scope shield = InterruptShield.Enter();
        while (true)
        {
            try
            {
                if (_retiredByCallers.TryRemove(new KeyValuePair<long, long>(offset, tag)))
                {
                    Interlocked.Decrement(ref _claims);
                }

                return;
            }
            catch (ThreadInterruptedException) when (InterruptShield.Absorbs())
            {
            }
        }
    }
}
