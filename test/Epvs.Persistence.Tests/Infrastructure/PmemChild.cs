using System;
using System.Collections.Generic;
using System.Globalization;

namespace Epvs.Persistence.Tests;

/// <summary>
/// The child-process workload of the libpmem tests: creates a heap with the libpmem domain, allocates, stamps and
/// persists blocks, frees some durably, and prints what it did and which libpmem path it took.
/// </summary>
internal static class PmemChild
{
    internal const string Role = "pmem-child";

    internal static int Run(string path)
    {
        var options = new HeapFileOptions { Size = 4L << 20, Domain = PersistenceDomainKind.Pmem };
        var kept = new List<(long Offset, long Uid, int Size)>();
        var random = new Random(4242);
        using (PersistentHeap heap = PersistentHeap.Create(path, options))
        {
            var blocks = new List<(PayloadRef Ref, long Uid, int Size)>();
            for (int i = 0; i < 300; i++)
            {
                int size = i % 50 == 0 ? 100_000 : random.Next(0, 3_000);
                PayloadRef block = heap.Allocate(size, typeId: 7);
                long uid = heap.GetHeader(block).Uid;
                Stamp.Write(heap.GetPayload(block), uid);
                heap.Persist(block);
                blocks.Add((block, uid, size));
            }

            for (int i = 0; i < blocks.Count; i++)
            {
                if (i % 3 == 0)
                {
                    heap.Free(blocks[i].Ref);
                    heap.WriteBackHeader(blocks[i].Ref);
                    heap.Fence();
                }
                else
                {
                    kept.Add((blocks[i].Ref.Offset, blocks[i].Uid, blocks[i].Size));
                }
            }

            var domain = (PmemPersistenceDomain)heap.File.Domain;
            (long flush, long drain, long persist, long msync) = domain.CallCounts;
            Console.WriteLine(FormattableString.Invariant($"is_pmem={domain.IsPersistentMemory} flush={flush} drain={drain} persist={persist} msync={msync}"));
        }

        foreach ((long offset, long uid, int size) in kept)
        {
            Console.WriteLine(string.Create(CultureInfo.InvariantCulture, $"block {offset} {uid} {size}"));
        }

        return 0;
    }
}
