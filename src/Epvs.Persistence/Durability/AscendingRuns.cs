using System;

namespace Epvs.Persistence;

/// <summary>
/// Sorts offsets that mostly come in a few ascending runs — a version's write-back list: each thread allocates from
/// pools handed out in address order, so its list is a few ascending stretches — by merging the runs (a natural merge
/// sort: linear when the list is one run, n log k for k runs), and falls back to <see cref="Array.Sort{T}(T[], int, int)"/>
/// when there are many.
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
    internal static int Sort(long[] items, int count, ref long[] scratch)
    {
        Span<int> starts = stackalloc int[MaxRunsToMerge + 1];
        int runs = 0;
        starts[runs++] = 0;
        for (int i = 1; i < count; i++)
        {
            if (items[i] < items[i - 1])
            {
                if (runs == MaxRunsToMerge)
                {
                    Array.Sort(items, 0, count);
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
        long[] from = items, to = scratch;
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
            (from, to) = (to, from);
        }

        if (!ReferenceEquals(from, items))
        {
            Array.Copy(from, items, count);
        }

        return found;
    }

    private static void Merge(long[] from, int lo, int mid, int hi, long[] to)
    {
        int i = lo, j = mid, k = lo;
        while (i < mid && j < hi)
        {
            to[k++] = from[j] < from[i] ? from[j++] : from[i++];
        }

        Array.Copy(from, i, to, k, mid - i);
        k += mid - i;
        Array.Copy(from, j, to, k, hi - j);
    }
}
