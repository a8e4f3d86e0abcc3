using System;

namespace Epvs.Samples.CprCheckpoint;

/// <summary>
/// Requests of one <see cref="CprSession"/> in a single protected region that spans many of them (coarse-grained
/// operations). Requests are applied exactly as by the session, but a checkpoint cuts only where the batch calls
/// <see cref="Refresh"/> (or ends): a checkpoint started meanwhile waits until then, so refresh every few thousand
/// requests. Created by <see cref="CprSession.BeginBatch"/>; use it, and dispose it, on the thread that created it.
/// Taking a checkpoint on that thread while the batch is open would wait for the batch itself, so it throws
/// <see cref="InvalidOperationException"/>.
/// </summary>
public sealed class CprBatch : IDisposable
{
    private readonly CprStore store;
    private readonly ClientState client;
    private VersionSchemeState state;
    private bool disposed;

    internal CprBatch(CprStore store, ClientState client)
    {
        this.store = store;
        this.client = client;
        state = store.Scheme.Enter();
    }

    /// <summary>Request <paramref name="sequenceNumber"/>: set <paramref name="key"/> to <paramref name="value"/>
    /// (as <see cref="CprSession.Upsert"/>).</summary>
    /// <param name="sequenceNumber">The request's number (positive, increasing per client).</param>
    /// <param name="key">The key.</param>
    /// <param name="value">The value.</param>
    /// <returns>Whether it was applied or a duplicate.</returns>
    /// <exception cref="ArgumentOutOfRangeException"><paramref name="sequenceNumber"/> is not positive.</exception>
    /// <exception cref="ObjectDisposedException">The batch is disposed.</exception>
    public RequestResult Upsert(long sequenceNumber, long key, long value)
    {
        Check(sequenceNumber);
        return store.ApplyProtected(client, sequenceNumber, key, value, add: false, state);
    }

    /// <summary>Request <paramref name="sequenceNumber"/>: add <paramref name="delta"/> to <paramref name="key"/>
    /// (as <see cref="CprSession.Add"/>).</summary>
    /// <param name="sequenceNumber">The request's number (positive, increasing per client).</param>
    /// <param name="key">The key.</param>
    /// <param name="delta">The amount.</param>
    /// <returns>Whether it was applied or a duplicate.</returns>
    /// <exception cref="ArgumentOutOfRangeException"><paramref name="sequenceNumber"/> is not positive.</exception>
    /// <exception cref="ObjectDisposedException">The batch is disposed.</exception>
    public RequestResult Add(long sequenceNumber, long key, long delta)
    {
        Check(sequenceNumber);
        return store.ApplyProtected(client, sequenceNumber, key, delta, add: true, state);
    }

    /// <summary>Reads <paramref name="key"/>.</summary>
    /// <param name="key">The key.</param>
    /// <param name="value">Its value, or 0.</param>
    /// <returns>Whether the key exists.</returns>
    /// <exception cref="ObjectDisposedException">The batch is disposed.</exception>
    public bool TryRead(long key, out long value)
    {
        ObjectDisposedException.ThrowIf(disposed, this);
        return store.TryReadProtected(key, out value);
    }

    /// <summary>Lets a pending checkpoint step pass (a cut between the requests before and after this call) and
    /// continues in the state it leads to.</summary>
    /// <exception cref="ObjectDisposedException">The batch is disposed.</exception>
    public void Refresh()
    {
        ObjectDisposedException.ThrowIf(disposed, this);
        state = store.Scheme.Refresh();
    }

    /// <summary>Leaves the batch's protected region.</summary>
    public void Dispose()
    {
        if (disposed)
            return;
        disposed = true;
        store.Scheme.Leave();
    }

    private void Check(long sequenceNumber)
    {
        ObjectDisposedException.ThrowIf(disposed, this);
        ArgumentOutOfRangeException.ThrowIfNegativeOrZero(sequenceNumber);
    }
}
