using System;
using System.IO;
using System.Linq;
using System.Threading;

namespace Epvs.Persistence.Tests;

/// <summary>
/// Child-process bit-flip sweep over the superblock's words (0 to 111: magic, geometry, size, clean flag, clock,
/// frontier, saved state, heap kind), or over the segment descriptors in use, of a cleanly closed buffered heap whose data spans every segment. For each
/// single-bit flip it reopens the file and classifies the result: refused (a HeapFileException), recovered exactly,
/// or SILENTLY wrong (opened, but the data differs). Prints the counts; exits 0 when nothing was silently wrong.
/// A flip that crashed the process kills the child, which the test sees.
/// </summary>
internal static class SuperblockSweep
{
    internal const string Role = "superblock-sweep";
    internal const int SweptBytes = 112;
    private const int TypeId = 7;
    private const int Entries = 150;
    private const int ValueSize = 2000;

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
        int from = 0, to = SweptBytes;
        if (region == "descriptors")
        {
            long heapSize = BitConverter.ToInt64(original, HeapLayout.HeapSizeOffset) & (long)HeapLayout.SealedValueMask;
            long dataStart = BitConverter.ToInt64(original, HeapLayout.DataStartOffset);
            from = HeapLayout.SuperblockSize;
            to = from + (int)((heapSize - dataStart) / HeapLayout.SegmentSize * sizeof(long));
        }

        HeapFileTestHooks.IgnoreSeals = control;
        int refused = 0, exact = 0, silent = 0;
        for (int bit = from * 8; bit < to * 8; bit++)
        {
            File.WriteAllBytes(path, original);
            using (FileStream f = File.OpenWrite(path))
            {
                byte[] one = { (byte)(original[bit / 8] ^ (1 << (bit % 8))) };
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
            catch (Exception e) when (e is ArgumentException or InvalidOperationException or InsufficientMemoryException or IOException)
            {
                // Reported, not silent: any exception at open is a refusal the caller sees.
                refused++;
            }
        }

        Console.WriteLine($"region={region} bytes=[{from}, {to}) flips={(to - from) * 8} refused={refused} exact={exact} silent={silent}");
        return silent == 0 ? SafetyChild.Survived : SafetyChild.WrongOutcome;
    }

    private static byte[] Value(long key)
    {
        var value = new byte[ValueSize];
        new Random((int)key).NextBytes(value);
        return value;
    }
}
