using System;
using System.Threading;

namespace Epvs.Samples.ResizableArray;

/// <summary>
/// The paper's latched baseline (§6.1): every operation holds a <see cref="ReaderWriterLockSlim"/> in shared mode
/// (element reads and writes do not conflict with each other), and a resize holds it in exclusive mode.
/// </summary>
public sealed class LatchedResizableArray : IResizableArray
{
    private readonly ReaderWriterLockSlim latch = new(LockRecursionPolicy.NoRecursion);
    private readonly TimeSpan resizeDelay;
    private long[] list;
    private int count;

    /// <summary>Creates an array.</summary>
    /// <param name="initialCapacity">The initial length of the backing array (at least 1).</param>
    /// <param name="resizeDelay">Extra time spent in each resize, under the exclusive latch.</param>
    /// <exception cref="ArgumentOutOfRangeException"><paramref name="initialCapacity"/> is below 1.</exception>
    public LatchedResizableArray(int initialCapacity, TimeSpan resizeDelay = default)
    {
        ArgumentOutOfRangeException.ThrowIfLessThan(initialCapacity, 1);
        list = new long[initialCapacity];
        this.resizeDelay = resizeDelay;
    }

    /// <inheritdoc/>
    public string Name => "latched (RW lock)";

    /// <inheritdoc/>
    public int Count => Volatile.Read(ref count); // acquire: pairs with the Interlocked.Increment in Push

    /// <inheritdoc/>
    public int Capacity
    {
        get
        {
            latch.EnterReadLock();
            try
            {
                return list.Length;
            }
            finally
            {
                latch.ExitReadLock();
            }
        }
    }

    /// <inheritdoc/>
    public long Read(int index)
    {
        latch.EnterReadLock();
        try
        {
            int n = Volatile.Read(ref count);
            if ((uint)index >= (uint)n)
                ArrayErrors.IndexOutOfRange(index, n);
            long[] current = list;
            return (uint)index < (uint)current.Length ? current[index] : 0;
        }
        finally
        {
            latch.ExitReadLock();
        }
    }

    /// <inheritdoc/>
    public void Write(int index, long value)
    {
        latch.EnterReadLock();
        try
        {
            int n = Volatile.Read(ref count);
            if ((uint)index >= (uint)n)
                ArrayErrors.IndexOutOfRange(index, n);
            long[] current = list;
            if ((uint)index >= (uint)current.Length)
                ArrayErrors.PushInFlight(index);
            current[index] = value;
        }
        finally
        {
            latch.ExitReadLock();
        }
    }

    /// <inheritdoc/>
    public int Push(long value)
    {
        int pos;
        latch.EnterReadLock();
        try
        {
            pos = Interlocked.Increment(ref count) - 1;
            if (pos < 0)
                throw new InvalidOperationException("The array is full: more than int.MaxValue pushes.");
            long[] current = list;
            if (pos < current.Length)
            {
                current[pos] = value;
                return pos;
            }
        }
        finally
        {
            latch.ExitReadLock();
        }

        latch.EnterWriteLock();
        try
        {
            if (pos >= list.Length)
            {
                var grown = new long[ArrayErrors.GrownLength(list.Length, Volatile.Read(ref count))];
                Array.Copy(list, grown, list.Length);
                if (resizeDelay > TimeSpan.Zero)
                    Thread.Sleep(resizeDelay);
                list = grown;
            }
            list[pos] = value;
            return pos;
        }
        finally
        {
            latch.ExitWriteLock();
        }
    }

    /// <inheritdoc/>
    public IResizableArraySession OpenSession() => new Session(this);

    /// <inheritdoc/>
    public void Dispose() => latch.Dispose();

    /// <summary>
    /// The session of a variant that protects each operation by itself: forwards every call to the (sealed) array,
    /// so the calls bind directly, as EPVS-pinned's session does; nothing to refresh.
    /// </summary>
    private sealed class Session : IResizableArraySession
    {
        private readonly LatchedResizableArray array;

        public Session(LatchedResizableArray array) => this.array = array;

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
