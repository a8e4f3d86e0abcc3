using System;
using System.Threading;

namespace Epvs.Samples.ResizableArray;

/// <summary>
/// The paper's latch-free mock (§6.1): an array preallocated large enough that it never resizes, with no
/// synchronization beyond the atomic push counter. Unrealistic (it cannot grow), it is the upper bound on throughput.
/// </summary>
public sealed class LatchFreeMockResizableArray : IResizableArray
{
    private readonly long[] list;
    private int count;

    /// <summary>Creates the mock.</summary>
    /// <param name="capacity">How many pushes it can take, ever (at least 1).</param>
    /// <exception cref="ArgumentOutOfRangeException"><paramref name="capacity"/> is below 1.</exception>
    public LatchFreeMockResizableArray(int capacity)
    {
        ArgumentOutOfRangeException.ThrowIfLessThan(capacity, 1);
        list = new long[capacity];
    }

    /// <inheritdoc/>
    public string Name => "latch-free-mock";

    /// <inheritdoc/>
    public int Count => Math.Min(Volatile.Read(ref count), list.Length);

    /// <inheritdoc/>
    public int Capacity => list.Length;

    /// <inheritdoc/>
    public long Read(int index)
    {
        int n = Count;
        if ((uint)index >= (uint)n)
            ArrayErrors.IndexOutOfRange(index, n);
        return Volatile.Read(ref list[index]); // acquire: pairs with the release in Push/Write
    }

    /// <inheritdoc/>
    public void Write(int index, long value)
    {
        int n = Count;
        if ((uint)index >= (uint)n)
            ArrayErrors.IndexOutOfRange(index, n);
        Volatile.Write(ref list[index], value); // release
    }

    /// <inheritdoc/>
    public int Push(long value)
    {
        int pos = Interlocked.Increment(ref count) - 1;
        if ((uint)pos >= (uint)list.Length)
            throw new InvalidOperationException($"The latch-free mock never grows: construct it with a capacity that covers every push (it has {list.Length}).");
        Volatile.Write(ref list[pos], value); // release: a reader that learns the index sees the value
        return pos;
    }

    /// <inheritdoc/>
    public IResizableArraySession OpenSession() => new Session(this);

    /// <inheritdoc/>
    public void Dispose()
    {
    }

    /// <summary>
    /// The session of a variant that protects each operation by itself: forwards every call to the (sealed) array,
    /// so the calls bind directly, as EPVS-pinned's session does; nothing to refresh.
    /// </summary>
    private sealed class Session : IResizableArraySession
    {
        private readonly LatchFreeMockResizableArray array;

        public Session(LatchFreeMockResizableArray array) => this.array = array;

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
