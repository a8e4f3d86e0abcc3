using System;
using System.Diagnostics;
using System.Runtime.InteropServices;

namespace Epvs.Persistence.Benchmarks;

/// <summary>
/// The machine's floor for an upsert: how long one cache-line load takes when it depends on the previous one (a
/// random cycle through a buffer of a given size, so neither the prefetchers nor out-of-order execution hide it).
/// An upsert of a key that is not in the cache pays at least one such load (its index slot or node); this shows what
/// that costs at the footprint of each structure.
/// </summary>
internal static unsafe class MemoryLatency
{
    private const int Line = 64;
    private const int MadvHugePage = 14;

    /// <summary>Nanoseconds per dependent load over <paramref name="bytes"/> of native memory (transparent huge pages advised on Linux, as the map's index is).</summary>
    /// <param name="bytes">The buffer's size (a multiple of 2 MiB).</param>
    /// <param name="loads">How many loads to time.</param>
    /// <returns>The mean time per load.</returns>
    internal static double DependentLoadNanoseconds(long bytes, long loads)
    {
        long lines = bytes / Line;
        byte* buffer = (byte*)NativeMemory.AlignedAlloc((nuint)bytes, 2 << 20);
        try
        {
            if (OperatingSystem.IsLinux())
            {
                _ = Madvise(buffer, (nuint)bytes, MadvHugePage);
            }

            // A random cyclic order of the lines (Sattolo's shuffle: one cycle through all of them).
            var order = new long[lines];
            for (long i = 0; i < lines; i++)
            {
                order[i] = i;
            }

            var random = new Random(20261124);
            for (long i = lines - 1; i > 0; i--)
            {
                long j = random.NextInt64(i);
                (order[i], order[j]) = (order[j], order[i]);
            }

            for (long i = 0; i < lines; i++)
            {
                *(byte**)(buffer + (order[i] * Line)) = buffer + (order[(i + 1) % lines] * Line);
            }

            byte* p = buffer;
            for (long i = 0; i < Math.Min(loads, lines); i++)
            {
                p = *(byte**)p;
            }

            var watch = Stopwatch.StartNew();
            for (long i = 0; i < loads; i++)
            {
                p = *(byte**)p;
            }

            double ns = watch.Elapsed.TotalNanoseconds / loads;
            GC.KeepAlive((nint)p);
            return ns;
        }
        finally
        {
            NativeMemory.AlignedFree(buffer);
        }
    }

    [DllImport("libc", EntryPoint = "madvise")]
    private static extern int Madvise(void* address, nuint length, int advice);
}
