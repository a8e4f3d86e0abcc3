using System;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using System.Runtime.ExceptionServices;
using System.Threading.Tasks;

namespace Epvs.Persistence;

/// <summary>What the map structures share when they open: their lock striping and the parallel index rebuild.</summary>
internal static class StructureRecovery
{
    /// <summary>How many lock stripes a map uses: a power of two, 64 per processor or more.</summary>
    internal static int StripeCount()
    {
        int stripes = 1;
        while (stripes < Environment.ProcessorCount * 64)
        {
            stripes <<= 1;
        }

        return stripes;
    }

    /// <summary>
    /// After a salvage (recovery dropped damaged blocks, at this open or an earlier one: the structure may not have been
    /// opened in the salvaging session), among the payloads the salvage kept, keeps one payload per key — the one of the newest version, and of two in one
    /// version the one with the larger uid — and returns the others in <paramref name="losers"/>. A dropped anti-payload
    /// leaves the payload it cancelled live: for a key removed and inserted again (a new uid), two payloads of one key,
    /// which the map would refuse as an inconsistent heap at this open and at every later one. The newer version is the
    /// key's last durable state. Otherwise, or with no duplicate, returns <paramref name="payloads"/> itself (nothing is
    /// read without a salvage; with a payload whose size does not fit, nothing is resolved and the rebuild's size check
    /// reports it). Two payloads of keys Equal with different bytes (the first <paramref name="keySize"/> bytes of each
    /// payload) are not such a pair: the map keeps a key's first bytes on every update, so they come from a key type
    /// other than the one that wrote them (a <c>long</c> map opened as <c>double</c>: 0 and -0.0, two NaNs), or from an
    /// Equals that changed; resolving them deleted entries for good, where the same open without a salvage on record
    /// is refused. They are left to the rebuild, which refuses them in both cases.
    /// </summary>
    internal static IReadOnlyList<RecoveredPayload> KeepNewestPerKey<TKey>(BufferedDurableHeap heap, IReadOnlyList<RecoveredPayload> payloads, Func<int, bool> sizeFits, int keySize, Func<RecoveredPayload, TKey> keyOf, out List<RecoveredPayload> losers)
        where TKey : notnull
    {
        losers = new List<RecoveredPayload>();
        long salvaged = heap.SalvagedThrough;
        if (salvaged == 0)
        {
            return payloads;
        }

        foreach (RecoveredPayload payload in payloads)
        {
            if (!sizeFits(payload.Header.Size))
            {
                // No key to read: the rebuild's size check reports it.
                return payloads;
            }
        }

        var newest = new Dictionary<TKey, RecoveredPayload>(payloads.Count);
        foreach (RecoveredPayload payload in payloads)
        {
            TKey key = keyOf(payload);
            if (!newest.TryGetValue(key, out RecoveredPayload other))
            {
                newest[key] = payload;
                continue;
            }

            // Newer version first; in one version (a key removed and inserted again, the anti-payload dropped), the larger
            // uid: the later insert when one thread made both, as in that example (uids rise on each thread); which of
            // two threads' inserts was later cannot be told, and either was the key's value in that version.
            if (Math.Max(other.Header.EpochTag, payload.Header.EpochTag) > salvaged || (!heap.SalvageAnyEqualKeysForTesting && !SameKeyBytes(heap, other, payload, keySize)))
            {
                // Not left by a salvage (a version above it, or keys of other bytes): the rebuild reports the inconsistent
                // heap (it must see every payload).
                losers.Clear();
                return payloads;
            }

            bool otherIsOlder = other.Header.EpochTag != payload.Header.EpochTag ? other.Header.EpochTag < payload.Header.EpochTag : other.Header.Uid < payload.Header.Uid;
            losers.Add(otherIsOlder ? other : payload);
            newest[key] = otherIsOlder ? payload : other;
        }

        return losers.Count == 0 ? payloads : new List<RecoveredPayload>(newest.Values);
    }

    private static bool SameKeyBytes(BufferedDurableHeap heap, RecoveredPayload a, RecoveredPayload b, int keySize) =>
        heap.PayloadUnchecked(a.Block.Offset)[..keySize].SequenceEqual(heap.PayloadUnchecked(b.Block.Offset)[..keySize]);

    /// <summary>
    /// Deletes the <paramref name="losers"/> of <see cref="KeepNewestPerKey"/> (anti-payloads tagged with the current
    /// version) and, unless the calling thread is inside an operation, syncs: salvage freed the damaged block durably,
    /// so until these deletes are durable a crash would leave two payloads of one key with no damage to explain them.
    /// </summary>
    internal static void DeleteSalvageLosers(BufferedDurableHeap heap, List<RecoveredPayload> losers)
    {
        if (losers.Count == 0)
        {
            return;
        }

        using (DurableOperation op = heap.BeginOperation())
        {
            foreach (RecoveredPayload loser in losers)
            {
                op.DeleteOwned(loser.Block);
            }
        }

        if (!heap.VersionScheme.Epoch.ThisInstanceProtected())
        {
            heap.Sync();
        }
    }

    /// <summary>
    /// Checks every payload's size on this thread (one clear exception naming <paramref name="expected"/> and the size
    /// found), then calls <paramref name="add"/> for each payload in parallel; an <see cref="InvalidDataException"/>
    /// from <paramref name="add"/> (else the first exception) is rethrown as itself, not wrapped in an <see cref="AggregateException"/>.
    /// </summary>
    /// <remarks>The caller holds a read operation of the heap for the whole call: the workers read the mapping on other
    /// threads, unprotected themselves, but the heap's Dispose waits for the caller's operation, which outlasts them.</remarks>
    internal static void Rebuild(IReadOnlyList<RecoveredPayload> payloads, int parallelism, Func<int, bool> sizeFits, string structure, string expected, Action<RecoveredPayload> add)
    {
        foreach (RecoveredPayload payload in payloads)
        {
            if (!sizeFits(payload.Header.Size))
            {
                throw new InvalidDataException($"The {structure} expects payloads of {expected}, but recovery found one of {payload.Header.Size} bytes: was it written with other key or value types?");
            }
        }

        // Throws the heap's inconsistency first, else the first failure (a key's GetHashCode or Equals, user code,
        // throwing during the rebuild): see RunToItsEnd.
        InterruptShield.RunToItsEnd(
            bodies => Parallel.For(0, payloads.Count, new ParallelOptions { MaxDegreeOfParallelism = Math.Max(1, parallelism) }, bodies.Guard<int>(i => add(payloads[i]))),
            Math.Max(1, parallelism));
    }
}
