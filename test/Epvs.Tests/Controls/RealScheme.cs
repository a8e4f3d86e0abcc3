using System;

namespace Epvs.Tests;

/// <summary>The scheme under test.</summary>
public sealed class RealScheme : ISchemeUnderTest
{
    public RealScheme(EpochProtectedVersionScheme? scheme = null) => Scheme = scheme ?? new EpochProtectedVersionScheme();

    public EpochProtectedVersionScheme Scheme { get; }

    public string Name => "Epvs";

    public long Enter() => Scheme.Enter().Version;

    public long Refresh() => Scheme.Refresh().Version;

    public void Leave() => Scheme.Leave();

    public long CurrentVersion => Scheme.CurrentState.Version;

    public bool TryAdvance(Action<long, long> criticalSection, long targetVersion) =>
        Scheme.TryAdvanceVersionWithCriticalSection(criticalSection, targetVersion) == StateMachineExecutionStatus.Ok;

    public void Poke() => Scheme.Epoch.BumpCurrentEpoch();

    public void Dispose() => Scheme.Dispose();
}
