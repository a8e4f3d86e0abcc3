using System;
using System.Threading;

namespace Epvs.Tests;

/// <summary>
/// Control for mutual exclusion and stable views: regions are tracked, but a transition runs its critical section
/// at once instead of waiting for the regions that observed the old version.
/// </summary>
public sealed class NoWaitScheme : ISchemeUnderTest
{
    private long version = 1;
    private int transitioning;

    public string Name => "control: critical section without waiting";

    public long Enter() => Volatile.Read(ref version);

    public long Refresh() => Volatile.Read(ref version);

    public void Leave()
    {
    }

    public long CurrentVersion => Volatile.Read(ref version);

    public bool TryAdvance(Action<long, long> criticalSection, long targetVersion)
    {
        if (Interlocked.CompareExchange(ref transitioning, 1, 0) != 0)
            return false;
        try
        {
            long from = Volatile.Read(ref version);
            if (targetVersion != -1 && targetVersion <= from)
                return false;
            long to = targetVersion == -1 ? from + 1 : targetVersion;
            criticalSection(from, to);
            Volatile.Write(ref version, to);
            return true;
        }
        finally
        {
            Volatile.Write(ref transitioning, 0);
        }
    }

    public void Poke()
    {
    }

    public void Dispose()
    {
    }
}
