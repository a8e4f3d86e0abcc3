using System;
using System.Threading;
using System.Threading.Tasks;
using Xunit;

namespace Epvs.Tests;

/// <summary>Issue 11: an awaitable way to run one critical section.</summary>
public sealed class AdvanceVersionAsyncTests
{
    private static readonly TimeSpan Bound = TimeSpan.FromSeconds(30);

    [Fact]
    public async Task AdvanceVersionAsync_RunsTheCriticalSectionOnceAndCompletesAfterTheTransition()
    {
        using var scheme = new EpochProtectedVersionScheme();
        long start = scheme.CurrentState.Version;
        int runs = 0;
        (long From, long To) seen = default;
        bool advanced = await scheme.AdvanceVersionAsync((from, to) => { runs++; seen = (from, to); }).WaitAsync(Bound);

        Assert.True(advanced);
        Assert.Equal(1, runs);
        Assert.Equal((start, start + 1), seen);
        Assert.Equal(VersionSchemeState.Make(VersionSchemeState.Rest, start + 1), scheme.CurrentState);
    }

    [Fact]
    public async Task AdvanceVersionAsync_TargetAlreadyReached_ReturnsFalseWithoutRunning()
    {
        using var scheme = new EpochProtectedVersionScheme();
        bool ran = false;
        Assert.False(await scheme.AdvanceVersionAsync((_, _) => ran = true, scheme.CurrentState.Version).WaitAsync(Bound));
        Assert.False(ran);
    }

    [Fact]
    public async Task AdvanceVersionAsync_ThrowingCriticalSection_FaultsTheTaskAndLeavesTheSchemeUsable()
    {
        using var scheme = new EpochProtectedVersionScheme();
        VersionSchemeState before = scheme.CurrentState;
        var boom = new InvalidOperationException("boom");
        InvalidOperationException thrown = await Assert.ThrowsAsync<InvalidOperationException>(() => scheme.AdvanceVersionAsync((_, _) => throw boom).WaitAsync(Bound));
        Assert.Same(boom, thrown);
        Assert.Equal(before, scheme.CurrentState);

        Assert.True(await scheme.AdvanceVersionAsync((_, _) => { }).WaitAsync(Bound));
        Assert.Equal(before.Version + 1, scheme.CurrentState.Version);
    }

    /// <summary>
    /// A probe's finding: a critical section that threw OperationCanceledException (honouring a token of its own, say)
    /// made the task Canceled with no exception, as if the transition had never started: the async method rethrew the
    /// machine's fault and the async builder turned it into a cancellation. It faults the task, as any exception does,
    /// and as the machine's own Completion does; a cancellation whose transition did start stays distinguishable.
    /// </summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public async Task AdvanceVersionAsync_CriticalSectionThrowingOperationCanceled_FaultsTheTask(bool waitsForAnotherMachine)
    {
        using var scheme = new EpochProtectedVersionScheme();
        VersionSchemeState before = scheme.CurrentState;
        var thrown = new OperationCanceledException("the critical section gave up");
        Task<bool> advance;
        if (waitsForAnotherMachine)
        {
            // Asynchronously: the call first waits for a transition held back by a protected thread.
            long target = before.Version + 2;
            advance = await StartWhileAnotherMachineIsHeldBack(scheme, () => scheme.AdvanceVersionAsync((_, _) => throw thrown, target));

            // The other machine moved the version on by one. (Read from the scheme, this raced the call's own step,
            // which may have published its intermediate state by then: one failure in a loaded full run.)
            before = VersionSchemeState.Make(VersionSchemeState.Rest, before.Version + 1);
        }
        else
        {
            advance = scheme.AdvanceVersionAsync((_, _) => throw thrown);
        }

        Exception? failure = await Record.ExceptionAsync(() => advance.WaitAsync(Bound));
        Assert.True(advance.IsFaulted, $"the task is {advance.Status}");
        Assert.Same(thrown, failure);
        Assert.Same(thrown, advance.Exception!.InnerException);
        Assert.Equal(before, scheme.CurrentState); // the section ran and failed: the version is unchanged
    }

    /// <summary>
    /// A review's finding: the caller's cancellation surfaced as a new TaskCanceledException ("A task was canceled.")
    /// once the task became a TaskCompletionSource's; it is the OperationCanceledException the call threw, as before.
    /// </summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public async Task AdvanceVersionAsync_CancelledBeforeStarting_ThrowsTheTokensOwnOperationCanceledException(bool whileWaiting)
    {
        using var scheme = new EpochProtectedVersionScheme();
        using var cts = new CancellationTokenSource();
        Task<bool> advance;
        if (whileWaiting)
        {
            // Cancelled while it waits for another machine, held back by a protected thread.
            long target = scheme.CurrentState.Version + 2;
            advance = await StartWhileAnotherMachineIsHeldBack(
                scheme,
                () => scheme.AdvanceVersionAsync((_, _) => { }, target, cts.Token),
                async waiting =>
                {
                    cts.Cancel();
                    await Record.ExceptionAsync(() => waiting.WaitAsync(Bound));
                });
        }
        else
        {
            cts.Cancel();
            advance = scheme.AdvanceVersionAsync((_, _) => { }, cancellationToken: cts.Token);
        }

        Exception? e = await Record.ExceptionAsync(() => advance);
        Assert.True(advance.IsCanceled);
        var canceled = Assert.IsAssignableFrom<OperationCanceledException>(e);
        Assert.Equal(cts.Token, canceled.CancellationToken);
        Assert.IsType<OperationCanceledException>(e, exactMatch: true);
    }

    /// <summary>
    /// Calls <paramref name="start"/> while another machine's transition is held back by a protected thread (so the call
    /// waits for that machine), runs <paramref name="whileWaiting"/>, then lets the other machine complete. Returns the
    /// call's task.
    /// </summary>
    private static async Task<Task<bool>> StartWhileAnotherMachineIsHeldBack(EpochProtectedVersionScheme scheme, Func<Task<bool>> start, Func<Task<bool>, Task>? whileWaiting = null)
    {
        using var entered = new ManualResetEventSlim();
        using var release = new ManualResetEventSlim();
        var holder = new Thread(() =>
        {
            scheme.Enter();
            entered.Set();
            release.Wait();
            scheme.Leave();
        });
        holder.Start();
        entered.Wait();
        Task<bool> first = scheme.AdvanceVersionAsync((_, _) => { });
        Task<bool> advance = start();
        Assert.False(advance.IsCompleted);
        if (whileWaiting is not null)
        {
            await whileWaiting(advance);
        }

        release.Set();
        holder.Join();
        Assert.True(await first.WaitAsync(Bound));
        return advance;
    }

    [Fact]
    public void AdvanceVersionAsync_AtMaxVersion_FaultsTheTaskWithInvalidOperation()
    {
        // As documented: the refusal comes from the transition's start, inside the task (the call itself returns).
        using var scheme = new EpochProtectedVersionScheme(null, VersionSchemeState.MaxVersion);
        Task<bool> advance = scheme.AdvanceVersionAsync((_, _) => { });
        Assert.True(advance.IsFaulted);
        Assert.IsType<InvalidOperationException>(advance.Exception!.InnerException);
        Assert.Equal(VersionSchemeState.MaxVersion, scheme.CurrentState.Version);
    }

    [Fact]
    public void AdvanceVersionAsync_InsideAProtectedRegion_ThrowsInvalidOperation()
    {
        using var scheme = new EpochProtectedVersionScheme();
        scheme.Enter();
        try
        {
            Assert.Throws<InvalidOperationException>(() => { _ = scheme.AdvanceVersionAsync((_, _) => { }); });
        }
        finally
        {
            scheme.Leave();
        }
    }

    [Fact]
    public async Task AdvanceVersionAsync_WhileAnotherThreadIsProtected_CompletesOnlyAfterItLeaves()
    {
        using var scheme = new EpochProtectedVersionScheme();
        using var entered = new ManualResetEventSlim();
        using var release = new ManualResetEventSlim();
        var reader = new Thread(() =>
        {
            scheme.Enter();
            entered.Set();
            release.Wait(Bound);
            scheme.Leave();
        });
        reader.Start();
        Assert.True(entered.Wait(Bound));

        int runs = 0;
        Task<bool> advance = scheme.AdvanceVersionAsync((_, _) => Interlocked.Increment(ref runs));
        Assert.False(advance.IsCompleted, "the transition completed while a reader of the old version was still inside");
        Assert.Equal(0, Volatile.Read(ref runs));

        release.Set();
        Assert.True(await advance.WaitAsync(Bound));
        Assert.Equal(1, runs);
        Assert.True(reader.Join(Bound));
    }

    [Fact]
    public async Task AdvanceVersionAsync_CancelledBeforeStarting_Throws()
    {
        using var scheme = new EpochProtectedVersionScheme();
        using var cts = new CancellationTokenSource();
        cts.Cancel();
        await Assert.ThrowsAnyAsync<OperationCanceledException>(() => scheme.AdvanceVersionAsync((_, _) => { }, cancellationToken: cts.Token));
    }

    /// <summary>
    /// A Dispose of the scheme holds the machine slot (held here in its epoch's closing hook, where it has not decided yet)
    /// when <see cref="EpochProtectedVersionScheme.AdvanceVersionAsync"/> tries to start. Returns how many attempts the
    /// call made before it either waited for the Dispose to end or reached 1,000 attempts (a busy loop), and whether it
    /// waited; then lets the Dispose end (refused while a thread is protected, else completed) and checks the outcome.
    /// </summary>
    private static (int Attempts, bool Waited) AdvanceWhileADisposeIsHeld(bool refused, bool control)
    {
        var scheme = new EpochProtectedVersionScheme { YieldWhileDisposingForTesting = control };
        using var inClosing = new ManualResetEventSlim();
        using var release = new ManualResetEventSlim();
        using var settled = new ManualResetEventSlim();
        int attempts = 0;
        bool waited = false;
        scheme.Epoch.ClosingHookForTesting = () =>
        {
            inClosing.Set();
            Assert.True(release.Wait(Bound));
        };
        scheme.AsyncRetryHookForTesting = () =>
        {
            if (Interlocked.Increment(ref attempts) >= 1000)
                settled.Set();
        };
        scheme.AsyncWaitsForDisposeHookForTesting = () =>
        {
            Volatile.Write(ref waited, true);
            settled.Set();
        };
        // A protected thread makes the Dispose refused once it decides (the scheme stays usable).
        using var parked = refused ? new ParkedThread(() => scheme.Enter(), scheme.Leave) : null;
        var disposer = GuardedThread.Start(() => Assert.Equal(refused, Record.Exception(scheme.Dispose) is InvalidOperationException), "disposer");
        Assert.True(inClosing.Wait(Bound));

        Task<bool> advance = scheme.AdvanceVersionAsync((_, _) => { });
        Assert.True(settled.Wait(Bound), "the start neither waited nor kept trying");
        int attemptsWhileHeld = Volatile.Read(ref attempts);

        release.Set();
        disposer.Join();
        scheme.Epoch.ClosingHookForTesting = null;
        scheme.AsyncRetryHookForTesting = null;
        if (refused)
        {
            parked!.Release();
            Assert.True(advance.Wait(Bound));
            Assert.True(advance.Result);
            Assert.Equal(2, scheme.CurrentState.Version);
            scheme.Dispose();
        }
        else
        {
            // Woken by the end of the Dispose, the start finds the scheme disposed.
            Assert.True(((IAsyncResult)advance).AsyncWaitHandle.WaitOne(Bound));
            Assert.IsType<ObjectDisposedException>(advance.Exception?.InnerException);
        }
        return (attemptsWhileHeld, Volatile.Read(ref waited));
    }

    /// <summary>
    /// While a Dispose held the machine slot, the start saw no active machine to wait for and tried again after a yield,
    /// for as long as the Dispose took (the epoch's final run of user actions, a wait for another Dispose): a thread-pool
    /// thread at full speed. It now awaits the end of that Dispose.
    /// </summary>
    [Theory]
    [InlineData(true)]
    [InlineData(false)]
    public void AdvanceVersionAsync_WhileADisposeHoldsTheMachineSlot_WaitsForItToEnd_InsteadOfTryingAgainAndAgain(bool disposeRefused)
    {
        (int attempts, bool waited) = AdvanceWhileADisposeIsHeld(disposeRefused, control: false);
        Assert.True(waited, $"the start made {attempts} attempts while the Dispose held the slot, without waiting for it");
        Assert.Equal(1, attempts);
        (int controlAttempts, bool controlWaited) = AdvanceWhileADisposeIsHeld(disposeRefused, control: true);
        Assert.SkipWhen(controlWaited || controlAttempts < 1000, $"inconclusive: the control (yield and retry) made {controlAttempts} attempts");
    }
}
