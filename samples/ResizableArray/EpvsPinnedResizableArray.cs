using System;

namespace Epvs.Samples.ResizableArray;

/// <summary>
/// The paper's EPVS-pinned variant (§6.1, Fig. 11): the simple-EPVS array driven by long-running threads whose
/// sessions stay inside one protected region and call <see cref="EpochProtectedVersionScheme.Refresh"/> between
/// batches instead of entering and leaving around every operation. Array-level calls (not through a session)
/// behave exactly like <see cref="SimpleEpvsResizableArray"/>.
/// </summary>
public sealed class EpvsPinnedResizableArray : IResizableArray
{
    private readonly SimpleEpvsResizableArray inner;

    /// <summary>Creates an array with its own scheme.</summary>
    /// <param name="initialCapacity">The initial length of the backing array (at least 1).</param>
    /// <param name="resizeDelay">Extra time spent in each resize (see <see cref="SimpleEpvsResizableArray"/>).</param>
    /// <exception cref="ArgumentOutOfRangeException"><paramref name="initialCapacity"/> is below 1.</exception>
    public EpvsPinnedResizableArray(int initialCapacity, TimeSpan resizeDelay = default)
    {
        inner = new SimpleEpvsResizableArray(initialCapacity, resizeDelay);
    }

    /// <inheritdoc/>
    public string Name => "EPVS-pinned";

    /// <inheritdoc/>
    public int Count => inner.Count;

    /// <inheritdoc/>
    public int Capacity => inner.Capacity;

    /// <inheritdoc/>
    public long Read(int index) => inner.Read(index);

    /// <inheritdoc/>
    public void Write(int index, long value) => inner.Write(index, value);

    /// <inheritdoc/>
    public int Push(long value) => inner.Push(value);

    /// <summary>
    /// Opens a pinned session: enters protection now and keeps it until <see cref="IDisposable.Dispose"/>, releasing
    /// it briefly at each <see cref="IResizableArraySession.Refresh"/>. A thread holding one must refresh regularly
    /// and dispose it before blocking, or every resize waits for it.
    /// </summary>
    /// <returns>The session.</returns>
    public IResizableArraySession OpenSession() => new PinnedSession(inner);

    /// <inheritdoc/>
    public void Dispose() => inner.Dispose();

    private sealed class PinnedSession : IResizableArraySession
    {
        private readonly SimpleEpvsResizableArray array;
        private VersionSchemeState state;
        private bool disposed;

        public PinnedSession(SimpleEpvsResizableArray array)
        {
            this.array = array;
            state = array.Scheme.Enter();
        }

        public long Read(int index) => array.ReadProtected(index);

        public void Write(int index, long value) => array.WriteProtected(index, value);

        public int Push(long value) => array.PushProtected(value, ref state);

        public void Refresh() => state = array.Scheme.Refresh();

        public void Dispose()
        {
            if (disposed)
                return;
            disposed = true;
            array.Scheme.Leave();
        }
    }
}
