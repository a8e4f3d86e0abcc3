using System;

namespace Epvs.Tests;

/// <summary>
/// Control for monotonic versions: the real scheme, but requests drop their target version (always "next"), so two
/// threads that both observed version v and both asked for v + 1 advance twice.
/// </summary>
public sealed class IgnoreTargetScheme : ISchemeUnderTest
{
    private readonly RealScheme inner = new();

    public string Name => "control: target version ignored";

    public long Enter() => inner.Enter();

    public long Refresh() => inner.Refresh();

    public void Leave() => inner.Leave();

    public long CurrentVersion => inner.CurrentVersion;

    public bool TryAdvance(Action<long, long> criticalSection, long targetVersion) => inner.TryAdvance(criticalSection, -1);

    public void Poke() => inner.Poke();

    public void Dispose() => inner.Dispose();
}
