using System;
using System.Collections.Generic;
using System.Threading;

namespace Epvs.Persistence.Tests;

/// <summary>A deterministic (per seed and thread) mix of map writes, rewrites and deletes on the keys a thread owns, each logged with its version.</summary>
internal static class DurableWorkload
{
    internal const int MapTypeId = 11;

    /// <summary>Runs <paramref name="operations"/> operations; calls <paramref name="between"/> after each (for advances and Syncs).</summary>
    internal static void Run(BufferedDurableHeap heap, PersistentByteMap<long> map, OpLog log, int thread, int seed, int operations, int keysPerThread, Action<int>? between = null)
    {
        var random = new Random(seed + (thread * 7919));
        var writes = new Dictionary<long, int>();
        for (int i = 0; i < operations; i++)
        {
            long key = (random.Next(keysPerThread) * log.Threads) + thread;
            bool delete = random.Next(4) == 0;
            using (DurableOperation op = heap.BeginOperation())
            {
                // The map's own operation nests inside this one, so it runs in op.Version.
                if (delete)
                {
                    if (map.Remove(key))
                    {
                        log.Add(thread, new MapOp(op.Version, key, null));
                    }
                }
                else
                {
                    int n = writes.TryGetValue(key, out int count) ? count + 1 : 0;
                    writes[key] = n;
                    byte[] value = OpLog.ValueFor(key, n);
                    map.Set(key, value);
                    log.Add(thread, new MapOp(op.Version, key, value));
                }
            }

            between?.Invoke(i);
        }
    }

    internal static Dictionary<long, byte[]> Contents(PersistentByteMap<long> map)
    {
        var result = new Dictionary<long, byte[]>();
        foreach (KeyValuePair<long, byte[]> entry in map.ToList())
        {
            result[entry.Key] = entry.Value;
        }

        return result;
    }
}
