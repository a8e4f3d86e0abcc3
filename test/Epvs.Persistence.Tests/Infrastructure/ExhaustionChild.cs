using System;
using System.Collections.Generic;
using System.IO;
using System.Threading;

namespace Epvs.Persistence.Tests;

/// <summary>
/// Child-process scenarios for <see cref="ResourceExhaustionTests"/> (a probe's findings): a structure's write that meets
/// a managed <see cref="OutOfMemoryException"/> (the child runs under <c>DOTNET_GCHeapHardLimit</c>), and a creation with a
/// single file descriptor left (the child runs under <c>ulimit -n</c>). Each scenario prints what it saw and exits with
/// <see cref="Done"/>, or <see cref="Inconclusive"/> when the environment did not produce the condition.
/// </summary>
internal static class ExhaustionChild
{
    internal const string Role = "exhaustion";
    internal const int Done = 0;
    internal const int Inconclusive = 4;

    internal static int Run(string scenario, string path) => scenario switch
    {
        "map-write-out-of-managed-memory" => WriteOutOfManagedMemory(path, queue: false),
        "queue-write-out-of-managed-memory" => WriteOutOfManagedMemory(path, queue: true),
        "create-one-descriptor-left" => CreateWithOneDescriptorLeft(path),
        _ => throw new ArgumentException($"unknown scenario {scenario}"),
    };

    /// <summary>
    /// Writes (one thread, no advancer: everything in one version) until a write throws <see cref="OutOfMemoryException"/>
    /// under a managed heap filled with ballast so that only small allocations succeed; then releases the ballast, syncs,
    /// and exits without Dispose (a crash after the Sync). Prints "acknowledged N" (the writes that returned, all synced).
    /// </summary>
    private static int WriteOutOfManagedMemory(string path, bool queue)
    {
        var fileOptions = new HeapFileOptions { Size = 64L << 20, MaxSize = 256L << 20, Domain = PersistenceDomainKind.MappedFile };
        BufferedDurableHeap heap = BufferedDurableHeap.Create(path, fileOptions, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
        PersistentHashMap<long, long>? map = queue ? null : new PersistentHashMap<long, long>(heap, typeId: 1);
        PersistentQueue<long>? elements = queue ? new PersistentQueue<long>(heap, typeId: 1) : null;
        Console.WriteLine("ready");

        // Ballast: fill the managed heap in 1 MiB arrays until it refuses, then give back 4 MiB, so that the writes'
        // small allocations go on succeeding and the first growth of a list beyond a few MiB fails.
        var ballast = new List<byte[]>();
        try
        {
            while (ballast.Count < 100_000)
            {
                ballast.Add(new byte[1 << 20]);
            }
        }
        catch (OutOfMemoryException)
        {
        }

        ballast.RemoveRange(ballast.Count - Math.Min(4, ballast.Count), Math.Min(4, ballast.Count));
        long acknowledged = 0;
        OutOfMemoryException? failure = null;
        for (long k = 0; k < 4_000_000; k++)
        {
            try
            {
                if (queue)
                {
                    elements!.Enqueue(k);
                }
                else
                {
                    map!.Set(k, k + 1);
                }

                acknowledged = k + 1;
            }
            catch (OutOfMemoryException e)
            {
                failure = e;
                break;
            }
        }

        ballast.Clear();
        GC.Collect();
        if (failure is null)
        {
            Console.WriteLine("no OutOfMemoryException was thrown by a write");
            return Inconclusive;
        }

        Console.WriteLine($"write {acknowledged} threw: {failure}");
        heap.Sync();
        Console.WriteLine($"running count {(queue ? elements!.Count : map!.Count)}");
        Console.WriteLine($"acknowledged {acknowledged}");
        Console.Out.Flush();
        Environment.Exit(Done);
        return Done;
    }

    /// <summary>
    /// Creates a heap with exactly one file descriptor left: the heap file takes it, so the fsync of the new name's
    /// directory cannot open the directory. Prints "created" or "refused: ..." and whether the file exists.
    /// </summary>
    private static int CreateWithOneDescriptorLeft(string path)
    {
        var fileOptions = new HeapFileOptions { Size = 1L << 20, Domain = PersistenceDomainKind.MappedFile };

        // Everything the creation and the report load (assemblies need descriptors too) is loaded now.
        PersistentHeap.Create(path, fileOptions).Dispose();
        File.Delete(path);
        try
        {
            File.OpenRead(path + ".absent").Dispose();
        }
        catch (IOException e)
        {
            _ = e.ToString();
        }

        Console.WriteLine("warmed up");
        var held = new List<FileStream>();
        string outcome;
        try
        {
            try
            {
                while (held.Count < 1_000_000)
                {
                    held.Add(new FileStream("/dev/null", FileMode.Open, FileAccess.Read, FileShare.ReadWrite));
                }
            }
            catch (IOException)
            {
            }

            held[^1].Dispose();
            held.RemoveAt(held.Count - 1);
            try
            {
                PersistentHeap.Create(path, fileOptions).Dispose();
                outcome = "created";
            }
            catch (Exception e)
            {
                outcome = $"refused: {e.GetType().Name}: {e.Message}";
            }
        }
        finally
        {
            foreach (FileStream f in held)
            {
                f.Dispose();
            }
        }

        Console.WriteLine(outcome);
        Console.WriteLine($"exists {File.Exists(path)}");
        return Done;
    }
}
