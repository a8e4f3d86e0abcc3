using System;
using System.Diagnostics;
using System.Numerics;

namespace Epvs.Persistence;

/// <summary>
/// Sorts offsets that mostly come in a few ascending runs — a version's write-back list: each thread allocates from
/// pools handed out in address order, so its list is a few ascending stretches — by merging the runs (a natural merge
/// sort: linear when the list is one run, n log k for k runs), and falls back to a least-significant-digit radix sort
/// when there are many (every pool refill from a sweep starts a new run: under two writers through the page cache a
/// version's 50,000–100,000 offsets came in more than a thousand, and the comparison sort this fell back to took about
/// 9% of the advancer's time; the radix sort takes two or three linear passes over offsets of a heap up to 16 GiB).
/// Also the sweep log's list of a half's blocks at a turn (one ascending run per sweep batch), whose comparison sort
/// was about a sixth of the stocker's time under two writers.
/// </summary>
internal static class AscendingRuns
{
    /// <summary>Above this many runs the merge passes cost more than a comparison sort saves.</summary>
    internal const int MaxRunsToMerge = 64;

    /// <summary>Sorts the first <paramref name="count"/> items of <paramref name="items"/> in place.</summary>
    /// <param name="items">The offsets.</param>
    /// <param name="count">How many of them to sort.</param>
    /// <param name="scratch">A buffer the merge uses (grown to at least <paramref name="count"/> when needed, kept by the caller for the next call).</param>
    /// <returns>How many ascending runs the items came in.</returns>
    internal static int Sort(long[] items, int count, ref long[] scratch) => Sort(items.AsSpan(0, count), ref scratch);

    /// <summary>
    /// Orders the first <paramref name="count"/> items of <paramref name="items"/> by their bits from
    /// <paramref name="fromBit"/> up only (offsets: by the 2^<paramref name="fromBit"/>-byte stretch they fall in), in
    /// place; items of one stretch keep no particular order. For a pass that needs each stretch visited once, not each
    /// item in order: the radix sort skips the digits below (for random offsets in a heap of a few hundred MiB, one pass
    /// instead of two).
    /// </summary>
    /// <returns>How many ascending runs of whole items they came in (as <see cref="Sort(long[], int, ref long[])"/>).</returns>
    internal static int SortByHighBits(long[] items, int count, int fromBit, ref long[] scratch) => Sort(items.AsSpan(0, count), ref scratch, fromBit);

    /// <summary>Sorts <paramref name="items"/> in place (see <see cref="Sort(long[], int, ref long[])"/>).</summary>
    /// <param name="items">The offsets.</param>
    /// <param name="scratch">A buffer the merge uses (grown to at least the items' length when needed, kept by the caller for the next call).</param>
    /// <param name="fromBit">The lowest bit the order goes by (see <see cref="SortByHighBits"/>); 0 for a full sort.</param>
    /// <returns>How many ascending runs the items came in.</returns>
    internal static int Sort(Span<long> items, ref long[] scratch, int fromBit = 0)
    {
        int count = items.Length;
        Span<int> starts = stackalloc int[MaxRunsToMerge + 1];
        int runs = 0;
        starts[runs++] = 0;
        for (int i = 1; i < count; i++)
        {
            if (items[i] < items[i - 1])
            {
                if (runs == MaxRunsToMerge)
                {
                    RadixSort(items, ref scratch, fromBit);
                    return MaxRunsToMerge + 1;
                }

                starts[runs++] = i;
            }
        }

        int found = runs;
        if (runs == 1)
        {
            return 1;
        }

        if (scratch.Length < count)
        {
            scratch = new long[Math.Max(count, scratch.Length * 2)];
        }

        // Bottom-up: each pass merges neighbouring runs pairwise from one buffer into the other, halving the runs.
        starts[runs] = count;
        Span<long> from = items, to = scratch.AsSpan(0, count);
        while (runs > 1)
        {
            int merged = 0;
            for (int r = 0; r < runs; r += 2)
            {
                int lo = starts[r], mid = starts[Math.Min(r + 1, runs)], hi = starts[Math.Min(r + 2, runs)];
                Merge(from, lo, mid, hi, to);
                starts[merged++] = lo;
            }

            starts[merged] = count;
            runs = merged;
            Span<long> swap = from;
            from = to;
            to = swap;
        }

        if (from != items)
        {
            from.CopyTo(items);
        }

        return found;
    }

    /// <summary>Digits of the radix sort, in bits: a 16 KB count table.</summary>
    private const int RadixBits = 12;

    /// <summary>
    /// Sorts <paramref name="items"/> (non-negative: file offsets) by their bits from the lowest set in any of them
    /// (block offsets are multiples of 16), or from <paramref name="fromBit"/> if higher, <see cref="RadixBits"/> at a
    /// time, lowest digit first (each pass stable).
    /// </summary>
    private static void RadixSort(Span<long> items, ref long[] scratch, int fromBit)
    {
        int count = items.Length;
        ulong any = 0;
        for (int i = 0; i < count; i++)
        {
            Debug.Assert(items[i] >= 0, "offsets are non-negative");
            any |= (ulong)items[i];
        }

        if (scratch.Length < count)
        {
            scratch = new long[Math.Max(count, scratch.Length * 2)];
        }

        int low = Math.Max(fromBit, any == 0 ? 0 : BitOperations.TrailingZeroCount(any));
        int high = 64 - BitOperations.LeadingZeroCount(any);
        Span<int> starts = stackalloc int[1 << RadixBits];
        const int Mask = (1 << RadixBits) - 1;
        Span<long> from = items, to = scratch.AsSpan(0, count);
        for (int shift = low; shift < high; shift += RadixBits)
        {
            starts.Clear();
            for (int i = 0; i < count; i++)
            {
                starts[(int)((ulong)from[i] >> shift) & Mask]++;
            }

            int sum = 0;
            for (int digit = 0; digit < starts.Length; digit++)
            {
                int n = starts[digit];
                starts[digit] = sum;
                sum += n;
            }

            for (int i = 0; i < count; i++)
            {
                long item = from[i];
                to[starts[(int)((ulong)item >> shift) & Mask]++] = item;
            }

            Span<long> swap = from;
            from = to;
            to = swap;
        }

        if (from != items)
        {
            from.CopyTo(items);
        }
    }

    private static void Merge(Span<long> from, int lo, int mid, int hi, Span<long> to)
    {
        int i = lo, j = mid, k = lo;
        while (i < mid && j < hi)
        {
            to[k++] = from[j] < from[i] ? from[j++] : from[i++];
        }

        from[i..mid].CopyTo(to[k..]);
        k += mid - i;
        from[j..hi].CopyTo(to[k..]);
    }
}
