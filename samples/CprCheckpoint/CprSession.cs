using System;

namespace Epvs.Samples.CprCheckpoint;

/// <summary>
/// A client's session on a <see cref="CprStore"/>. Requests carry the client's sequence numbers, increasing; a request
/// whose number is not above the last applied one is a duplicate (a retry) and does nothing. Use a session from one
/// thread at a time.
/// </summary>
public sealed class CprSession : IDisposable
{
    private readonly CprStore store;
    private readonly ClientState client;
    private bool disposed;

    internal CprSession(CprStore store, ClientState client)
    {
        this.store = store;
        this.client = client;
    }

    /// <summary>The client.</summary>
    public long ClientId => client.ClientId;

    /// <summary>The last sequence number applied for this client (after recovery: the last one in the checkpoint).</summary>
    public long LastSequenceNumber => System.Threading.Volatile.Read(ref client.LastSequenceNumber);

    /// <summary>Request <paramref name="sequenceNumber"/>: set <paramref name="key"/> to <paramref name="value"/>.</summary>
    /// <param name="sequenceNumber">The request's number (positive, increasing per client).</param>
    /// <param name="key">The key.</param>
    /// <param name="value">The value.</param>
    /// <returns>Whether it was applied or a duplicate.</returns>
    /// <exception cref="ArgumentOutOfRangeException"><paramref name="sequenceNumber"/> is not positive.</exception>
    /// <exception cref="ObjectDisposedException">The session is disposed.</exception>
    public RequestResult Upsert(long sequenceNumber, long key, long value)
    {
        Check(sequenceNumber);
        return store.Apply(client, sequenceNumber, key, value, add: false);
    }

    /// <summary>Request <paramref name="sequenceNumber"/>: add <paramref name="delta"/> to <paramref name="key"/> (a
    /// missing key starts at 0).</summary>
    /// <param name="sequenceNumber">The request's number (positive, increasing per client).</param>
    /// <param name="key">The key.</param>
    /// <param name="delta">The amount.</param>
    /// <returns>Whether it was applied or a duplicate.</returns>
    /// <exception cref="ArgumentOutOfRangeException"><paramref name="sequenceNumber"/> is not positive.</exception>
    /// <exception cref="ObjectDisposedException">The session is disposed.</exception>
    public RequestResult Add(long sequenceNumber, long key, long delta)
    {
        Check(sequenceNumber);
        return store.Apply(client, sequenceNumber, key, delta, add: true);
    }

    /// <summary>Reads <paramref name="key"/>.</summary>
    /// <param name="key">The key.</param>
    /// <param name="value">Its value, or 0.</param>
    /// <returns>Whether the key exists.</returns>
    public bool TryRead(long key, out long value) => store.TryRead(key, out value);

    /// <summary>
    /// Enters one protected region for many requests (the paper's coarse-grained operations, §6 Fig. 16): the
    /// returned batch applies requests without entering and leaving per request, and lets checkpoints pass only at
    /// its <see cref="CprBatch.Refresh"/> and <see cref="CprBatch.Dispose"/>. Use and dispose it on this thread.
    /// </summary>
    /// <returns>The batch; use with <c>using</c>.</returns>
    /// <exception cref="ObjectDisposedException">The session is disposed.</exception>
    public CprBatch BeginBatch()
    {
        ObjectDisposedException.ThrowIf(disposed, this);
        return new CprBatch(store, client);
    }

    /// <summary>Closes the session; the client may open a new one.</summary>
    public void Dispose()
    {
        if (disposed)
            return;
        disposed = true;
        System.Threading.Volatile.Write(ref client.InUse, 0);
    }

    private void Check(long sequenceNumber)
    {
        ObjectDisposedException.ThrowIf(disposed, this);
        ArgumentOutOfRangeException.ThrowIfNegativeOrZero(sequenceNumber);
    }
}
