using System;
using Xunit;

namespace Epvs.Tests;

/// <summary>
/// G7: a scheme's Dispose racing another Dispose and machine starts. The race is made deterministic by the epoch's
/// closing hook, which runs on the disposing thread while its Dispose has claimed the machine slot and may still fail.
/// </summary>
public class SchemeDisposeTests
{
    [Fact]
    public void WhileADisposeThatWillFailIsClosing_ASecondDisposeReturns_AStartRetries_AndTheSchemeStaysUsable()
    {
        var scheme = new EpochProtectedVersionScheme();
        // A protected thread: the epoch's Dispose finds it and reverts, so the scheme's Dispose fails.
        using var parked = new ParkedThread(() => scheme.Enter(), scheme.Leave);
        Exception? secondDispose = null;
        bool secondReturned = false;
        StateMachineExecutionStatus? startedMeanwhile = null;
        scheme.Epoch.ClosingHookForTesting = () =>
            GuardedThread.Start(() =>
            {
                // It used to carry on past the first Dispose's sentinel into the epoch's Dispose, which waits for the
                // first one to decide (a hang here, while the first waits for this thread).
                secondDispose = Record.Exception(scheme.Dispose);
                secondReturned = true;
                // It used to throw ObjectDisposedException although the scheme is not disposed (the Dispose fails).
                startedMeanwhile = scheme.TryAdvanceVersionWithCriticalSection((_, _) => { });
            }).Join();

        Assert.Throws<InvalidOperationException>(scheme.Dispose);
        scheme.Epoch.ClosingHookForTesting = null;
        Assert.True(secondReturned);
        Assert.Null(secondDispose);
        Assert.Equal(StateMachineExecutionStatus.Retry, startedMeanwhile);

        // The failed Dispose changed nothing: the scheme advances, and disposes once the thread has left.
        parked.Release();
        Assert.True(scheme.AdvanceVersionWithCriticalSection((_, _) => { }, spin: true));
        Assert.Equal(2, scheme.CurrentState.Version);
        scheme.Dispose();
        Assert.Throws<ObjectDisposedException>(() => scheme.Enter());
    }
}
