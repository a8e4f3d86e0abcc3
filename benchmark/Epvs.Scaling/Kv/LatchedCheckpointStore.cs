using System;
using System.Collections.Concurrent;
using System.Collections.Generic;
using System.IO;
using System.Security.Cryptography;
using System.Threading;

namespace Epvs.Scaling.Kv;

/// <summary>
/// Fig. 16's latch-based checkpointing baseline: the CprCheckpoint sample's store (a concurrent index of records
/// updated in place, and a de-duplication entry per client) with the version scheme replaced by a reader–writer
/// latch (the same two-level layout, index → slot → record object, so that only the synchronization differs).
/// Requests run under the shared latch; a checkpoint copies the de-duplication vector and every record under
/// the exclusive latch (the capture, the only part that excludes requests), then writes the copy to a file in the
/// sample's layout (header, records, SHA-256 trailer; temporary file renamed when complete) with the latch released.
/// </summary>
public sealed class LatchedCheckpointStore : IDisposable
{
    private static readonly byte[] HeaderMagic = "EPVSCPR1"u8.ToArray();
    private static readonly byte[] TrailerMagic = "CPR1-END"u8.ToArray();

    private readonly ReaderWriterLockSlim latch = new(LockRecursionPolicy.NoRecursion);
    private readonly ConcurrentDictionary<long, Slot> index = new();
    private readonly long[] lastSequence;
    private readonly string directory;
    private long version = 1;

    /// <summary>A key's entry in the index (as the sample's RecordSlot).</summary>
    private sealed class Slot
    {
        public Cell? Head;
    }

    /// <summary>A record, updated in place (the size of the sample's Record: value, version, previous).</summary>
    private sealed class Cell
    {
        public long Value;
        public long Version;
        public object? Previous = null; // never used: only keeps the record the sample's size
    }

    /// <summary>Creates an empty store for <paramref name="clients"/> clients (ids 0..clients-1).</summary>
    public LatchedCheckpointStore(string directory, int clients)
    {
        Directory.CreateDirectory(directory);
        this.directory = directory;
        lastSequence = new long[clients * 8]; // one entry per cache line (index client * 8)
    }

    /// <summary>Checkpoints completed.</summary>
    public long CheckpointsCompleted => Interlocked.Read(ref version) - 1;

    /// <summary>Takes the shared latch (a protected region of one or many requests).</summary>
    public void EnterShared() => latch.EnterReadLock();

    /// <summary>Releases the shared latch.</summary>
    public void ExitShared() => latch.ExitReadLock();

    /// <summary>Request <paramref name="sequenceNumber"/> of <paramref name="client"/> sets <paramref name="key"/>;
    /// the caller holds the shared latch. Returns false for a duplicate.</summary>
    public bool UpsertShared(int client, long sequenceNumber, long key, long value)
    {
        ref long last = ref lastSequence[client * 8];
        if (sequenceNumber <= last)
            return false;
        Slot slot = index.GetOrAdd(key, static _ => new Slot());
        if (Volatile.Read(ref slot.Head) is { } cell)
            Volatile.Write(ref cell.Value, value);
        else
            Interlocked.CompareExchange(ref slot.Head, new Cell { Value = value, Version = Volatile.Read(ref version) }, null);
        Volatile.Write(ref last, sequenceNumber);
        return true;
    }

    /// <summary>Reads <paramref name="key"/>; the caller holds the shared latch.</summary>
    public bool TryReadShared(long key, out long value)
    {
        if (index.TryGetValue(key, out Slot? slot) && Volatile.Read(ref slot.Head) is { } cell)
        {
            value = Volatile.Read(ref cell.Value);
            return true;
        }
        value = 0;
        return false;
    }

    /// <summary>Takes a checkpoint: capture under the exclusive latch, then write the file outside it.</summary>
    public void TakeCheckpoint()
    {
        long v;
        var clients = new List<KeyValuePair<long, long>>(lastSequence.Length / 8);
        KeyValuePair<long, long>[] records;
        latch.EnterWriteLock();
        try
        {
            v = version;
            for (int c = 0; c < lastSequence.Length / 8; c++)
                clients.Add(new KeyValuePair<long, long>(c, lastSequence[c * 8]));
            records = new KeyValuePair<long, long>[index.Count];
            int n = 0;
            foreach (KeyValuePair<long, Slot> entry in index)
            {
                if (entry.Value.Head is not { } cell)
                    continue;
                if (n == records.Length)
                    Array.Resize(ref records, Math.Max(16, n * 2));
                records[n++] = new KeyValuePair<long, long>(entry.Key, cell.Value);
            }
            if (n != records.Length)
                Array.Resize(ref records, n);
        }
        finally
        {
            latch.ExitWriteLock();
        }
        Write(v, clients, records);
        Interlocked.Increment(ref version);
    }

    private void Write(long v, List<KeyValuePair<long, long>> clients, KeyValuePair<long, long>[] records)
    {
        string final = Path.Combine(directory, $"checkpoint-{v:D12}.cpr");
        string temporary = final + ".tmp";
        using (var hash = IncrementalHash.CreateHash(HashAlgorithmName.SHA256))
        using (var file = new FileStream(temporary, FileMode.Create, FileAccess.Write, FileShare.None, 1 << 16))
        {
            var buffer = new byte[1 << 16];
            int used = 0;
            void Flush()
            {
                hash.AppendData(buffer, 0, used);
                file.Write(buffer, 0, used);
                used = 0;
            }
            void Bytes(ReadOnlySpan<byte> b)
            {
                if (used + b.Length > buffer.Length)
                    Flush();
                b.CopyTo(buffer.AsSpan(used));
                used += b.Length;
            }
            void Int64(long x)
            {
                Span<byte> b = stackalloc byte[8];
                System.Buffers.Binary.BinaryPrimitives.WriteInt64LittleEndian(b, x);
                Bytes(b);
            }
            void Int32(int x)
            {
                Span<byte> b = stackalloc byte[4];
                System.Buffers.Binary.BinaryPrimitives.WriteInt32LittleEndian(b, x);
                Bytes(b);
            }
            Bytes(HeaderMagic);
            Int32(1);
            Int64(v);
            Int32(clients.Count);
            foreach (KeyValuePair<long, long> c in clients)
            {
                Int64(c.Key);
                Int64(c.Value);
            }
            foreach (KeyValuePair<long, long> r in records)
            {
                Int64(r.Key);
                Int64(r.Value);
            }
            Bytes(TrailerMagic);
            Int64(records.Length);
            Flush();
            file.Write(hash.GetHashAndReset());
        }
        File.Move(temporary, final, overwrite: true);
        string old = Path.Combine(directory, $"checkpoint-{v - 2:D12}.cpr");
        if (File.Exists(old))
            File.Delete(old);
    }

    /// <inheritdoc/>
    public void Dispose() => latch.Dispose();
}
