using System;
using System.Collections.Generic;
using System.Diagnostics.Metrics;
using System.Threading;
using System.Threading.Tasks;
using Xunit;

namespace Epvs.Tests;

/// <summary>What a user debugging a stall can see: stalled-transition events, blocking threads, metrics.</summary>
public class DiagnosticsTests
{
    [Fact]
    public void TransitionStalled_ParkedReader_IsNamedAsTheBlockingThread()
    {
        using var scheme = new EpochProtectedVersionScheme { StallThreshold = TimeSpan.FromMilliseconds(20) };
        var stalled = new TaskCompletionSource<TransitionStalledEventArgs>();
        int raised = 0;
        scheme.TransitionStalled += (_, e) =>
        {
            Interlocked.Increment(ref raised);
            stalled.TrySetResult(e);
        };
        // A step before the stalled one: the stall must be timed from its own step's start.
        scheme.AdvanceVersionWithCriticalSection((_, _) => { }, spin: true);
        var parked = new ParkedThread(() => scheme.Enter(), scheme.Leave);

        var sinceRequest = System.Diagnostics.Stopwatch.StartNew();
        var requester = GuardedThread.Start(() => scheme.AdvanceVersionWithCriticalSection((_, _) => { }, spin: true));
        Assert.True(stalled.Task.Wait(GuardedThread.DefaultTimeout), "no stall reported");
        TimeSpan upperBound = sinceRequest.Elapsed;
        TransitionStalledEventArgs e = stalled.Task.Result;
        Assert.Equal(VersionSchemeState.Make(VersionSchemeState.Rest, 2), e.FromState);
        Assert.True(e.Elapsed >= TimeSpan.FromMilliseconds(20));
        // Not more than the step can have lasted (with a tick of the coarse clock to spare).
        Assert.True(e.Elapsed <= upperBound + TimeSpan.FromMilliseconds(20), $"stall reported {e.Elapsed} after the step began, but the step is at most {upperBound} old");
        Assert.Equal(parked.ManagedThreadId, Assert.Single(e.BlockingThreads).ManagedThreadId);
        Assert.Equal(parked.ManagedThreadId, Assert.Single(scheme.GetThreadsBlockingTransition()).ManagedThreadId);

        parked.Release();
        requester.Join();
        Assert.Equal(1, raised); // once per step
        Assert.Empty(scheme.GetThreadsBlockingTransition());
    }

    /// <summary>
    /// Only threads blocked in a wait reported stalls, so a step held back by a parked reader and awaited through
    /// <see cref="EpochProtectedVersionScheme.AdvanceVersionAsync"/> (the awaitable form, with no thread blocked) was never
    /// reported, neither by the event nor by the counter. The awaiting call now checks every threshold while it waits.
    /// </summary>
    [Fact]
    public void TransitionStalled_WhenTheRequesterAwaitsAdvanceVersionAsync_IsRaised_NamingTheReader()
    {
        var scheme = new EpochProtectedVersionScheme { StallThreshold = TimeSpan.FromMilliseconds(20) };
        var stalled = new TaskCompletionSource<TransitionStalledEventArgs>(TaskCreationOptions.RunContinuationsAsynchronously);
        scheme.TransitionStalled += (_, e) => stalled.TrySetResult(e);
        var parked = new ParkedThread(() => scheme.Enter(), scheme.Leave);

        Task<bool> advance = scheme.AdvanceVersionAsync((_, _) => { });
        // Nobody else waits: the awaiting call must report. Bounded below the parked thread's own bound, which would hide
        // the failure.
        bool raised = stalled.Task.Wait(GuardedThread.DefaultTimeout / 2);
        parked.Release();
        Assert.True(advance.Wait(GuardedThread.DefaultTimeout));
        Assert.True(advance.Result);
        scheme.Dispose();

        Assert.True(raised, "a step held back by a parked reader and awaited through AdvanceVersionAsync was never reported");
        Assert.Equal(VersionSchemeState.Make(VersionSchemeState.Rest, 1), stalled.Task.Result.FromState);
        Assert.Equal(parked.ManagedThreadId, Assert.Single(stalled.Task.Result.BlockingThreads).ManagedThreadId);
    }

    /// <summary>
    /// A waiter found step 1 overdue; before it claimed the step's report, step 1 completed and step 2 began. Its claim used
    /// up step 2's once-per-step flag (reset when step 2 began): the report paired step 1's elapsed time with step 2's
    /// state, and step 2, stalled for real, was never reported. The claim is now keyed to the step it timed.
    /// </summary>
    [Fact]
    public void TransitionStalled_AStaleCheckOfTheStepBefore_NeitherMixesTheStepsNorUsesUpTheNextStepsReport()
    {
        var scheme = new EpochProtectedVersionScheme { StallThreshold = TimeSpan.FromMilliseconds(20) };
        var reports = new List<VersionSchemeState>();
        using var secondReported = new ManualResetEventSlim();
        scheme.TransitionStalled += (_, e) =>
        {
            lock (reports)
            {
                reports.Add(e.FromState);
                if (reports.Count == 2)
                    secondReported.Set();
            }
        };
        var machine = new PhaseMachine(3); // REST(1) -> 1(1) -> 2(1) -> REST(2)
        machine.HoldStep(1);
        var first = new ParkedThread(() => scheme.Enter(), scheme.Leave); // holds step 1 back
        ParkedThread? second = null;
        Assert.Equal(StateMachineExecutionStatus.Ok, scheme.TryExecuteStateMachine(machine));

        // The waiter finds step 1 overdue; before its claim, step 1 completes and step 2 begins, held back by another reader.
        scheme.StallDueHookForTesting = () =>
        {
            scheme.StallDueHookForTesting = null;
            first.Release(); // its Leave runs step 1's critical section
            second = new ParkedThread(() => scheme.Enter(), scheme.Leave);
            machine.ReleaseStep();
            scheme.SignalStepAvailable(); // step 2 begins
            Assert.True(scheme.CurrentState.IsIntermediate);
        };
        var waiter = GuardedThread.Start(() => scheme.AdvanceVersionWithCriticalSection((_, _) => { }, spin: true), "waiter");

        bool reported = secondReported.Wait(GuardedThread.DefaultTimeout);
        second?.Release();
        waiter.Join();
        scheme.Dispose();
        lock (reports)
        {
            Assert.True(reported, $"step 2 was never reported (reports: {string.Join(", ", reports)})");
            Assert.Equal([VersionSchemeState.Make(VersionSchemeState.Rest, 1), VersionSchemeState.Make(1, 1)], reports);
        }
    }

    [Fact]
    public void Metrics_TransitionsAndFaults_ArePublishedUnderTheEpvsMeter()
    {
        var seen = new Dictionary<string, double>();
        using var listener = new MeterListener();
        listener.InstrumentPublished = (instrument, l) =>
        {
            if (instrument.Meter.Name == "Epvs")
                l.EnableMeasurementEvents(instrument);
        };
        listener.SetMeasurementEventCallback<long>((instrument, value, _, _) =>
        {
            lock (seen)
                seen[instrument.Name] = seen.GetValueOrDefault(instrument.Name) + value;
        });
        listener.SetMeasurementEventCallback<double>((instrument, value, _, _) =>
        {
            lock (seen)
                seen[instrument.Name] = seen.GetValueOrDefault(instrument.Name) + 1;
        });
        listener.Start();

        using var scheme = new EpochProtectedVersionScheme();
        for (int i = 0; i < 3; i++)
            scheme.AdvanceVersionWithCriticalSection((_, _) => { }, spin: true);
        Assert.ThrowsAny<Exception>(() => scheme.AdvanceVersionWithCriticalSection((_, _) => throw new InvalidOperationException(), spin: true));
        scheme.Epoch.BumpCurrentEpoch(() => throw new InvalidOperationException());

        lock (seen)
        {
            Assert.True(seen.GetValueOrDefault("epvs.transitions") >= 3);
            Assert.True(seen.GetValueOrDefault("epvs.transition.duration") >= 3);
            Assert.True(seen.GetValueOrDefault("epvs.transition.faults") >= 1);
            Assert.True(seen.GetValueOrDefault("epvs.epoch.action_faults") >= 1);
        }
    }
}
