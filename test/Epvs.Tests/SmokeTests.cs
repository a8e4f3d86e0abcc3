using System.Threading;
using Epvs;
using Xunit;

namespace Epvs.Tests;

public class SmokeTests
{
    [Fact]
    public void EnterLeaveAdvance_SingleThread_Works()
    {
        using var epvs = new EpochProtectedVersionScheme();
        var s = epvs.Enter();
        Assert.Equal(1, s.Version);
        epvs.Leave();
        long seenFrom = 0, seenTo = 0;
        Assert.True(epvs.AdvanceVersionWithCriticalSection((f, t) => { seenFrom = f; seenTo = t; }, spin: true));
        Assert.Equal((1, 2), (seenFrom, seenTo));
        Assert.Equal(2, epvs.Enter().Version);
        epvs.Leave();
    }

    [Fact]
    public void ProtectedRequester_CriticalSectionWaitsForRefresh()
    {
        using var epvs = new EpochProtectedVersionScheme();
        var s = epvs.Enter();
        bool ran = false;
        Assert.Equal(StateMachineExecutionStatus.Ok, epvs.TryAdvanceVersionWithCriticalSection((_, _) => ran = true, s.Version + 1));
        Assert.False(ran);
        var s2 = epvs.Refresh();
        Assert.True(ran);
        Assert.Equal(2, s2.Version);
        epvs.Leave();
    }

    [Fact]
    public void TwoThreads_Transitions()
    {
        using var epvs = new EpochProtectedVersionScheme();
        long shared = 1;
        var stop = 0;
        var t = new Thread(() => { while (Volatile.Read(ref stop) == 0) { var s = epvs.Enter(); Assert.Equal(s.Version, Volatile.Read(ref shared)); epvs.Leave(); } });
        t.Start();
        for (int i = 0; i < 1000; i++)
            epvs.AdvanceVersionWithCriticalSection((f, to) => Volatile.Write(ref shared, to), spin: true);
        Volatile.Write(ref stop, 1);
        Assert.True(t.Join(30000));
        Assert.Equal(1001, epvs.CurrentState.Version);
    }
}
