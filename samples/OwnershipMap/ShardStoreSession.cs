using System;
using System.Collections.Generic;
using FASTER.core;

namespace Epvs.Samples.OwnershipMap;

/// <summary>One thread's FASTER session on a <see cref="ShardStore"/>: read, upsert, add (read-modify-write), delete,
/// and a scan of the live records. Operations that go pending (never, with the whole log in memory) are completed
/// synchronously.</summary>
internal sealed class ShardStoreSession : IDisposable
{
    private readonly FasterKV<long, long> kv;
    private readonly ClientSession<long, long, long, long, Empty, SimpleFunctions<long, long>> session;

    public ShardStoreSession(FasterKV<long, long> kv, ClientSession<long, long, long, long, Empty, SimpleFunctions<long, long>> session)
    {
        this.kv = kv;
        this.session = session;
    }

    public bool TryRead(long key, out long value)
    {
        long output = 0;
        Status status = session.Read(ref key, ref output);
        if (status.IsPending)
        {
            session.CompletePendingWithOutputs(out CompletedOutputIterator<long, long, long, long, Empty> outputs, wait: true);
            using (outputs)
            {
                while (outputs.Next())
                {
                    status = outputs.Current.Status;
                    output = outputs.Current.Output;
                }
            }
        }
        value = output;
        return status.Found;
    }

    public void Upsert(long key, long value)
    {
        if (session.Upsert(ref key, ref value).IsPending)
            session.CompletePending(wait: true);
    }

    public void Add(long key, long delta)
    {
        if (session.RMW(ref key, ref delta).IsPending)
            session.CompletePending(wait: true);
    }

    public void Delete(long key)
    {
        if (session.Delete(ref key).IsPending)
            session.CompletePending(wait: true);
    }

    /// <summary>
    /// The live records whose key is in <paramref name="bucket"/>, by a raw scan of the hybrid log (cheaper than
    /// FASTER's distinct-key iterator, which builds a temporary store): the record at the highest address wins, and a
    /// tombstone there means deleted. Correct only while nobody writes to the bucket, which is the case during a
    /// migration (the bucket is owned by no shard).
    /// </summary>
    public List<KeyValuePair<long, long>> ScanBucket(ushort bucket)
    {
        var latest = new Dictionary<long, (long Value, bool Deleted)>();
        using (IFasterScanIterator<long, long> iterator = kv.Log.Scan(kv.Log.BeginAddress, kv.Log.TailAddress))
        {
            while (iterator.GetNext(out RecordInfo info))
            {
                long key = iterator.GetKey();
                if (KeyBuckets.Of(key) == bucket)
                    latest[key] = (iterator.GetValue(), info.Tombstone);
            }
        }
        var records = new List<KeyValuePair<long, long>>(latest.Count);
        foreach (var (key, (value, deleted)) in latest)
        {
            if (!deleted)
                records.Add(new KeyValuePair<long, long>(key, value));
        }
        return records;
    }

    public void Dispose() => session.Dispose();
}
