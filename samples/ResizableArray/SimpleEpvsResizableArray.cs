using System;
using System.Threading;

namespace Epvs.Samples.ResizableArray;

/// <summary>
/// The paper's simple-EPVS resizable array (§3.1, Fig. 3): reads, writes and pushes run latch-free inside EPVS
/// protected regions; a push that finds the array full requests the resize as a critical section for the version
/// after the one it observed, so that of all the threads finding the array full only one resize runs, in mutual
/// exclusion with every operation.
/// </summary>
public sealed class SimpleEpvsResizableArray : IResizableArray
{
    private readonly EpochProtectedVersionScheme epvs;
    private readonly Action<long, long> resize;
    private readonly TimeSpan resizeDelay;

    /// <summary>The backing array. Replaced only in the resize critical section, so it is stable inside a protected
    /// region; the scheme's Enter/Refresh (acquire) make the critical section's store visible.</summary>
    private long[] list;

    /// <summary>Slots handed out; incremented inside protected regions only, so it is stable in the critical
    /// section.</summary>
    private int count;

    /// <summary>Creates an array with its own <see cref="EpochProtectedVersionScheme"/>.</summary>
    /// <param name="initialCapacity">The initial length of the backing array (at least 1).</param>
    /// <param name="resizeDelay">Extra time spent in each resize, to model an expensive one (the paper's Fig. 13);
    /// zero by default.</param>
    /// <exception cref="ArgumentOutOfRangeException"><paramref name="initialCapacity"/> is below 1.</exception>
    public SimpleEpvsResizableArray(int initialCapacity, TimeSpan resizeDelay = default)
    {
        ArgumentOutOfRangeException.ThrowIfLessThan(initialCapacity, 1);
        epvs = new EpochProtectedVersionScheme();
        list = new long[initialCapacity];
        this.resizeDelay = resizeDelay;
        resize = Resize; // one delegate for the array's lifetime: a full array costs no allocation per pusher
    }

    /// <inheritdoc/>
    public string Name => "simple-EPVS";

    /// <summary>The scheme protecting the array (for diagnostics, such as its version = number of resizes + 1).</summary>
    public EpochProtectedVersionScheme Scheme => epvs;

    /// <inheritdoc/>
    public int Count => Volatile.Read(ref count); // acquire: pairs with the Interlocked.Increment in Push

    /// <inheritdoc/>
    public int Capacity
    {
        get
        {
            using var scope = epvs.EnterScope(out _);
            return list.Length;
        }
    }

    /// <inheritdoc/>
    public long Read(int index)
    {
        epvs.Enter();
        try
        {
            return ReadProtected(index);
        }
        finally
        {
            epvs.Leave();
        }
    }

    /// <inheritdoc/>
    public void Write(int index, long value)
    {
        epvs.Enter();
        try
        {
            WriteProtected(index, value);
        }
        finally
        {
            epvs.Leave();
        }
    }

    /// <inheritdoc/>
    public int Push(long value)
    {
        VersionSchemeState state = epvs.Enter();
        try
        {
            return PushProtected(value, ref state);
        }
        finally
        {
            epvs.Leave();
        }
    }

    /// <inheritdoc/>
    public IResizableArraySession OpenSession() => new Session(this);

    /// <summary>Read, with the calling thread inside a protected region of <see cref="Scheme"/>.</summary>
    internal long ReadProtected(int index)
    {
        int n = Volatile.Read(ref count); // acquire: pairs with the pusher's increment
        if ((uint)index >= (uint)n)
            ArrayErrors.IndexOutOfRange(index, n);
        long[] current = list; // stable for the region (EPVS: no resize can run while we are protected)
        return (uint)index < (uint)current.Length ? current[index] : 0;
    }

    /// <summary>Write, with the calling thread inside a protected region of <see cref="Scheme"/>.</summary>
    internal void WriteProtected(int index, long value)
    {
        int n = Volatile.Read(ref count);
        if ((uint)index >= (uint)n)
            ArrayErrors.IndexOutOfRange(index, n);
        long[] current = list;
        if ((uint)index >= (uint)current.Length)
            ArrayErrors.PushInFlight(index);
        current[index] = value;
    }

    /// <summary>
    /// Fig. 3's Push, with the calling thread inside a protected region that observed <paramref name="state"/>; may
    /// refresh that region (and updates <paramref name="state"/>) while it waits for a resize.
    /// </summary>
    internal int PushProtected(long value, ref VersionSchemeState state)
    {
        // Full fence; the slot is ours alone. Done inside protection, so the critical section sees a stable count.
        int pos = Interlocked.Increment(ref count) - 1;
        if (pos < 0)
            throw new InvalidOperationException("The array is full: more than int.MaxValue pushes.");
        while (true)
        {
            long[] current = list; // stable until the Refresh below
            if (pos < current.Length)
            {
                current[pos] = value;
                return pos;
            }

            // Only the first request for "the version after the one I saw" resizes; the others get Fail. The
            // critical section cannot run while we are protected; it waits for the Refresh below (DESIGN G5).
            epvs.TryAdvanceVersionWithCriticalSection(resize, state.Version + 1);
            state = epvs.Refresh();
        }
    }

    /// <summary>The critical section: runs while no thread is inside a protected region.</summary>
    private void Resize(long fromVersion, long toVersion)
    {
        long[] old = list;
        int n = Volatile.Read(ref count);
        if (n <= old.Length)
            return; // nothing to do (cannot happen with the Push above; kept for safety)
        var grown = new long[ArrayErrors.GrownLength(old.Length, n)];
        Array.Copy(old, grown, old.Length);
        if (resizeDelay > TimeSpan.Zero)
            Thread.Sleep(resizeDelay);
        list = grown; // published to regions by the scheme's release store of the new state
    }

    /// <summary>Disposes the scheme. No thread may be using the array.</summary>
    public void Dispose() => epvs.Dispose();

    /// <summary>
    /// The session of a variant that protects each operation by itself: forwards every call to the (sealed) array,
    /// so the calls bind directly, as EPVS-pinned's session does; nothing to refresh.
    /// </summary>
    private sealed class Session : IResizableArraySession
    {
        private readonly SimpleEpvsResizableArray array;

        public Session(SimpleEpvsResizableArray array) => this.array = array;

        public long Read(int index) => array.Read(index);

        public void Write(int index, long value) => array.Write(index, value);

        public int Push(long value) => array.Push(value);

        public void Refresh()
        {
        }

        public void Dispose()
        {
        }
    }
}
