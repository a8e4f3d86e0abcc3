using System.Linq;
using System.Threading;
using Xunit;

namespace Epvs.Tests;

/// <summary>G8: regions nest on one scheme and across schemes sharing a LightEpoch.</summary>
public class ReentranceTests
{
    /// <summary>
    /// Outer region, inner region, inner leave; then another thread requests a transition. It must wait for the outer
    /// leave. Deterministic: with nobody else protected, a broken scheme runs it inside the request call.
    /// </summary>
    private static (bool RanBeforeOuterLeave, bool RanAfter) InnerLeaveThenRequest(ISchemeUnderTest scheme)
    {
        int ran = 0;
        long v = scheme.Enter();
        Assert.Equal(v, scheme.Enter());
        scheme.Leave();
        GuardedThread.Start(() => scheme.TryAdvance((_, _) => Volatile.Write(ref ran, 1), v + 1)).Join();
        bool early = Volatile.Read(ref ran) == 1;
        scheme.Leave();
        bool after = Bounded.TryWaitUntil(() => Volatile.Read(ref ran) == 1, GuardedThread.DefaultTimeout);
        return (early, after);
    }

    [Fact]
    public void NestedEnter_InnerLeave_KeepsTheOuterRegionProtected()
    {
        using var control = new FlagReentrantScheme();
        var caught = InnerLeaveThenRequest(control);
        Assert.True(caught.RanBeforeOuterLeave, "control not caught: re-entrance by flag was expected to release on the inner Leave");

        using var real = new RealScheme();
        var result = InnerLeaveThenRequest(real);
        Assert.False(result.RanBeforeOuterLeave, "the inner Leave released the outer region");
        Assert.True(result.RanAfter);
    }

    [Fact]
    public void NestedEnter_AcrossSharedSchemes_OnlyTheOutermostAnnounces()
    {
        using var epoch = new LightEpoch();
        using var a = new EpochProtectedVersionScheme(epoch);
        using var b = new EpochProtectedVersionScheme(epoch);
        int me = System.Environment.CurrentManagedThreadId;

        a.Enter();
        long announced = epoch.GetSnapshot().ProtectedThreads.Single(t => t.ManagedThreadId == me).Epoch;
        epoch.BumpCurrentEpoch();
        b.Enter();
        a.Enter();
        using (b.EnterScope(out _))
        {
            var mine = epoch.GetSnapshot().ProtectedThreads.Where(t => t.ManagedThreadId == me).ToArray();
            Assert.Single(mine);
            Assert.Equal(announced, mine[0].Epoch); // nested entries did not re-announce
        }
        a.Leave();
        b.Refresh(); // nested: must not refresh the outer announcement either
        Assert.Equal(announced, epoch.GetSnapshot().ProtectedThreads.Single(t => t.ManagedThreadId == me).Epoch);
        b.Leave();
        Assert.True(epoch.ThisInstanceProtected());
        a.Leave();
        Assert.False(epoch.ThisInstanceProtected());
        Assert.DoesNotContain(epoch.GetSnapshot().ProtectedThreads, t => t.ManagedThreadId == me);
    }

    [Fact]
    public void NestedEnter_OnSchemeWhoseTransitionWaitsForThisThread_ReturnsTheObservedStateWithoutDeadlock()
    {
        using var epoch = new LightEpoch();
        using var a = new EpochProtectedVersionScheme(epoch);
        using var b = new EpochProtectedVersionScheme(epoch);
        long published = 1;

        VersionSchemeState outer = b.Enter();
        // Another thread asks B to advance; the critical section waits for us (we observed version 1).
        GuardedThread.Start(() => Assert.Equal(StateMachineExecutionStatus.Ok,
            b.TryAdvanceVersionWithCriticalSection((_, to) => Volatile.Write(ref published, to)))).Join();
        Assert.True(b.CurrentState.IsIntermediate);

        // Nested entries on A and again on B must return at once (they cannot wait for a transition that waits
        // for them) and B's nested view must be the state the outer region observed.
        a.Enter();
        VersionSchemeState inner = b.Enter();
        Assert.Equal(outer, inner);
        Assert.Equal(1, Volatile.Read(ref published));
        VersionSchemeState refreshed = b.Refresh(); // nested refresh keeps the outer view too
        Assert.Equal(outer, refreshed);
        b.Leave();
        a.Leave();
        Assert.Equal(1, Volatile.Read(ref published));
        b.Leave();
        Bounded.WaitUntil(() => Volatile.Read(ref published) == 2, "B's critical section after the outer leave");
    }

    [Fact]
    public void NestedEnter_OnSchemeWhoseTransitionDoesNotWaitForThisThread_WaitsAndSeesTheNewState()
    {
        using var epoch = new LightEpoch();
        using var a = new EpochProtectedVersionScheme(epoch);
        using var b = new EpochProtectedVersionScheme(epoch);
        long published = 1;
        using var parked = new ParkedThread(() => b.Enter(), b.Leave);
        Assert.Equal(StateMachineExecutionStatus.Ok, b.TryAdvanceVersionWithCriticalSection((_, to) => Volatile.Write(ref published, to)));

        long innerVersion = 0, innerPublished = 0;
        using var entered = new ManualResetEventSlim();
        var t = GuardedThread.Start(() =>
        {
            a.Enter(); // announces after B's step began: B does not wait for this thread
            entered.Set();
            innerVersion = b.Enter().Version; // so this must wait for B's transition, not return the old state
            innerPublished = Volatile.Read(ref published);
            b.Leave();
            a.Leave();
        });
        Assert.True(entered.Wait(GuardedThread.DefaultTimeout));
        parked.Release();
        t.Join();
        Assert.Equal(2, innerVersion);
        Assert.Equal(2, innerPublished);
    }

    [Fact]
    public void NestedRefresh_InnerScheme_DoesNotLetTheOuterSchemesTransitionThrough()
    {
        using var epoch = new LightEpoch();
        using var a = new EpochProtectedVersionScheme(epoch);
        using var b = new EpochProtectedVersionScheme(epoch);
        int ran = 0;
        a.Enter();
        b.Enter();
        GuardedThread.Start(() => a.TryAdvanceVersionWithCriticalSection((_, _) => Volatile.Write(ref ran, 1))).Join();
        b.Refresh();
        epoch.ProtectAndDrain();
        Assert.Equal(0, Volatile.Read(ref ran));
        b.Leave();
        a.Leave();
        Bounded.WaitUntil(() => Volatile.Read(ref ran) == 1, "A's critical section");
    }
}
