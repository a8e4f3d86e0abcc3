using System.Runtime.CompilerServices;

namespace Epvs.Scaling.Harness;

/// <summary>
/// The paper's simulated work (§6.2): "each thread protects hashing of some local bytes", so the synchronization
/// method is the only source of contention. One round mixes a thread-local 64-byte buffer.
/// </summary>
public static class HashWork
{
    /// <summary>Hashes <paramref name="local"/> (8 longs) <paramref name="rounds"/> times and feeds the result back,
    /// so the JIT cannot drop the work.</summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    public static ulong Run(ulong[] local, int rounds)
    {
        ulong h = 0xCBF29CE484222325UL;
        for (int r = 0; r < rounds; r++)
        {
            for (int i = 0; i < 8; i++)
                h = (h ^ local[i]) * 0x100000001B3UL;
            local[r & 7] = h;
        }
        return h;
    }
}
