using System;
using System.Collections.Generic;
using System.IO;
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
    /// Checks every payload's size on this thread (one clear exception naming <paramref name="expected"/> and the size
    /// found), then calls <paramref name="add"/> for each payload in parallel; an <see cref="InvalidDataException"/>
    /// from <paramref name="add"/> is rethrown as itself, not wrapped in an <see cref="AggregateException"/>.
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

        try
        {
            Parallel.For(0, payloads.Count, new ParallelOptions { MaxDegreeOfParallelism = Math.Max(1, parallelism) }, i => add(payloads[i]));
        }
        catch (AggregateException e) when (e.InnerException is InvalidDataException inner)
        {
            ExceptionDispatchInfo.Capture(inner).Throw();
        }
    }
}
