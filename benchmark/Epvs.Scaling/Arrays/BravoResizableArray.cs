using System;
using System.Threading;
using Epvs.Baselines;
using Epvs.Samples.ResizableArray;

namespace Epvs.Scaling.Arrays;

/// <summary>
/// The paper's BRAVO resizable array (§6.1): reads, writes and pushes hold a <see cref="BravoReaderWriterLock"/> for
/// reading; a push that finds the array full resizes under the write lock.
/// </summary>
public sealed class BravoResizableArray : IResizableArray
{
    private readonly BravoReaderWriterLock latch;
    private readonly TimeSpan resizeDelay;
    private long[] list;
    private int count;

    /// <summary>Creates an array.</summary>
    /// <param name="initialCapacity">Initial length (at least 1).</param>
    /// <param name="table">The visible-readers table (the process-wide 4096-slot one by default).</param>
    /// <param name="resizeDelay">Extra time per resize, under the write lock (Fig. 13).</param>
    public BravoResizableArray(int initialCapacity, VisibleReadersTable? table = null, TimeSpan resizeDelay = default)
    {
        ArgumentOutOfRangeException.ThrowIfLessThan(initialCapacity, 1);
        latch = new BravoReaderWriterLock(table);
        list = new long[initialCapacity];
        this.resizeDelay = resizeDelay;
        TableSize = (table ?? VisibleReadersTable.Shared).Size;
    }

    /// <summary>Size of the visible-readers table.</summary>
    public int TableSize { get; }

    /// <inheritdoc/>
    public string Name => "BRAVO";

    /// <inheritdoc/>
    public int Count => Volatile.Read(ref count); // acquire: pairs with the increment in Push

    /// <inheritdoc/>
    public int Capacity
    {
        get
        {
            int token = latch.EnterReadLock();
            try
            {
                return list.Length;
            }
            finally
            {
                latch.ExitReadLock(token);
            }
        }
    }

    /// <inheritdoc/>
    public long Read(int index)
    {
        int token = latch.EnterReadLock();
        try
        {
            int n = Volatile.Read(ref count);
            if ((uint)index >= (uint)n)
                throw new ArgumentOutOfRangeException(nameof(index));
            long[] current = list;
            return (uint)index < (uint)current.Length ? current[index] : 0;
        }
        finally
        {
            latch.ExitReadLock(token);
        }
    }

    /// <inheritdoc/>
    public void Write(int index, long value)
    {
        int token = latch.EnterReadLock();
        try
        {
            int n = Volatile.Read(ref count);
            long[] current = list;
            if ((uint)index >= (uint)n || (uint)index >= (uint)current.Length)
                throw new ArgumentOutOfRangeException(nameof(index));
            current[index] = value;
        }
        finally
        {
            latch.ExitReadLock(token);
        }
    }

    /// <inheritdoc/>
    public int Push(long value)
    {
        int token = latch.EnterReadLock();
        int pos = Interlocked.Increment(ref count) - 1; // full fence; the slot is ours alone
        try
        {
            while (true)
            {
                long[] current = list; // stable while we hold the read side
                if (pos < current.Length)
                {
                    current[pos] = value;
                    return pos;
                }
                latch.ExitReadLock(token);
                token = int.MinValue;
                latch.EnterWriteLock();
                try
                {
                    Resize();
                }
                finally
                {
                    latch.ExitWriteLock();
                }
                token = latch.EnterReadLock();
            }
        }
        finally
        {
            if (token != int.MinValue)
                latch.ExitReadLock(token);
        }
    }

    private void Resize()
    {
        long[] old = list;
        int n = Volatile.Read(ref count);
        if (n <= old.Length)
            return; // another pusher resized first
        int length = old.Length;
        while (length < n)
            length = length > int.MaxValue / 2 ? int.MaxValue : length * 2;
        var grown = new long[length];
        Array.Copy(old, grown, old.Length);
        if (resizeDelay > TimeSpan.Zero)
            Thread.Sleep(resizeDelay);
        list = grown;
    }

    /// <inheritdoc/>
    public IResizableArraySession OpenSession() => new Session(this);

    /// <inheritdoc/>
    public void Dispose() => latch.Dispose();

    private sealed class Session(BravoResizableArray array) : IResizableArraySession
    {
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
