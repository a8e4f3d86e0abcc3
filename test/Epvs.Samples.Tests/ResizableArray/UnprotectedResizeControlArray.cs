using System;
using System.Threading;
using Epvs.Samples.ResizableArray;

namespace Epvs.Samples.Tests.ResizableArray;

/// <summary>
/// TEST-ONLY CONTROL, deliberately broken: the "shadowing" resize of the paper's §2.1 without EPVS. A pusher that
/// finds the array full copies it into a new one and swings the reference while other threads keep reading, writing
/// and pushing into the old one, so writes and pushes that land in the old array after the copy passed them are
/// lost. The copy and the element accesses yield to widen that window on a 2-core machine (never do this in real
/// code; the real variants have no such yields).
/// </summary>
internal sealed class UnprotectedResizeControlArray : IResizableArray
{
    private readonly object resizeLock = new();
    private long[] list;
    private int count;

    public UnprotectedResizeControlArray(int initialCapacity) => list = new long[initialCapacity];

    public string Name => "control: unprotected resize";

    public int Count => Volatile.Read(ref count);

    public int Capacity => Volatile.Read(ref list).Length;

    public long Read(int index)
    {
        if ((uint)index >= (uint)Count)
            throw new ArgumentOutOfRangeException(nameof(index));
        long[] current = Volatile.Read(ref list);
        return index < current.Length ? Volatile.Read(ref current[index]) : 0;
    }

    public void Write(int index, long value)
    {
        if ((uint)index >= (uint)Count)
            throw new ArgumentOutOfRangeException(nameof(index));
        long[] current = Volatile.Read(ref list);
        Thread.Yield(); // widen the window: the array may be copied and replaced now
        Volatile.Write(ref current[index], value);
    }

    public int Push(long value)
    {
        int pos = Interlocked.Increment(ref count) - 1;
        while (true)
        {
            long[] current = Volatile.Read(ref list);
            if (pos < current.Length)
            {
                Thread.Yield(); // widen the window
                Volatile.Write(ref current[pos], value);
                return pos;
            }
            lock (resizeLock)
            {
                long[] old = Volatile.Read(ref list);
                if (pos < old.Length)
                    continue;
                var grown = new long[Math.Max(old.Length * 2, pos + 1)];
                for (int i = 0; i < old.Length; i++)
                {
                    grown[i] = Volatile.Read(ref old[i]);
                    if ((i & 15) == 0)
                        Thread.Yield(); // widen the window: a slow copy
                }
                Volatile.Write(ref list, grown);
            }
        }
    }

    public IResizableArraySession OpenSession() => new Session(this);

    public void Dispose()
    {
    }

    private sealed class Session(UnprotectedResizeControlArray array) : IResizableArraySession
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
