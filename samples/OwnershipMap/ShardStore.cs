using System;
using FASTER.core;

namespace Epvs.Samples.OwnershipMap;

/// <summary>
/// A shard's key-value store: a real FASTER.core <see cref="FasterKV{Key, Value}"/> of 64-bit keys and values, kept in
/// memory (its log device is a <see cref="NullDevice"/> and its memory holds the whole log for this sample's key
/// counts). FASTER's own epoch protects FASTER's internals; this sample's EPVS protects ownership on top of it.
/// </summary>
internal sealed class ShardStore : IDisposable
{
    private readonly IDevice device;
    private readonly FasterKV<long, long> kv;

    public ShardStore()
    {
        device = new NullDevice();
        kv = new FasterKV<long, long>(1L << 16, new LogSettings { LogDevice = device, MemorySizeBits = 24, PageSizeBits = 16 });
    }

    /// <summary>A FASTER session, for one thread (FASTER sessions are not thread-safe).</summary>
    public ShardStoreSession NewSession() =>
        new(kv, kv.For(new SimpleFunctions<long, long>((current, delta) => current + delta)).NewSession<SimpleFunctions<long, long>>());

    public void Dispose()
    {
        kv.Dispose();
        device.Dispose();
    }
}
