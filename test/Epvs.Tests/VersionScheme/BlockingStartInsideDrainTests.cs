using System;
using System.Threading;
using Xunit;

namespace Epvs.Tests;

/// <summary>
/// G4 for blocking starts made from inside a drain: a deferred action (or a DeferredActionFailed handler, or a callback of
/// another scheme on the same epoch) that calls <see cref="EpochProtectedVersionScheme.AdvanceVersionWithCriticalSection"/>
/// while another machine is active must see that machine end, even when its next step is queued behind the calling action
/// in the drain that runs it and nobody else ever drains. (The blocking start's retry loop used to only spin: the calling
/// thread spun for ever with the scheme intermediate.)
/// </summary>
public class BlockingStartInsideDrainTests
{
    private readonly ITestOutputHelper output;

    public BlockingStartInsideDrainTests(ITestOutputHelper output) => this.output = output;

    public enum Caller
    {
        /// <summary>A deferred action calls the blocking start.</summary>
        DeferredAction,

        /// <summary>A deferred action calls the blocking start with spin: true.</summary>
        DeferredActionSpinning,

        /// <summary>A deferred action throws; the epoch's DeferredActionFailed handler calls the blocking start.</summary>
        FaultHandler,

        /// <summary>The critical section of another scheme on the same epoch calls the blocking start.</summary>
        OtherSchemesCriticalSection,
    }

    private sealed class Boom : Exception
    {
        public Boom()
            : base("deferred action failed on purpose")
        {
        }
    }

    /// <summary>
    /// Thread L, protected, queues a callback that will make the blocking start; then this thread starts machine M, whose
    /// step waits for L and so is queued behind the callback. L leaves: its drain runs the callback, which finds M active.
    /// Nobody else calls anything until L has finished (at most <paramref name="wait"/>). Returns null if L's Leave returned
    /// in time, else what stayed stuck; either way it then unsticks L (draining from this thread) and checks that both
    /// transitions happened exactly once. Deterministic: the drain list runs L's callback (registered first) before M's step.
    /// </summary>
    private string? BlockingStartBehindQueuedStep(Caller caller, bool control, TimeSpan wait)
    {
        var scheme = new EpochProtectedVersionScheme { RetryWithoutProgressForTesting = control };
        EpochProtectedVersionScheme? other = caller == Caller.OtherSchemesCriticalSection ? new EpochProtectedVersionScheme(scheme.Epoch) : null;
        int criticalSections = 0;
        int blockingStartReturned = 0;
        bool? blockingStartResult = null;
        Exception? blockingStartFailure = null;

        // Never asserts: it runs inside a drain, which would report an exception to the epoch, not to the test.
        void BlockingStart()
        {
            try
            {
                blockingStartResult = scheme.AdvanceVersionWithCriticalSection(
                    (_, _) => Interlocked.Increment(ref criticalSections), spin: caller == Caller.DeferredActionSpinning);
            }
            catch (Exception ex)
            {
                blockingStartFailure = ex;
            }
            Volatile.Write(ref blockingStartReturned, 1);
        }

        StateMachineExecutionStatus otherStatus = StateMachineExecutionStatus.Ok;
        using var queued = new ManualResetEventSlim();
        using var leave = new ManualResetEventSlim();
        var leaver = GuardedThread.Start(() =>
        {
            scheme.Enter();
            switch (caller)
            {
                case Caller.DeferredAction:
                case Caller.DeferredActionSpinning:
                    scheme.Epoch.BumpCurrentEpoch(BlockingStart);
                    break;
                case Caller.FaultHandler:
                    scheme.Epoch.DeferredActionFailed += (_, _) => BlockingStart();
                    scheme.Epoch.BumpCurrentEpoch(() => throw new Boom());
                    break;
                case Caller.OtherSchemesCriticalSection:
                    // Under protection: its critical section waits until we leave (G5).
                    otherStatus = other!.TryAdvanceVersionWithCriticalSection((_, _) => BlockingStart());
                    break;
            }
            queued.Set();
            Assert.True(leave.Wait(GuardedThread.DefaultTimeout), "never told to leave");
            scheme.Leave(); // its drain runs the callback above, which makes the blocking start
        }, "leaver");
        Assert.True(queued.Wait(GuardedThread.DefaultTimeout), "the leaver never queued its callback");
        Assert.Equal(StateMachineExecutionStatus.Ok, otherStatus);

        // M: its step waits for the leaver, and is queued behind the leaver's callback.
        Assert.Equal(StateMachineExecutionStatus.Ok, scheme.TryAdvanceVersionWithCriticalSection((_, _) => Interlocked.Increment(ref criticalSections)));
        Assert.Equal(VersionSchemeState.MakeIntermediate(VersionSchemeState.Make(VersionSchemeState.Rest, 1)), scheme.CurrentState);
        leave.Set();

        string? stuck = null;
        if (!leaver.TryJoin(wait))
        {
            stuck = $"{caller}: the blocking start did not return within {wait.TotalMilliseconds:0} ms " +
                $"(returned {Volatile.Read(ref blockingStartReturned)}, state {scheme.CurrentState})";
            // Unstick: drain from this thread (M's step, then whatever the control's spin waits for).
            Assert.True(
                Bounded.TryWaitUntil(() => { scheme.Epoch.BumpCurrentEpoch(); return leaver.TryJoin(TimeSpan.FromMilliseconds(10)); }, GuardedThread.DefaultTimeout),
                $"{caller}: the leaver stayed stuck even with this thread draining");
        }
        output.WriteLine($"{caller}, control {control}: {stuck ?? "returned"}");

        Assert.Null(blockingStartFailure);
        Assert.True(blockingStartResult, $"{caller}: the blocking start returned {blockingStartResult?.ToString() ?? "nothing"}");
        // Without spin the blocking start's own step may still be in flight: it needs nobody (no one is protected).
        Assert.True(Bounded.TryWaitUntil(() => scheme.ActiveStateMachine is null, GuardedThread.DefaultTimeout), $"{caller}: a machine never ended");
        Assert.Equal(2, Volatile.Read(ref criticalSections));
        Assert.Equal(VersionSchemeState.Make(VersionSchemeState.Rest, 3), scheme.CurrentState);
        if (other is not null)
        {
            Assert.Equal(VersionSchemeState.Make(VersionSchemeState.Rest, 2), other.CurrentState);
            other.Dispose();
        }
        scheme.Dispose();
        return stuck;
    }

    [Theory]
    [InlineData(Caller.DeferredAction)]
    [InlineData(Caller.DeferredActionSpinning)]
    [InlineData(Caller.FaultHandler)]
    [InlineData(Caller.OtherSchemesCriticalSection)]
    public void BlockingStart_FromInsideADrainWithTheActiveStepQueuedBehindIt_ReturnsWithNoFurtherCalls(Caller caller)
    {
        Assert.Null(BlockingStartBehindQueuedStep(caller, control: false, GuardedThread.DefaultTimeout));
    }

    [Theory]
    [InlineData(Caller.DeferredAction)]
    [InlineData(Caller.DeferredActionSpinning)]
    [InlineData(Caller.FaultHandler)]
    [InlineData(Caller.OtherSchemesCriticalSection)]
    public void BlockingStart_RetryingWithoutProgress_IsCaught_Control(Caller caller)
    {
        // The control: the retry loop only spins (as before), so the step it waits for stays queued behind it.
        string? stuck = BlockingStartBehindQueuedStep(caller, control: true, TimeSpan.FromSeconds(1));
        Assert.True(stuck is not null, "INCONCLUSIVE: the control (a retry loop that only spins) returned; the check proves nothing on this run.");
    }

    /// <summary>
    /// On one thread, nests <paramref name="nesting"/> drains (each action registers the next); the deepest action starts
    /// machine M (its step is left to the outermost drain, further up this stack, if the drain is too deep to run it
    /// inline) and then makes a blocking start, which finds M active. Returns whether M's step was left pending (the
    /// interesting case) and what stayed stuck (null: the thread finished within <paramref name="wait"/>); unsticks it.
    /// </summary>
    private static (bool Deep, string? Stuck) BlockingStartDeepInsideDrains(int nesting, bool spin, bool control, TimeSpan wait)
    {
        var scheme = new EpochProtectedVersionScheme();
        int criticalSections = 0;
        StateMachineExecutionStatus started = StateMachineExecutionStatus.Fail;
        bool deep = false;
        bool? result = null;
        Exception? failure = null;

        // Never asserts inside the actions: an exception there goes to the epoch's DeferredActionFailed, not to the test.
        void Deepest()
        {
            try
            {
                started = scheme.TryAdvanceVersionWithCriticalSection((_, _) => Interlocked.Increment(ref criticalSections));
                deep = scheme.CurrentState.IsIntermediate;
                result = scheme.AdvanceVersionWithCriticalSection((_, _) => Interlocked.Increment(ref criticalSections), spin: spin);
            }
            catch (Exception ex)
            {
                failure = ex;
            }
        }

        LightEpoch.WaitingDrainHonoursDepthLimitForTesting = control;
        string? stuck = StuckDrain.RunThenUnstick(
            scheme.Epoch,
            () => StuckDrain.AtDrainDepth(scheme.Epoch, nesting, Deepest),
            "nested drains",
            wait,
            () => $"nesting {nesting}, spin {spin}: the blocking start did not return within {wait.TotalMilliseconds:0} ms (state {scheme.CurrentState})",
            () => LightEpoch.WaitingDrainHonoursDepthLimitForTesting = false);

        Assert.Null(failure);
        Assert.Equal(StateMachineExecutionStatus.Ok, started);
        Assert.True(result, $"nesting {nesting}: the blocking start returned {result?.ToString() ?? "nothing"}");
        Assert.True(Bounded.TryWaitUntil(() => scheme.ActiveStateMachine is null, GuardedThread.DefaultTimeout), "a machine never ended");
        Assert.Equal(2, Volatile.Read(ref criticalSections));
        Assert.Equal(VersionSchemeState.Make(VersionSchemeState.Rest, 3), scheme.CurrentState);
        scheme.Dispose();
        return (deep, stuck);
    }

    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void BlockingStart_DeeperInsideDrainsThanTheInlineLimit_Returns(bool spin)
    {
        bool anyDeep = false;
        bool controlCaught = true;
        for (int nesting = 12; nesting <= 20; nesting++) // around the inline limit (16), wherever it is counted from
        {
            (bool deep, string? stuck) = BlockingStartDeepInsideDrains(nesting, spin, control: false, GuardedThread.DefaultTimeout);
            Assert.Null(stuck);
            if (!deep)
                continue;
            anyDeep = true;
            // The control: the waiting drain stops at the inline limit like any other (as before).
            (_, string? controlStuck) = BlockingStartDeepInsideDrains(nesting, spin, control: true, TimeSpan.FromSeconds(1));
            output.WriteLine($"nesting {nesting}: M's step left to the outermost drain; control: {controlStuck ?? "returned"}");
            controlCaught &= controlStuck is not null;
        }
        Assert.SkipUnless(anyDeep, "inconclusive: no nesting left the active machine's step to the outermost drain");
        Assert.SkipUnless(controlCaught, "inconclusive: the control (a waiting drain that stops at the inline limit) returned");
    }
}
