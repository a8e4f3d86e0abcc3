using System.Diagnostics;
using System.Linq;
using System.Runtime.CompilerServices;

namespace Epvs.Persistence;

/// <summary>
/// Block sizes of small allocations (header included), four per power of two from 64 bytes, every one a multiple of 32
/// so that a 32-byte header never straddles a 64-byte cache line; below them 48 bytes (format 9), a header and a
/// 16-byte payload — a long key and value — in three quarters of a 64-byte block's space, memory and write-back (one
/// header in four straddles a line). Payloads above <see cref="MaxSmallPayload"/> get whole segments.
/// </summary>
internal static class SizeClasses
{
    internal static readonly int[] BlockSizes =
    [
        48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512, 640, 768, 896, 1024, 1280, 1536, 1792, 2048,
        2560, 3072, 3584, 4096, 5120, 6144, 7168, 8192, 10240, 12288, 14336, 16384,
    ];

    internal static readonly int[] BlocksPerSegment = ComputeBlocksPerSegment();

    /// <summary>floor(2^32 / block size) + 1 per class: see <see cref="BlockIndex"/>.</summary>
    private static readonly ulong[] s_reciprocals = BlockSizes.Select(size => ((1UL << 32) / (ulong)size) + 1).ToArray();

    internal const int MaxSmallBlock = 16384;

    internal const int MaxSmallPayload = MaxSmallBlock - HeapLayout.HeaderSize;

    internal static int Count => BlockSizes.Length;

    /// <summary>The bytes of a segment of class <paramref name="cls"/> that no block covers (its tail).</summary>
    internal static long SegmentOverhead(int cls) => HeapLayout.SegmentSize - ((long)BlocksPerSegment[cls] * BlockSizes[cls]);

    /// <summary>
    /// <paramref name="within"/> / <see cref="BlockSizes"/>[<paramref name="cls"/>] for an offset within a segment
    /// (below 2^16), by a multiplication instead of a division (every block a heap locates pays it, on the advancer's
    /// path several times per block). Exact there: with M = floor(2^32 / d) + 1, (n M) / 2^32 exceeds n / d by less
    /// than n / 2^32 &lt; 2^-16 ≤ 1 / d, too little to reach the next integer (a test checks every offset of every class).
    /// </summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    internal static uint BlockIndex(uint within, int cls)
    {
        Debug.Assert(within < HeapLayout.SegmentSize, "an offset within a segment");
        return (uint)((within * s_reciprocals[cls]) >> 32);
    }

    private static readonly byte[] s_classByUnits = BuildLookup();

    /// <summary>The class of a payload of <paramref name="size"/> bytes (0 ≤ size ≤ <see cref="MaxSmallPayload"/>).</summary>
    internal static int ForPayload(int size) => s_classByUnits[(size + HeapLayout.HeaderSize + (Alignment - 1)) >> AlignmentShift];

    /// <summary>What every block size is a multiple of, so every block begins this many bytes' multiple past its segment's start (and the class lookup's granularity): 16.</summary>
    internal const int Alignment = 1 << AlignmentShift;
    private const int AlignmentShift = 4;

    private static byte[] BuildLookup()
    {
        var lookup = new byte[(MaxSmallBlock >> AlignmentShift) + 1];
        int cls = 0;
        for (int units = 0; units < lookup.Length; units++)
        {
            while (BlockSizes[cls] < units << AlignmentShift)
            {
                cls++;
            }

            lookup[units] = (byte)cls;
        }

        return lookup;
    }

    private static int[] ComputeBlocksPerSegment()
    {
        var counts = new int[BlockSizes.Length];
        for (int i = 0; i < counts.Length; i++)
        {
            counts[i] = HeapLayout.SegmentSize / BlockSizes[i];
        }

        return counts;
    }
}
