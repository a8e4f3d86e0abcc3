using System.Runtime.CompilerServices;

namespace Epvs.Samples.OwnershipMap;

/// <summary>Maps keys to the 16-bit hash buckets that shards own (as in Redis Cluster's hash slots; paper §5.1).</summary>
public static class KeyBuckets
{
    /// <summary>The number of buckets: 2^16.</summary>
    public const int Count = 1 << 16;

    /// <summary>The bucket of <paramref name="key"/>: the top 16 bits of a multiplicative (Fibonacci) hash.</summary>
    /// <param name="key">The key.</param>
    /// <returns>The bucket, 0 to 65535.</returns>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    public static ushort Of(long key) => (ushort)((ulong)key * 0x9E3779B97F4A7C15UL >> 48);
}
