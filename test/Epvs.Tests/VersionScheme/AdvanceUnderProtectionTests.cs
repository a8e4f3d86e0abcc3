using System.Threading;
using Xunit;

namespace Epvs.Tests;

/// <summary>G5: a transition requested inside a protected region waits for the requester to leave or refresh.</summary>
public class AdvanceUnderProtectionTests
{
    private readonly ITestOutputHelper output;

    public AdvanceUnderProtectionTests(ITestOutputHelper output) => this.output = output;

    /// <summary>
    /// The requester stays inside its region while other threads come and go and the epoch is poked; the critical
    /// section must not run until it leaves, and must then run with nobody calling anything else.
    /// </summary>
    private static (bool RanWhileInside, bool RanAfterLeave) RequestInsideRegion(ISchemeUnderTest scheme)
    {
        int ran = 0;
        long v = scheme.Enter();
        bool started = scheme.TryAdvance((_, _) => Volatile.Write(ref ran, 1), v + 1);
        Assert.True(started, $"{scheme.Name}: the request was not started");
        for (int i = 0; i < 50; i++)
        {
            GuardedThread.Start(() =>
            {
                // A short region on another thread: it waits for the transition, so only probe whether it could enter.
                if (scheme.CurrentVersion == v)
                    return;
                scheme.Enter();
                scheme.Leave();
            }).Join();
            scheme.Poke();
        }
        bool ranWhileInside = Volatile.Read(ref ran) == 1;
        scheme.Leave();
        bool ranAfterLeave = Bounded.TryWaitUntil(() => Volatile.Read(ref ran) == 1, GuardedThread.DefaultTimeout);
        return (ranWhileInside, ranAfterLeave);
    }

    [Fact]
    public void TryAdvance_RequestedInsideRegion_CriticalSectionWaitsForTheRequesterToLeave()
    {
        using var faster = new FasterScheme();
        var control = RequestInsideRegion(faster);
        output.WriteLine($"FASTER.core: ran while the requester was inside = {control.RanWhileInside}");
        Assert.True(control.RanWhileInside, "control not caught: FASTER.core's scheme is expected to refresh the requester and run the critical section inside its region");

        using var real = new RealScheme();
        var result = RequestInsideRegion(real);
        Assert.False(result.RanWhileInside, "the critical section ran while its requester was still inside its region");
        Assert.True(result.RanAfterLeave, "the critical section did not run after the requester left");
    }

    [Fact]
    public void Refresh_AfterRequestingInsideRegion_ObservesTheNewVersion()
    {
        // The paper's Fig. 3 push loop: request v + 1 inside the region, then Refresh and carry on in the new version.
        using var scheme = new EpochProtectedVersionScheme();
        int ran = 0;
        VersionSchemeState v = scheme.Enter();
        Assert.Equal(StateMachineExecutionStatus.Ok, scheme.TryAdvanceVersionWithCriticalSection((_, _) => ran++, v.Version + 1));
        Assert.Equal(0, ran);
        VersionSchemeState after = scheme.Refresh();
        Assert.Equal(1, ran);
        Assert.Equal(v.Version + 1, after.Version);
        scheme.Leave();
    }

    [Fact]
    public void BumpCurrentEpoch_ByAProtectedThread_DoesNotRefreshItsProtection()
    {
        using var epoch = new LightEpoch();
        int ran = 0;
        epoch.Resume();
        epoch.BumpCurrentEpoch(() => ran = 1);
        epoch.BumpCurrentEpoch();
        epoch.BumpCurrentEpoch(() => { });
        Assert.Equal(0, ran);
        epoch.Suspend();
        Assert.Equal(1, ran);
    }
}
