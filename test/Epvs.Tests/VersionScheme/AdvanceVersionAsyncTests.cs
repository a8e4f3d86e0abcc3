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
}
