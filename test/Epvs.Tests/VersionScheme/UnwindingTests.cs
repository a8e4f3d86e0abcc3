using System;
using System.Collections.Concurrent;
using System.Threading;
using Xunit;

namespace Epvs.Tests;

/// <summary>
/// G6/G7/G8 on the unwinding paths: a Leave (or Suspend) that runs in a finally block while an exception unwinds from a
/// protected region, and callbacks that throw while their thread is inside a critical section (also through a scope of
/// another scheme, or inside the thread's own Refresh), release protection exactly once, block no drain, keep the
/// unwinding exception, and leave the thread as they found it. Deterministic: every step is held back by the thread
/// under test, so it runs inside that thread's own Leave or Refresh.
/// </summary>
public class UnwindingTests
{
    private sealed class Unwinding : Exception
    {
        public Unwinding(string message) : base(message) { }
    }

    [Fact]
    public void Leave_InAFinallyWhileAnExceptionUnwinds_ReleasesOnce_RunsWhatItHeldBack_AndKeepsTheException()
    {
        using var scheme = new EpochProtectedVersionScheme();
        var actionFaults = new ConcurrentQueue<Exception>();
        scheme.Epoch.DeferredActionFailed += (_, e) => actionFaults.Enqueue(e.Exception);
        Exception? machineFault = null;
        scheme.StateMachineFaulted += (_, e) =>
        {
            machineFault = e.Exception;
            throw new InvalidOperationException("a handler that throws, during the unwinding");
        };
        var section = new InvalidOperationException("the critical section's own fault");
        var action = new InvalidOperationException("the deferred action's own fault");
        var unwinding = new Unwinding("the region's own fault");
        Exception? caught = null, secondLeave = null;
        bool protectedAfter = true;
        GuardedThread.Start(() =>
        {
            try
            {
                using (scheme.EnterScope(out _))
                {
                    // Both held back by this thread: its Leave, in the scope's Dispose during the unwinding, runs them.
                    Assert.Equal(StateMachineExecutionStatus.Ok, scheme.TryAdvanceVersionWithCriticalSection((_, _) => throw section));
                    scheme.Epoch.BumpCurrentEpoch(() => throw action);
                    throw unwinding;
                }
            }
            catch (Exception ex)
            {
                caught = ex;
            }
            protectedAfter = scheme.Epoch.ThisInstanceProtected();
            secondLeave = Record.Exception(scheme.Leave);
        }, "region").Join();

        Assert.Same(unwinding, caught); // neither fault run by the Leave replaced the exception in flight
        Assert.False(protectedAfter);
        Assert.IsType<InvalidOperationException>(secondLeave); // released exactly once
        Assert.Same(section, machineFault);
        Assert.Contains(action, actionFaults);
        Assert.Equal(VersionSchemeState.Make(VersionSchemeState.Rest, 1), scheme.CurrentState);
        Assert.Empty(scheme.Epoch.GetSnapshot().PendingActionEpochs);
        Assert.True(scheme.AdvanceVersionWithCriticalSection((_, _) => { }, spin: true)); // the scheme moves on
    }

    [Fact]
    public void NestedLeave_InAFinallyWhileAnExceptionUnwinds_KeepsTheOuterRegion()
    {
        using var scheme = new EpochProtectedVersionScheme();
        int ran = 0, depthAfterInner = -1, ranBeforeOuterLeave = -1;
        GuardedThread.Start(() =>
        {
            long observed = scheme.Enter().Version;
            Assert.Equal(StateMachineExecutionStatus.Ok, scheme.TryAdvanceVersionWithCriticalSection((_, _) => Interlocked.Increment(ref ran)));
            try
            {
                using (scheme.EnterScope(out _))
                    throw new Unwinding("the inner region's fault");
            }
            catch (Unwinding)
            {
            }
            depthAfterInner = scheme.Epoch.ProtectionDepth;
            ranBeforeOuterLeave = Volatile.Read(ref ran); // G1/G5: the outer region still holds the transition back
            Assert.Equal(observed, scheme.CurrentState.Version);
            scheme.Leave(); // lets it run
        }, "region").Join();

        Assert.Equal(1, depthAfterInner);
        Assert.Equal(0, ranBeforeOuterLeave);
        Assert.Equal(1, ran);
        Assert.Equal(2, scheme.CurrentState.Version);
        Assert.False(scheme.Epoch.ThisInstanceProtected());
    }

    [Fact]
    public void CriticalSection_ThrowingThroughAScopeOfASharingScheme_LeavesTheThreadAsItFoundIt()
    {
        using var epoch = new LightEpoch();
        var scheme = new EpochProtectedVersionScheme(epoch);
        var other = new EpochProtectedVersionScheme(epoch);
        var fault = new Unwinding("thrown inside the critical section, from inside a region of another scheme");
        int depthInside = -1;
        Exception? thrown = null;
        GuardedThread.Start(() =>
        {
            // Nobody is protected: the step runs on this thread, inside the blocking start.
            thrown = Record.Exception(() => scheme.AdvanceVersionWithCriticalSection((_, _) =>
            {
                using (other.EnterScope(out _))
                {
                    depthInside = epoch.ProtectionDepth;
                    throw fault;
                }
            }, spin: true));
            // Out of the critical section and of the machine's callbacks: Enter and a blocking start work on this thread.
            Assert.Equal(0, epoch.ProtectionDepth);
            Assert.Equal(1, scheme.Enter().Version);
            scheme.Leave();
            Assert.True(scheme.AdvanceVersionWithCriticalSection((_, _) => { }, spin: true));
        }, "requester").Join();

        Assert.Same(fault, thrown);
        Assert.Equal(1, depthInside);
        Assert.Equal(VersionSchemeState.Make(VersionSchemeState.Rest, 2), scheme.CurrentState);
        Assert.False(epoch.ThisInstanceProtected());
        Assert.True(epoch.TryDispose(), "a slot is still held");
    }

    [Fact]
    public void CriticalSection_RunInsideTheThreadsOwnRefresh_ThrowsAfterARefusedRefresh_TheRegionStaysOnce()
    {
        // The step waits only for this thread, so its Refresh runs it; the critical section calls Refresh itself (refused:
        // it would wait for itself) and lets that escape. The outer Refresh returns the restored state, region kept.
        using var scheme = new EpochProtectedVersionScheme();
        Exception? inner = null, machineFault = null, secondLeave = null;
        scheme.StateMachineFaulted += (_, e) => machineFault = e.Exception;
        VersionSchemeState refreshed = default;
        int depthAfter = -1;
        GuardedThread.Start(() =>
        {
            scheme.Enter();
            Assert.Equal(StateMachineExecutionStatus.Ok, scheme.TryAdvanceVersionWithCriticalSection((_, _) =>
            {
                inner = Record.Exception(() => scheme.Refresh());
                throw inner!;
            }));
            refreshed = scheme.Refresh();
            depthAfter = scheme.Epoch.ProtectionDepth;
            scheme.Leave();
            secondLeave = Record.Exception(scheme.Leave);
        }, "region").Join();

        Assert.IsType<InvalidOperationException>(inner);
        Assert.Same(inner, machineFault);
        Assert.Equal(VersionSchemeState.Make(VersionSchemeState.Rest, 1), refreshed);
        Assert.Equal(1, depthAfter);
        Assert.IsType<InvalidOperationException>(secondLeave);
        Assert.True(scheme.AdvanceVersionWithCriticalSection((_, _) => { }, spin: true));
    }

    /// <summary>
    /// A Refresh steps aside (its slot parked); meanwhile, on the same thread (as a deferred action drained there would),
    /// a region of the same epoch is entered and left by a scope while an exception unwinds, or, as misuse, entered and
    /// not left (with <paramref name="ignoreLevelLeftBehind"/>, the control: coming back over that level). Returns what
    /// the Refresh threw, the thread's depth after it, whether it could then leave everything, and whether the epoch could
    /// be disposed then.
    /// </summary>
    private static (Exception? Refresh, int DepthAfter, bool Disposed) RefreshWithARegionOnItsThreadWhileAside(bool leaveTheInnerRegion, bool ignoreLevelLeftBehind = false)
    {
        var epoch = new LightEpoch { IgnoreLevelLeftBehindForTesting = ignoreLevelLeftBehind };
        var scheme = new EpochProtectedVersionScheme(epoch);
        Exception? refresh = null;
        int depthAfter = -1;
        ParkedThread? holder = null;
        scheme.AfterStepAsideHookForTesting = () =>
        {
            scheme.AfterStepAsideHookForTesting = null;
            holder!.Release(); // its Leave runs the step: the Refresh will come back once this hook returns
            if (!leaveTheInnerRegion)
            {
                epoch.Resume(); // misuse: a level left behind
                return;
            }
            try
            {
                using (epoch.EnterScope())
                    throw new Unwinding("inside a region entered while the Refresh is aside");
            }
            catch (Unwinding)
            {
            }
        };
        using (holder = new ParkedThread(() => scheme.Enter(), scheme.Leave))
        {
            GuardedThread.Start(() =>
            {
                scheme.Enter();
                Assert.Equal(StateMachineExecutionStatus.Ok, scheme.TryAdvanceVersionWithCriticalSection((_, _) => { }));
                refresh = Record.Exception(() => scheme.Refresh()); // held back by the holder: steps aside
                depthAfter = epoch.ProtectionDepth;
                while (epoch.ThisInstanceProtected())
                    scheme.Leave();
            }, "refresh").Join();
        }
        Assert.Equal(2, scheme.CurrentState.Version);
        return (refresh, depthAfter, epoch.TryDispose());
    }

    [Fact]
    public void Refresh_SteppedAside_WithARegionEnteredAndUnwoundOnItsThread_ComesBackInItsRegionOnce()
    {
        (Exception? refresh, int depthAfter, bool disposed) = RefreshWithARegionOnItsThreadWhileAside(leaveTheInnerRegion: true);
        Assert.Null(refresh);
        Assert.Equal(1, depthAfter);
        Assert.True(disposed, "a slot is still held after every level was left");
    }

    [Fact]
    public void Refresh_SteppedAside_WithALevelLeftBehindOnItsThread_CountsBothAndReleasesBoth()
    {
        (Exception? refresh, int depthAfter, bool disposed) = RefreshWithARegionOnItsThreadWhileAside(leaveTheInnerRegion: false);
        Assert.Null(refresh);
        Assert.Equal(2, depthAfter);
        Assert.True(disposed, "a slot is still held after every level was left");
    }

    [Fact]
    public void Refresh_SteppedAside_ComingBackOverALevelLeftBehind_HoldsItsSlotForEver_Control()
    {
        // Coming back ignores the level left behind: it takes the parked slot over it, so the thread counts one level and
        // the left-behind level's slot stays announced with nobody to clear it (the epoch can never be disposed).
        (Exception? refresh, int depthAfter, bool disposed) = RefreshWithARegionOnItsThreadWhileAside(leaveTheInnerRegion: false, ignoreLevelLeftBehind: true);
        Assert.Null(refresh);
        Assert.Equal(1, depthAfter);
        Assert.False(disposed);
    }
}
