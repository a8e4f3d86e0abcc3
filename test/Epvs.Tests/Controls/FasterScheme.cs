using System;
using FasterEpoch = FASTER.core.LightEpoch;
using FasterEpvs = FASTER.core.EpochProtectedVersionScheme;
using FasterStatus = FASTER.core.StateMachineExecutionStatus;

namespace Epvs.Tests;

/// <summary>
/// FASTER.core's own scheme, as a control: its BumpCurrentEpoch refreshes the caller's protection, so a transition
/// requested inside a protected region runs while the requester is still inside it (DESIGN G5).
/// </summary>
public sealed class FasterScheme : ISchemeUnderTest
{
    private readonly FasterEpoch epoch = new();
    private readonly FasterEpvs scheme;

    public FasterScheme() => scheme = new FasterEpvs(epoch);

    public string Name => "FASTER.core";

    public long Enter() => scheme.Enter().Version;

    public long Refresh() => scheme.Refresh().Version;

    public void Leave() => scheme.Leave();

    public long CurrentVersion => scheme.CurrentState().Version;

    public bool TryAdvance(Action<long, long> criticalSection, long targetVersion) =>
        scheme.TryAdvanceVersionWithCriticalSection(criticalSection, targetVersion) == FasterStatus.OK;

    public void Poke()
    {
        if (epoch.ThisInstanceProtected())
            epoch.ProtectAndDrain();
    }

    public void Dispose() => epoch.Dispose();
}
