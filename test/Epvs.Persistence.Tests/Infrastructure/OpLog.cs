using System;
using System.Collections.Generic;
using System.Linq;

namespace Epvs.Persistence.Tests;

/// <summary>
/// The oracle of the buffered-durability tests: every map operation with the version it ran in, per thread (each
/// thread owns the keys k with k % threads == thread, so per-key order is the thread's program order), plus the
/// durability promises made (frontiers persisted, Syncs returned) with the crash-point counter at which they held.
/// </summary>
internal sealed class OpLog
{
    private readonly List<MapOp>[] _perThread;
    private readonly List<(long Point, long Version)> _promises = new();

    internal OpLog(int threads)
    {
        _perThread = new List<MapOp>[threads];
        for (int i = 0; i < threads; i++)
        {
            _perThread[i] = new List<MapOp>();
        }
    }

    internal int Threads => _perThread.Length;

    internal void Add(int thread, MapOp op) => _perThread[thread].Add(op);

    /// <summary>Records that from crash point <paramref name="point"/> on, every version ≤ <paramref name="version"/> is durable (a Sync returned, or a frontier was persisted).</summary>
    internal void Promise(long point, long version)
    {
        lock (_promises)
        {
            _promises.Add((point, version));
        }
    }

    internal long PromisedAt(long point)
    {
        lock (_promises)
        {
            return _promises.Where(p => p.Point <= point).Select(p => p.Version).DefaultIfEmpty(0).Max();
        }
    }

    /// <summary>The map's state after every operation of a version ≤ <paramref name="cut"/>; also the keys whose deletes are in that prefix.</summary>
    internal Dictionary<long, byte[]> StateAt(long cut, out HashSet<long> deleted)
    {
        var state = new Dictionary<long, byte[]>();
        deleted = new HashSet<long>();
        foreach (List<MapOp> ops in _perThread)
        {
            foreach (MapOp op in ops)
            {
                if (op.Version > cut)
                {
                    continue;
                }

                if (op.Value is null)
                {
                    state.Remove(op.Key);
                    deleted.Add(op.Key);
                }
                else
                {
                    state[op.Key] = op.Value;
                    deleted.Remove(op.Key);
                }
            }
        }

        return state;
    }

    internal long MaxVersion => _perThread.SelectMany(o => o).Select(o => o.Version).DefaultIfEmpty(0).Max();

    /// <summary>Compares a recovered map with the prefix of versions ≤ <paramref name="cut"/>.</summary>
    internal List<string> Compare(long cut, IReadOnlyDictionary<long, byte[]> recovered)
    {
        var violations = new List<string>();
        Dictionary<long, byte[]> expected = StateAt(cut, out HashSet<long> deleted);
        foreach ((long key, byte[] value) in expected)
        {
            if (!recovered.TryGetValue(key, out byte[]? got))
            {
                violations.Add($"key {key} is missing (its last write ≤ version {cut} was {value.Length} bytes)");
            }
            else if (!got.AsSpan().SequenceEqual(value))
            {
                violations.Add($"key {key} has a value of {got.Length} bytes that is not its state at version {cut}");
            }
        }

        foreach (long key in recovered.Keys)
        {
            if (!expected.ContainsKey(key))
            {
                violations.Add(deleted.Contains(key) ? $"key {key} was deleted at a version ≤ {cut} but came back (resurrected delete)" : $"key {key} is present but no write of it is in versions ≤ {cut}");
            }
        }

        return violations;
    }

    /// <summary>A deterministic value for a key's n-th write: length varies so that replacing changes sizes.</summary>
    internal static byte[] ValueFor(long key, int n)
    {
        // Writes come in pairs of one size, so that some replacements keep the size (the in-place path) and some do not.
        byte[] value = new byte[8 + (int)(((key * 31) + ((n / 2) * 17)) % 90)];
        Stamp.Write(value, key, n);
        return value;
    }
}

/// <summary>One map operation: a write of <see cref="Value"/> to <see cref="Key"/>, or a delete (null value), in <see cref="Version"/>.</summary>
internal readonly record struct MapOp(long Version, long Key, byte[]? Value);
