using System.Threading;
using Xunit;

namespace Epvs.Tests;

/// <summary>G1 (mutual exclusion) and G2 (stable view), with FASTER's "transitions racing Enter/Leave" test.</summary>
public class MutualExclusionTests
{
    private const int Seed = 20241121;
    private readonly ITestOutputHelper output;

    public MutualExclusionTests(ITestOutputHelper output) => this.output = output;

    [Fact]
    public void EnterLeave_ThousandTransitionsRacing_EveryRegionSeesThePublishedVersion()
    {
        output.WriteLine($"seed {Seed}");
        using var control = new NoWaitScheme();
        ExclusionChecker.Result caught = ExclusionChecker.Run(control, readers: 2, transitions: 200, Seed, useRefresh: false);
        output.WriteLine($"control: {caught.Violations} violations in {caught.Regions} regions; first: {caught.FirstViolation}");

        using var real = new RealScheme();
        ExclusionChecker.Result result = ExclusionChecker.Run(real, readers: 2, transitions: 1000, Seed, useRefresh: false);
        output.WriteLine($"real: {result.Violations} violations in {result.Regions} regions over {result.Transitions} transitions");

        Assert.True(result.Violations == 0, result.FirstViolation);
        Assert.Equal(1000, result.Transitions);
        Assert.Equal(1001, real.CurrentVersion);
        Assert.SkipWhen(caught.Violations == 0, "inconclusive: the control (critical section without waiting) was not caught");
    }

    [Fact]
    public void Refresh_TransitionsRacing_RefreshedRegionsSeeThePublishedVersion()
    {
        output.WriteLine($"seed {Seed}");
        using var control = new NoWaitScheme();
        ExclusionChecker.Result caught = ExclusionChecker.Run(control, readers: 2, transitions: 200, Seed, useRefresh: true);

        using var real = new RealScheme();
        ExclusionChecker.Result result = ExclusionChecker.Run(real, readers: 2, transitions: 300, Seed, useRefresh: true);
        output.WriteLine($"real: {result.Violations} violations in {result.Regions} regions; control: {caught.Violations}");

        Assert.True(result.Violations == 0, result.FirstViolation);
        Assert.SkipWhen(caught.Violations == 0, "inconclusive: the control (critical section without waiting) was not caught");
    }

    [Fact]
    public void TryAdvance_ReaderParkedInside_CriticalSectionWaitsUntilItLeaves()
    {
        using var scheme = new EpochProtectedVersionScheme();
        int ran = 0;
        using var parked = new ParkedThread(() => scheme.Enter(), scheme.Leave);

        Assert.Equal(StateMachineExecutionStatus.Ok, scheme.TryAdvanceVersionWithCriticalSection((_, _) => ran = 1));
        // Enter/Leave by others and explicit bumps must not let it through while the reader is inside.
        for (int i = 0; i < 100; i++)
        {
            GuardedThread.Start(() => { using var e = scheme.Epoch.EnterScope(); }).Join();
            scheme.Epoch.BumpCurrentEpoch();
        }
        Assert.Equal(0, Volatile.Read(ref ran));
        Assert.True(scheme.CurrentState.IsIntermediate);

        parked.Release();
        Bounded.WaitUntil(() => Volatile.Read(ref ran) == 1, "critical section after the reader left");
        Assert.Equal(2, scheme.CurrentState.Version);
    }

    [Fact]
    public void Enter_DuringPendingTransition_WaitsAndObservesTheNewState()
    {
        using var scheme = new EpochProtectedVersionScheme();
        long published = 1;
        using var parked = new ParkedThread(() => scheme.Enter(), scheme.Leave);
        Assert.Equal(StateMachineExecutionStatus.Ok,
            scheme.TryAdvanceVersionWithCriticalSection((_, to) => Volatile.Write(ref published, to)));

        long observed = 0, seenPublished = 0;
        var entering = GuardedThread.Start(() =>
        {
            VersionSchemeState s = scheme.Enter();
            observed = s.Version;
            seenPublished = Volatile.Read(ref published);
            scheme.Leave();
        });
        parked.Release();
        entering.Join();
        Assert.Equal(2, observed);
        Assert.Equal(2, seenPublished);
    }
}
