using System;
using System.Threading;
using Xunit;

namespace Epvs.Tests;

/// <summary>
/// A probe of the core's Dispose paths: what a refused Dispose tells its caller, and whether the diagnostic it points to
/// (<see cref="LightEpoch.GetSnapshot"/>) agrees with it.
/// </summary>
public class DisposeDiagnosticsTests
{
    private static readonly TimeSpan Wait = TimeSpan.FromSeconds(30);

    /// <summary>
    /// A deferred action that a protected thread's drain runs calls Dispose: refused (that thread is protected), but the
    /// message advised Suspend()/Leave() first, which the action may not do. It now says it comes from a deferred action.
    /// </summary>
    [Fact]
    public void Dispose_FromAnActionAProtectedThreadRuns_SaysSo()
    {
        using var epoch = new LightEpoch();
        Exception? fault = null;
        epoch.DeferredActionFailed += (_, a) => fault = a.Exception;
        epoch.Resume();
        epoch.BumpCurrentEpoch(() => epoch.Dispose());
        epoch.ProtectAndDrain(); // runs the action with this thread's region in place
        epoch.Suspend();

        InvalidOperationException refused = Assert.IsType<InvalidOperationException>(fault);
        Assert.Contains("from a deferred action that a protected thread runs", refused.Message, StringComparison.Ordinal);
        Assert.DoesNotContain("call Suspend()/Leave() first", refused.Message, StringComparison.Ordinal);
        Assert.True(epoch.TryDispose(), "the refused Dispose left the epoch unable to close");
    }

    /// <summary>
    /// A thread stepped aside inside Refresh (a transition waits for another reader) counts as protected for Dispose, and
    /// the snapshot lists it (it did not: "2 thread(s) are still protected", one listed).
    /// </summary>
    [Fact]
    public void AThreadSteppedAsideInRefresh_IsListedAsDisposeCountsIt()
    {
        var epoch = new LightEpoch();
        var scheme = new EpochProtectedVersionScheme(epoch);
        using var readerIn = new ManualResetEventSlim();
        using var readerGo = new ManualResetEventSlim();
        using var steppedAside = new ManualResetEventSlim();
        using var refresherIn = new ManualResetEventSlim();
        using var transitionRequested = new ManualResetEventSlim();
        int refresherId = 0;
        var reader = new Thread(() =>
        {
            scheme.Enter();
            readerIn.Set();
            readerGo.Wait();
            scheme.Leave();
        });
        var refresher = new Thread(() =>
        {
            refresherId = Environment.CurrentManagedThreadId;
            scheme.Enter();
            refresherIn.Set();
            transitionRequested.Wait();
            scheme.Refresh(); // steps aside: the transition waits for the reader
            scheme.Leave();
        });
        scheme.AfterStepAsideHookForTesting = steppedAside.Set;
        reader.Start();
        refresher.Start();
        string? refusal = null;
        EpochTableSnapshot? snapshot = null;
        try
        {
            Assert.True(readerIn.Wait(Wait));
            Assert.True(refresherIn.Wait(Wait));
            Assert.Equal(StateMachineExecutionStatus.Ok, scheme.TryAdvanceVersionWithCriticalSection((_, _) => { }));
            transitionRequested.Set();
            Assert.True(steppedAside.Wait(Wait));
            snapshot = epoch.GetSnapshot();
            refusal = Assert.Throws<InvalidOperationException>(epoch.Dispose).Message;
        }
        finally
        {
            scheme.AfterStepAsideHookForTesting = null;
            readerGo.Set();
            Assert.True(reader.Join(Wait));
            Assert.True(refresher.Join(Wait));
        }

        scheme.Dispose();
        epoch.Dispose();
        Assert.Contains("2 thread(s)", refusal, StringComparison.Ordinal);
        Assert.Equal(2, snapshot.ProtectedThreads.Count);
        EpochSlotInfo parked = Assert.Single(snapshot.ProtectedThreads, t => t.IsSteppedAside);
        Assert.Equal(refresherId, parked.ManagedThreadId);
        Assert.Contains("stepped aside", parked.ToString(), StringComparison.Ordinal);
        Assert.True(snapshot.ProtectedThreads[^1].IsSteppedAside, "a stepped-aside thread is listed after every announcement");
    }
}
