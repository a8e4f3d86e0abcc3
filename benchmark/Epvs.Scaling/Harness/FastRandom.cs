namespace Epvs.Scaling.Harness;

/// <summary>A per-thread xorshift64* generator: a few instructions per draw, no shared state.</summary>
public struct FastRandom
{
    private ulong state;

    /// <summary>Seeds the generator (a zero seed is replaced).</summary>
    public FastRandom(ulong seed) => state = seed == 0 ? 0x9E3779B97F4A7C15UL : seed * 0x9E3779B97F4A7C15UL;

    /// <summary>The next 64 random bits.</summary>
    public ulong NextUInt64()
    {
        ulong x = state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        state = x;
        return x * 0x2545F4914F6CDD1DUL;
    }

    /// <summary>A value in [0, n).</summary>
    public int Next(int n) => (int)((NextUInt64() >> 32) * (ulong)(uint)n >> 32);

    /// <summary>The threshold such that <c>NextUInt64() &lt; threshold</c> has probability <paramref name="p"/>
    /// (p ≥ 1 gives <see cref="ulong.MaxValue"/>, which misses one value in 2^64).</summary>
    public static ulong Threshold(double p) =>
        p <= 0 ? 0 : p >= 1 ? ulong.MaxValue : (ulong)(p * 18446744073709551616.0);
}
