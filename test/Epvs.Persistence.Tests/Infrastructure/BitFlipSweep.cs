using System;
using System.IO;
using System.Linq;
using System.Threading;

namespace Epvs.Persistence.Tests;

/// <summary>
/// Child-process bit-flip sweep of a cleanly closed buffered heap whose data spans every segment, over one region:
/// "superblock" (words 0 to 111: magic, geometry, size, clean flag, clock, frontier, saved state, heap kind),
/// "descriptors" (the segment descriptors in use), "blocks" (every bit of two live blocks' headers and
/// <see cref="PayloadFlips"/> seeded random bits of live payloads; the fast reopen path) or "blocks-crashed" (the
/// same bits with the clean-shutdown word as an open leaves it, as after a killed process: the full scan). For each
/// single-bit flip it reopens the file and classifies the result: refused (a HeapFileException), recovered exactly,
/// or SILENTLY wrong (opened, but the data differs). Prints the counts; exits 0 when nothing was silently wrong.
/// A flip that crashed the process kills the child, which the test sees.
/// </summary>
internal static class BitFlipSweep
{
    internal const string Role = "bit-flip-sweep";
    internal const int SweptBytes = 112;
    private const int TypeId = 7;
    private const int Entries = 150;
    private const int ValueSize = 2000;
    private const int PayloadFlips = 300;
    private const int PayloadSeed = 20261123;

    /// <summary>Sweeps the superblock (<paramref name="region"/> "superblock") or the segment descriptors in use ("descriptors").</summary>
    internal static int Run(string directory, string region, bool control)
    {
        string path = Path.Combine(directory, "sweep.heap");
        var options = new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan };
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, new HeapFileOptions { Size = 512L << 10, Domain = PersistenceDomainKind.MappedFile }, options))
        {
            var map = new PersistentByteMap<long>(heap, TypeId);
            for (long k = 0; k < Entries; k++)
            {
                map.Set(k, Value(k));
            }
        }

        byte[] original = File.ReadAllBytes(path);
        long[] bits;
        if (region is "blocks" or "blocks-crashed")
        {
            bits = BlockBits(path, options, ref original, crashed: region == "blocks-crashed");
        }
        else
        {
            int from = 0, to = SweptBytes;
            if (region == "descriptors")
            {
                long heapSize = BitConverter.ToInt64(original, HeapLayout.HeapSizeOffset) & (long)HeapLayout.SealedValueMask;
                long dataStart = BitConverter.ToInt64(original, HeapLayout.DataStartOffset);
                from = HeapLayout.SuperblockSize;
                to = from + (int)((heapSize - dataStart) / HeapLayout.SegmentSize * sizeof(long));
            }

            bits = Enumerable.Range(from * 8, (to - from) * 8).Select(b => (long)b).ToArray();
        }

        HeapFileTestHooks.IgnoreSeals = control;
        int refused = 0, exact = 0, silent = 0;
        foreach (long bit in bits)
        {
            File.WriteAllBytes(path, original);
            using (FileStream f = File.OpenWrite(path))
            {
                byte[] one = { (byte)(original[bit / 8] ^ (1 << (int)(bit % 8))) };
                RandomAccess.Write(f.SafeFileHandle, one, bit / 8);
            }

            try
            {
                using BufferedDurableHeap heap = BufferedDurableHeap.Open(path, new HeapFileOptions { Domain = PersistenceDomainKind.MappedFile }, options);
                var map = new PersistentByteMap<long>(heap, TypeId);
                bool same = map.Count == Entries && Enumerable.Range(0, Entries).All(k => map.Get(k) is byte[] v && v.AsSpan().SequenceEqual(Value(k)));
                if (same)
                {
                    exact++;
                }
                else
                {
                    silent++;
                    Console.WriteLine($"silent: bit {bit} (byte {bit / 8}) opened with {map.Count} of {Entries} entries or wrong values");
                }
            }
            catch (HeapFileException)
            {
                refused++;
            }
            catch (Exception e) when (e is ArgumentException or InvalidOperationException or InsufficientMemoryException or IOException or InvalidDataException)
            {
                // Reported, not silent: any exception at open is a refusal the caller sees.
                refused++;
            }
        }

        Console.WriteLine($"region={region} flips={bits.Length} (bits {bits.Min()} to {bits.Max()}) refused={refused} exact={exact} silent={silent}");
        return silent == 0 ? SafetyChild.Survived : SafetyChild.WrongOutcome;
    }

    /// <summary>
    /// The bits to flip in the live blocks: all 256 of two headers and <see cref="PayloadFlips"/> random payload bits
    /// (seed <see cref="PayloadSeed"/>). For the crashed variant, <paramref name="original"/> gets the clean-shutdown
    /// word an open leaves, so every reopen runs the full scan.
    /// </summary>
    private static long[] BlockBits(string path, BufferedDurableHeapOptions options, ref byte[] original, bool crashed)
    {
        var blocks = new System.Collections.Generic.List<(long Offset, int Size)>();
        using (BufferedDurableHeap heap = BufferedDurableHeap.Open(path, new HeapFileOptions { Domain = PersistenceDomainKind.MappedFile }, options))
        {
            heap.Heap.ForEachAllocated((block, header) =>
            {
                if (header.Size == ValueSize + sizeof(long))
                {
                    lock (blocks)
                    {
                        blocks.Add((block.Offset, header.Size));
                    }
                }
            });
        }

        if (blocks.Count != Entries)
        {
            throw new InvalidOperationException($"expected {Entries} live map blocks, found {blocks.Count}");
        }

        // Reopened and closed cleanly again: the same blocks, a new saved state.
        original = File.ReadAllBytes(path);
        if (crashed)
        {
            BitConverter.GetBytes(HeapLayout.Seal(0, HeapLayout.CleanShutdownOffset)).CopyTo(original, HeapLayout.CleanShutdownOffset);
        }

        blocks.Sort();
        var random = new Random(PayloadSeed);
        var bits = new System.Collections.Generic.List<long>();
        foreach ((long offset, _) in blocks.Take(2))
        {
            for (int b = 0; b < HeapLayout.HeaderSize * 8; b++)
            {
                bits.Add((offset * 8) + b);
            }
        }

        for (int i = 0; i < PayloadFlips; i++)
        {
            (long offset, int size) = blocks[random.Next(blocks.Count)];
            bits.Add(((offset + HeapLayout.HeaderSize) * 8) + random.NextInt64((long)size * 8));
        }

        Console.WriteLine($"blocks: {blocks.Count} live, header bits of 0x{blocks[0].Offset:X} and 0x{blocks[1].Offset:X}, {PayloadFlips} payload bits (seed {PayloadSeed})");
        return bits.ToArray();
    }

    private static byte[] Value(long key)
    {
        var value = new byte[ValueSize];
        new Random((int)key).NextBytes(value);
        return value;
    }
}
