using System;
using System.Threading;
using Xunit;

namespace Epvs.Tests;

/// <summary>G9: more protected threads than table slots and any number of pending actions never livelock.</summary>
public class UnboundedTests
{
    private readonly ITestOutputHelper output;

    public UnboundedTests(ITestOutputHelper output) => this.output = output;

    private sealed record Outcome(bool Progressed, string Detail, int RanWhileParked, int RanAfterRelease);

    /// <summary>
    /// One thread parks inside protection; meanwhile <paramref name="threads"/> threads must all be protected at
    /// once and <paramref name="actions"/> actions must be registered. Every call must return while the thread is
    /// parked, no action may run before it leaves, and all must run once it does.
    /// </summary>
    private static Outcome Run(IEpochUnderTest epoch, int threads, int actions, TimeSpan progressTimeout, Action onStuck)
    {
        int ran = 0;
        var parked = new ParkedThread(epoch.Resume, epoch.Suspend);
        try
        {
            var bumper = new GuardedThread(() =>
            {
                for (int i = 0; i < actions; i++)
                    epoch.Bump(() => Interlocked.Increment(ref ran));
            }, "bumper");
            using var allIn = new CountdownEvent(threads);
            using var leave = new ManualResetEventSlim();
            var protectors = new GuardedThread[threads];
            for (int i = 0; i < threads; i++)
            {
                protectors[i] = new GuardedThread(() =>
                {
                    epoch.Resume();
                    allIn.Signal();
                    Assert.True(leave.Wait(GuardedThread.DefaultTimeout));
                    epoch.Suspend();
                }, $"protector {i}", maxStackSize: 256 * 1024);
            }

            bumper.Start();
            foreach (GuardedThread p in protectors)
                p.Start();

            bool bumped = bumper.TryJoinOrTimeout(progressTimeout);
            bool allProtected = allIn.Wait(progressTimeout);
            if (!bumped || !allProtected)
            {
                onStuck();
                leave.Set();
                parked.Release();
                return new Outcome(false, $"{epoch.Name}: bumper finished={bumped}, all {threads} protected at once={allProtected}", 0, 0);
            }

            leave.Set();
            foreach (GuardedThread p in protectors)
                p.Join();
            int whileParked = Volatile.Read(ref ran);
            parked.Release(); // the last one out runs everything
            Bounded.WaitUntil(() => Volatile.Read(ref ran) == actions, $"{epoch.Name}: all {actions} actions after the release");
            return new Outcome(true, "", whileParked, Volatile.Read(ref ran));
        }
        finally
        {
            parked.Dispose();
        }
    }

    [Fact]
    public void ThousandThreadsAndTenThousandActions_WhileOneThreadIsParked_AllCompleteOnceItLeaves()
    {
        using (var control = new BoundedEpoch())
        {
            Outcome caught = Run(control, threads: 200, actions: 100, TimeSpan.FromSeconds(2), control.Cancel);
            output.WriteLine($"control: progressed={caught.Progressed} {caught.Detail}");
            Assert.False(caught.Progressed, "control not caught: the bounded epoch was expected to get stuck");
        }

        using var real = new RealEpoch(initialTableSize: 16);
        Outcome result = Run(real, threads: 1000, actions: 10_000, GuardedThread.DefaultTimeout, () => { });
        output.WriteLine($"real: table grew to {real.Epoch.GetSnapshot().TableCapacity} slots");
        Assert.True(result.Progressed, result.Detail);
        Assert.Equal(0, result.RanWhileParked);
        Assert.Equal(10_000, result.RanAfterRelease);
        Assert.True(real.Epoch.GetSnapshot().TableCapacity >= 1001);
    }
}
