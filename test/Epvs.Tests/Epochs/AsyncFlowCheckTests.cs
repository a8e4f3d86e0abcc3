using System;
using System.Collections.Concurrent;
using System.Collections.Generic;
using System.Runtime.CompilerServices;
using System.Threading;
using System.Threading.Tasks;
using Xunit;

namespace Epvs.Tests;

/// <summary>
/// Protection is per thread, so an <c>await</c> inside a region (a misuse) can make two async flows share one thread's
/// record: X enters on A and its continuation runs on B; Z enters on C, its continuation runs on A and leaves there.
/// A's depth is X's 1, so Z's Leave ended X's region silently, and an action X holds back ran while X was still inside
/// (G1); only X's own Leave threw, after the damage. With the AppContext switch <c>Epvs.LightEpoch.CheckAsyncFlow</c>
/// on, each outermost entry tags the thread's record and the entering flow with a fresh marker, and the outermost
/// Suspend and ProtectAndDrain refuse a mismatch before changing anything. The controls are unchecked epochs (the
/// default): they show the defect. The check must never refuse a correct program: nested regions, regions between
/// awaits, deferred actions that enter and leave (nested or outermost), a scheme's Refresh that steps aside.
/// </summary>
[Collection(nameof(AsyncFlowCheckTests))]
public sealed class AsyncFlowCheckTests
{
    private static readonly TimeSpan Timeout = GuardedThread.DefaultTimeout;

    private static LightEpoch NewEpoch(bool check, int initialTableSize = 16)
    {
        bool? saved = LightEpoch.CheckAsyncFlowForTesting;
        LightEpoch.CheckAsyncFlowForTesting = check;
        try
        {
            var epoch = new LightEpoch(initialTableSize);
            Assert.Equal(check, epoch.ChecksAsyncFlowForTesting);
            return epoch;
        }
        finally
        {
            LightEpoch.CheckAsyncFlowForTesting = saved;
        }
    }

    private static EpochProtectedVersionScheme NewScheme(bool check)
    {
        bool? saved = LightEpoch.CheckAsyncFlowForTesting;
        LightEpoch.CheckAsyncFlowForTesting = check;
        try
        {
            var scheme = new EpochProtectedVersionScheme(); // builds its own epoch, through the same constructor
            Assert.Equal(check, scheme.Epoch.ChecksAsyncFlowForTesting);
            return scheme;
        }
        finally
        {
            LightEpoch.CheckAsyncFlowForTesting = saved;
        }
    }

    /// <summary>A dedicated thread that runs posted continuations, one at a time.</summary>
    private sealed class Loop : IDisposable
    {
        private readonly BlockingCollection<Action> work = new();
        private readonly Thread thread;

        public Loop(string name)
        {
            thread = new Thread(() =>
            {
                foreach (Action a in work.GetConsumingEnumerable())
                    a();
            })
            { IsBackground = true, Name = name };
            thread.Start();
        }

        public int ManagedThreadId => thread.ManagedThreadId;

        public void Post(Action a) => work.Add(a);

        public SwitchAwaitable SwitchTo() => new(this);

        /// <summary>Starts <paramref name="flow"/> on this thread; the task completes with the flow's task.</summary>
        public Task Run(Func<Task> flow)
        {
            var started = new TaskCompletionSource<Task>(TaskCreationOptions.RunContinuationsAsynchronously);
            Post(() => started.SetResult(flow()));
            return started.Task.Unwrap();
        }

        public void Dispose()
        {
            work.CompleteAdding();
            thread.Join(TimeSpan.FromSeconds(10));
        }
    }

    private readonly struct SwitchAwaitable : INotifyCompletion
    {
        private readonly Loop loop;

        public SwitchAwaitable(Loop loop) => this.loop = loop;

        public SwitchAwaitable GetAwaiter() => this;

        public bool IsCompleted => false;

        public void OnCompleted(Action continuation) => loop.Post(continuation);

        public void GetResult()
        {
        }
    }

    private sealed record TwoHopResult(
        Exception? ZOnA, int RanWhenZDone, int RanWhileXInside, int Ran, Exception? XLeave, Exception? ZHome, bool Disposed);

    /// <summary>
    /// The probe's scenario (AwaitHopReleaseTests), deterministic: X enters on A and awaits on to B (the misuse); an action
    /// is registered that X's region holds back; Z enters on C, awaits on to A and there leaves (or refreshes, with
    /// <paramref name="refresh"/>). Then Z goes back to C and leaves its own region, and X goes back to A and leaves
    /// there (its flow, its thread): everything is released, and the epoch is disposed.
    /// </summary>
    private static TwoHopResult TwoHop(bool check, bool refresh)
    {
        using var a = new Loop("A");
        using var b = new Loop("B");
        using var c = new Loop("C");
        LightEpoch epoch = NewEpoch(check);
        int xInside = 0, ranWhileXInside = 0, ran = 0, ranWhenZDone = -1;
        Exception? zOnA = null, zHome = null, xLeave = null;
        using var xOnB = new ManualResetEventSlim();
        using var xMayLeave = new ManualResetEventSlim();

        Task x = a.Run(async () =>
        {
            epoch.Resume();
            Volatile.Write(ref xInside, 1);
            await b.SwitchTo(); // the misuse: an await inside a region
            xOnB.Set();
            xMayLeave.Wait(Timeout);
            await a.SwitchTo(); // back on the thread it entered on, to leave there
            Volatile.Write(ref xInside, 0);
            xLeave = Record.Exception(epoch.Suspend);
        });
        Assert.True(xOnB.Wait(Timeout));
        epoch.BumpCurrentEpoch(() =>
        {
            Interlocked.Increment(ref ran);
            if (Volatile.Read(ref xInside) != 0)
                Interlocked.Increment(ref ranWhileXInside);
        });
        Assert.Equal(0, Volatile.Read(ref ran)); // held back by A's slot (X's region)

        Task z = c.Run(async () =>
        {
            epoch.Resume();
            await a.SwitchTo(); // the misuse again: Z's continuation lands on A, where X's region is open
            zOnA = Record.Exception(refresh ? epoch.ProtectAndDrain : epoch.Suspend);
            await c.SwitchTo(); // back where Z entered: its own region is still open there
            zHome = Record.Exception(epoch.Suspend);
        });
        Assert.True(z.Wait(Timeout), "Z did not finish");
        ranWhenZDone = Volatile.Read(ref ran);
        xMayLeave.Set();
        Assert.True(x.Wait(Timeout), "X did not finish");
        bool disposed = epoch.TryDispose();
        return new TwoHopResult(zOnA, ranWhenZDone, Volatile.Read(ref ranWhileXInside), Volatile.Read(ref ran), xLeave, zHome, disposed);
    }

    [Fact]
    public void ALeaveOnTheThreadAnotherFlowsRegionIsOpenOn_IsRefused_AndThatRegionKeepsItsActionHeldBack()
    {
        TwoHopResult result = TwoHop(check: true, refresh: false);
        var refused = Assert.IsType<InvalidOperationException>(result.ZOnA);
        Assert.Contains("another async flow", refused.Message);
        Assert.Equal(0, result.RanWhenZDone); // X's region still holds it back after Z's refused Leave
        Assert.Null(result.ZHome); // Z's own region, left where it entered
        Assert.Null(result.XLeave); // X's region was left open for it
        Assert.Equal(1, result.Ran); // ran in X's Leave
        Assert.Equal(0, result.RanWhileXInside);
        Assert.True(result.Disposed, "a region is still open");
    }

    [Fact]
    public void ALeaveOnTheThreadAnotherFlowsRegionIsOpenOn_EndsThatRegion_Control()
    {
        // The control: an unchecked epoch (the default). Z's Leave on A ends X's region silently, the action X holds back
        // runs while X is inside it (G1), and only X's own Leave throws, afterwards (A is no longer protected).
        TwoHopResult result = TwoHop(check: false, refresh: false);
        Assert.Null(result.ZOnA);
        Assert.Equal(1, result.RanWhenZDone);
        Assert.Equal(1, result.RanWhileXInside);
        Assert.IsType<InvalidOperationException>(result.XLeave);
        Assert.Null(result.ZHome);
        Assert.True(result.Disposed);
    }

    [Fact]
    public void ARefreshOnTheThreadAnotherFlowsRegionIsOpenOn_IsRefused_AndThatRegionKeepsItsActionHeldBack()
    {
        TwoHopResult result = TwoHop(check: true, refresh: true);
        var refused = Assert.IsType<InvalidOperationException>(result.ZOnA);
        Assert.Contains("another async flow", refused.Message);
        Assert.Contains("Refresh", refused.Message);
        Assert.Equal(0, result.RanWhenZDone);
        Assert.Null(result.ZHome);
        Assert.Null(result.XLeave);
        Assert.Equal(1, result.Ran);
        Assert.Equal(0, result.RanWhileXInside);
        Assert.True(result.Disposed, "a region is still open");
    }

    [Fact]
    public void ARefreshOnTheThreadAnotherFlowsRegionIsOpenOn_MovesThatRegionOn_Control()
    {
        // The control: Z's refresh re-announces A's slot, which releases the action X's region holds back (G1).
        TwoHopResult result = TwoHop(check: false, refresh: true);
        Assert.Null(result.ZOnA);
        Assert.Equal(1, result.RanWhenZDone);
        Assert.Equal(1, result.RanWhileXInside);
        Assert.Null(result.XLeave); // A's region is still counted (re-announced): X's Leave ends it
        Assert.True(result.Disposed);
    }

    /// <summary>Flows that share one thread and hop between regions (never inside one): each region is entered, nested,
    /// refreshed and left by its own flow, while actions are registered and run. Nothing is refused.</summary>
    [Fact]
    public void RegionsBetweenAwaits_ManyFlowsOnOneThreadAndAcrossThreads_AreNeverRefused()
    {
        using var a = new Loop("A");
        LightEpoch epoch = NewEpoch(check: true);
        var faults = new ConcurrentQueue<Exception>();
        epoch.DeferredActionFailed += (_, e) => faults.Enqueue(e.Exception);
        int ran = 0;
        const int Flows = 4, Rounds = 200;

        async Task Flow(int which)
        {
            for (int i = 0; i < Rounds; i++)
            {
                epoch.Resume();
                epoch.Resume();
                epoch.ProtectAndDrain();
                epoch.Suspend();
                epoch.ProtectAndDrain(); // outermost: the region's own flow
                if (i % 8 == which)
                    epoch.BumpCurrentEpoch(() => Interlocked.Increment(ref ran)); // held back by this region
                epoch.Suspend();
                if (i % 5 == 0)
                {
                    await Task.Yield(); // off the thread between regions: a pool thread
                    epoch.Resume();
                    epoch.Suspend();
                    await a.SwitchTo();
                }
                else
                {
                    await a.SwitchTo(); // the next flow's turn on the same thread
                }
            }
        }

        var flows = new Task[Flows];
        for (int f = 0; f < Flows; f++)
        {
            int which = f;
            flows[f] = a.Run(() => Flow(which));
        }
        Assert.True(Task.WaitAll(flows, Timeout), "the flows did not finish");
        epoch.BumpCurrentEpoch(); // nobody is protected: runs what is left
        Assert.Empty(faults);
        Assert.Equal(Flows * (Rounds / 8), Volatile.Read(ref ran));
        epoch.Dispose();
    }

    private static async Task EnterAndLeaveInAnAsyncMethod(LightEpoch epoch)
    {
        // Completes synchronously: its AsyncLocal write does not flow back to its caller (the async method restores the
        // caller's ExecutionContext on return), so the caller's flow keeps its own marker.
        epoch.Resume();
        epoch.ProtectAndDrain();
        epoch.Suspend();
        await Task.CompletedTask;
    }

    /// <summary>Deferred actions run synchronously in the drain of whichever thread leaves, refreshes or bumps, on that
    /// thread's async flow: an action that enters and leaves (nested in the drainer's region, or outermost in an
    /// unprotected drain, directly or in an async method) is never refused, nor is the drainer's own Leave afterwards.</summary>
    [Fact]
    public void DeferredActionsThatEnterAndLeave_NestedOrOutermost_AreNeverRefused_NorIsTheDrainersLeave()
    {
        LightEpoch epoch = NewEpoch(check: true);
        var faults = new ConcurrentQueue<Exception>();
        epoch.DeferredActionFailed += (_, e) => faults.Enqueue(e.Exception);
        var depths = new List<int>();

        void Nested()
        {
            depths.Add(epoch.ProtectionDepth);
            epoch.Resume();
            epoch.Resume();
            epoch.ProtectAndDrain();
            epoch.Suspend();
            epoch.ProtectAndDrain();
            epoch.Suspend();
        }

        GuardedThread.Start(() =>
        {
            // A ProtectAndDrain inside the region runs the action at the region's level (its floor): the action nests.
            epoch.Resume();
            epoch.BumpCurrentEpoch(Nested);
            epoch.ProtectAndDrain();
            Assert.Single(depths);
            epoch.BumpCurrentEpoch(() => EnterAndLeaveInAnAsyncMethod(epoch).GetAwaiter().GetResult());
            epoch.ProtectAndDrain();
            epoch.ProtectAndDrain();

            // The region's Leave drains unprotected: the actions enter outermost (a fresh marker in this flow, or, in an
            // async method, one that does not flow back out).
            epoch.BumpCurrentEpoch(Nested);
            epoch.BumpCurrentEpoch(() => EnterAndLeaveInAnAsyncMethod(epoch).GetAwaiter().GetResult());
            epoch.Suspend();
            Assert.Equal(2, depths.Count);

            // And the thread's regions after such a drain are its own.
            epoch.Resume();
            epoch.BumpCurrentEpoch(Nested);
            epoch.Suspend();
            epoch.Resume();
            epoch.ProtectAndDrain();
            epoch.Suspend();
        }, "drainer").Join();

        Assert.Empty(faults);
        Assert.Equal(new[] { 1, 0, 0 }, depths);
        epoch.Dispose();
    }

    private static (Exception? Refresh, Exception? Hook, Exception? Leave) RefreshSteppingAsideWhileAnotherRegionEntersAndLeaves()
    {
        EpochProtectedVersionScheme scheme = NewScheme(check: true);
        LightEpoch epoch = scheme.Epoch;
        using var entered = new ManualResetEventSlim();
        using var go = new ManualResetEventSlim();
        using var aside = new ManualResetEventSlim();
        using var comeBack = new ManualResetEventSlim();
        using var holderIn = new ManualResetEventSlim();
        using var holderRefresh = new ManualResetEventSlim();
        Exception? refresh = null, hook = null, leave = null;
        scheme.AfterStepAsideHookForTesting = () =>
        {
            scheme.AfterStepAsideHookForTesting = null;
            // Stands for an action the stepped-aside thread runs in its wait: it enters and leaves, outermost (the thread
            // is unprotected while aside), in an async method, so its marker stays in the record and not in this flow.
            hook = Record.Exception(() => EnterAndLeaveInAnAsyncMethod(epoch).GetAwaiter().GetResult());
            aside.Set();
            comeBack.Wait(Timeout);
        };
        var region = GuardedThread.Start(() =>
        {
            scheme.Enter();
            entered.Set();
            go.Wait(Timeout);
            refresh = Record.Exception(() => scheme.Refresh());
            leave = Record.Exception(scheme.Leave);
        }, "region");
        Assert.True(entered.Wait(Timeout));
        var holder = GuardedThread.Start(() =>
        {
            scheme.Enter();
            holderIn.Set();
            holderRefresh.Wait(Timeout);
            scheme.Refresh(); // lets the transition through
            scheme.Leave();
        }, "holder");
        Assert.True(holderIn.Wait(Timeout));
        Assert.Equal(StateMachineExecutionStatus.Ok, scheme.TryAdvanceVersionWithCriticalSection((_, _) => { }));
        go.Set();
        Assert.True(aside.Wait(Timeout), "the Refresh never stepped aside");
        holderRefresh.Set();
        holder.Join();
        comeBack.Set();
        region.Join();
        Assert.Equal(2, scheme.CurrentState.Version);
        if (leave is null)
            scheme.Dispose();
        return (refresh, hook, leave);
    }

    /// <summary>A scheme's outermost Refresh steps aside while a transition waits for another region, and comes back in the
    /// same call (no fresh marker): an action that entered and left meanwhile on that thread must not make the region's
    /// Leave look foreign.</summary>
    [Fact]
    public void ARefreshThatSteppedAsideWhileAnActionEnteredAndLeft_KeepsItsRegionsFlow()
    {
        (Exception? refresh, Exception? hook, Exception? leave) = RefreshSteppingAsideWhileAnotherRegionEntersAndLeaves();
        Assert.Null(refresh);
        Assert.Null(hook);
        Assert.Null(leave);
    }

    [Fact]
    public void ARefreshThatSteppedAsideWhileAnActionEnteredAndLeft_KeepsItsRegionsFlow_Control()
    {
        // The control: coming back keeps the marker the action's outermost entry wrote into the record; the region's own
        // Leave is then refused (a false positive). The region stays open, so the scheme is not disposed.
        LightEpoch.StaleFlowAfterStepAsideForTesting = true;
        try
        {
            (Exception? refresh, Exception? hook, Exception? leave) = RefreshSteppingAsideWhileAnotherRegionEntersAndLeaves();
            Assert.Null(refresh);
            Assert.Null(hook);
            Assert.IsType<InvalidOperationException>(leave);
        }
        finally
        {
            LightEpoch.StaleFlowAfterStepAsideForTesting = false;
        }
    }

    /// <summary>Schemes with the check on: regions that enter, nest, refresh and leave (on threads, and in async flows that
    /// hop between regions) while transitions run one after the other; Refresh steps aside and comes back, Enter leaves
    /// and enters again. Nothing is refused.</summary>
    [Fact]
    public void SchemeRegionsWithStateMachinesRunning_AreNeverRefused()
    {
        using EpochProtectedVersionScheme scheme = NewScheme(check: true);
        var faults = new ConcurrentQueue<Exception>();
        scheme.Epoch.DeferredActionFailed += (_, e) => faults.Enqueue(e.Exception);
        int stop = 0;
        var workers = new GuardedThread[2];
        for (int w = 0; w < workers.Length; w++)
        {
            workers[w] = GuardedThread.Start(() =>
            {
                while (Volatile.Read(ref stop) == 0)
                {
                    scheme.Enter();
                    scheme.Refresh();
                    scheme.Enter();
                    scheme.Refresh();
                    scheme.Leave();
                    scheme.Refresh();
                    scheme.Leave();
                }
            }, $"worker {w}");
        }

        async Task Hopping()
        {
            while (Volatile.Read(ref stop) == 0)
            {
                scheme.Enter();
                scheme.Refresh();
                scheme.Leave();
                await Task.Yield();
            }
        }

        Task hopping = Task.Run(Hopping);
        const int Transitions = 40;
        for (int i = 0; i < Transitions; i++)
            Assert.True(scheme.AdvanceVersionWithCriticalSection((_, _) => { }));
        Volatile.Write(ref stop, 1);
        foreach (GuardedThread worker in workers)
            worker.Join();
        Assert.True(hopping.Wait(Timeout));
        Assert.Empty(faults);
        Assert.Equal(1 + Transitions, scheme.CurrentState.Version);
    }

    /// <summary>
    /// A known limit of the check, documented: an async method restores its caller's ExecutionContext when it returns,
    /// even synchronously, so a region entered inside an async method and left by its caller (same thread, no await in
    /// between, which is correct use) is taken for another flow's and refused. Enter and leave in the same method, or in
    /// synchronous helpers.
    /// </summary>
    [Fact]
    public void ARegionEnteredInAnAsyncMethodAndLeftByItsCaller_IsRefused_AKnownLimitOfTheCheck()
    {
        LightEpoch epoch = NewEpoch(check: true);
        Exception? leave = null;
        bool protectedAfter = false;

        static async Task EnterInAnAsyncMethod(LightEpoch epoch)
        {
            epoch.Resume();
            await Task.CompletedTask;
        }

        GuardedThread.Start(() =>
        {
            EnterInAnAsyncMethod(epoch).GetAwaiter().GetResult();
            leave = Record.Exception(epoch.Suspend);
            protectedAfter = epoch.ThisInstanceProtected();
        }, "region").Join(); // the thread exits inside its region: the epoch cannot be disposed
        Assert.IsType<InvalidOperationException>(leave);
        Assert.True(protectedAfter);
    }
}
