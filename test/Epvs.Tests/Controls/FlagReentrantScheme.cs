using System;

namespace Epvs.Tests;

/// <summary>
/// Control for re-entrance: the real scheme behind a per-thread "already inside" flag instead of a depth count, a
/// common way to fake re-entrance. The inner Leave releases the outer region's protection.
/// </summary>
public sealed class FlagReentrantScheme : ISchemeUnderTest
{
    [ThreadStatic] private static bool t_inside;
    private readonly RealScheme inner = new();

    public string Name => "control: re-entrance by flag";

    public long Enter()
    {
        if (t_inside)
            return inner.CurrentVersion;
        t_inside = true;
        return inner.Enter();
    }

    public long Refresh() => inner.Refresh();

    public void Leave()
    {
        if (!t_inside)
            return; // the outer Leave after an inner one already released: swallowed, as such wrappers do
        t_inside = false;
        inner.Leave();
    }

    public long CurrentVersion => inner.CurrentVersion;

    public bool TryAdvance(Action<long, long> criticalSection, long targetVersion) => inner.TryAdvance(criticalSection, targetVersion);

    public void Poke() => inner.Poke();

    public void Dispose() => inner.Dispose();
}
