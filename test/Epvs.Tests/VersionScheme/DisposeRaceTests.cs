using System;
using System.Collections.Concurrent;
using System.Threading;
using System.Threading.Tasks;
using Xunit;

namespace Epvs.Tests;

/// <summary>
/// G6/G7 under races: a Dispose on one thread against every kind of public call on others (also with critical sections
/// and deferred actions that throw, and a region whose Refresh steps aside for the transition it requested). Each call either works or
/// throws ObjectDisposedException (InvalidOperationException for Dispose itself while someone is protected or a machine
/// runs, which the disposer retries); nothing hangs (every join and task is bounded); every deferred action whose
/// registration returned runs exactly once; every task handed out completes. Bounded rounds with a fixed seed.
/// </summary>
public class DisposeRaceTests
{
    private readonly ITestOutputHelper output;

    public DisposeRaceTests(ITestOutputHelper output) => this.output = output;

    private const int Kinds = 8;

    private sealed class Injected : Exception
    {
        public Injected() : base("an injected fault of a critical section or a deferred action") { }
    }

    private static bool IsExpected(Exception ex) => ex is ObjectDisposedException;

    /// <summary>One call of kind <paramref name="kind"/>; returns false once the call saw the scheme disposed.</summary>
    private static bool CallOnce(EpochProtectedVersionScheme scheme, int kind, ref int registered, Action action, ConcurrentQueue<Task> tasks, Action<long, long> section)
    {
        LightEpoch epoch = scheme.Epoch;
        try
        {
            switch (kind)
            {
                case 0:
                    scheme.Enter();
                    scheme.Leave();
                    break;
                case 1:
                    scheme.Enter();
                    try
                    {
                        scheme.Refresh();
                    }
                    finally
                    {
                        scheme.Leave(); // a Refresh that throws keeps the region
                    }
                    break;
                case 2:
                    epoch.BumpCurrentEpoch(action);
                    Interlocked.Increment(ref registered);
                    break;
                case 3:
                    tasks.Enqueue(epoch.BumpCurrentEpochAsync(action));
                    Interlocked.Increment(ref registered);
                    break;
                case 4:
                    scheme.TryAdvanceVersionWithCriticalSection(section);
                    break;
                case 5:
                    scheme.AdvanceVersionWithCriticalSection(section, spin: true);
                    break;
                case 6:
                    tasks.Enqueue(scheme.AdvanceVersionAsync(section));
                    break;
                default:
                    // A transition requested inside a region waits for it (G5): the Refresh steps aside for it.
                    scheme.Enter();
                    try
                    {
                        scheme.TryAdvanceVersionWithCriticalSection(section);
                        scheme.Refresh();
                    }
                    finally
                    {
                        scheme.Leave();
                    }
                    break;
            }
            return true;
        }
        catch (Exception ex) when (IsExpected(ex))
        {
            return false;
        }
        catch (Injected)
        {
            return true; // a blocking advance rethrows its critical section's fault (G6): the call worked
        }
    }

    private static bool AllCompleted(ConcurrentQueue<Task> tasks)
    {
        foreach (Task t in tasks)
        {
            if (!t.IsCompleted)
                return false;
        }
        return true;
    }

    [Theory]
    [InlineData(false, false)]
    [InlineData(true, false)]
    [InlineData(false, true)]
    [InlineData(true, true)]
    public void Dispose_RacingEveryKindOfCall_EachWorksOrThrowsObjectDisposed_NothingHangsOrIsLost(bool sharedEpoch, bool faults)
    {
        int rounds = int.TryParse(Environment.GetEnvironmentVariable("EPVS_DISPOSE_RACE_ROUNDS"), out int r) ? r : 150;
        var random = new Random(1234);
        output.WriteLine($"seed 1234, {rounds} rounds, shared epoch: {sharedEpoch}, faults: {faults}");
        for (int round = 0; round < rounds; round++)
        {
            LightEpoch? shared = sharedEpoch ? new LightEpoch() : null;
            var scheme = shared is null ? new EpochProtectedVersionScheme() : new EpochProtectedVersionScheme(shared);
            int kindA = random.Next(Kinds), kindB = random.Next(Kinds), delay = random.Next(50_000);
            int registered = 0, ran = 0, calls = 0;
            // With faults, every third action and critical section throws (after counting: the action did run).
            Action action = () =>
            {
                Interlocked.Increment(ref ran);
                if (faults && Interlocked.Increment(ref calls) % 3 == 0)
                    throw new Injected();
            };
            Action<long, long> section = (_, _) =>
            {
                if (faults && Interlocked.Increment(ref calls) % 3 == 0)
                    throw new Injected();
            };
            var tasks = new ConcurrentQueue<Task>();
            using var go = new Barrier(3);
            int disposeAttempts = 0;
            void Worker(int kind)
            {
                go.SignalAndWait(GuardedThread.DefaultTimeout);
                for (int i = 0; i < 2_000 && CallOnce(scheme, kind, ref registered, action, tasks, section); i++)
                {
                }
            }
            var a = GuardedThread.Start(() => Worker(kindA), $"kind {kindA}");
            var b = GuardedThread.Start(() => Worker(kindB), $"kind {kindB}");
            go.SignalAndWait(GuardedThread.DefaultTimeout);
            Thread.SpinWait(delay); // where the calls are when Dispose comes: a bound, not a synchronization
            var spinner = new SpinWait();
            while (true)
            {
                disposeAttempts++;
                // Refused while a worker is protected or a machine runs; once both workers have stopped and every task
                // they started has completed (an AdvanceVersionAsync goes on after its call returned), it must succeed.
                bool last = !a.IsAlive && !b.IsAlive && AllCompleted(tasks);
                try
                {
                    scheme.Dispose();
                    break;
                }
                catch (InvalidOperationException ex) when (last)
                {
                    Assert.Fail($"round {round} ({kindA}/{kindB}): Dispose refused with every caller gone: {ex.Message} (active: {scheme.ActiveStateMachine?.ActualToVersion}, state {scheme.CurrentState})");
                }
                catch (InvalidOperationException ex) when (!last)
                {
                    Assert.True(disposeAttempts < 100_000_000, $"round {round} ({kindA}/{kindB}): Dispose never succeeded: {ex.Message}");
                    spinner.SpinOnce(sleep1Threshold: -1);
                }
            }
            a.Join();
            b.Join();
            if (shared is not null)
            {
                Assert.Throws<ObjectDisposedException>(() => scheme.Enter());
                shared.Dispose(); // runs what the scheme's users left pending
            }
            foreach (Task t in tasks)
            {
                Assert.True(((IAsyncResult)t).AsyncWaitHandle.WaitOne(GuardedThread.DefaultTimeout), $"round {round}: a task never completed ({kindA}/{kindB})");
                Assert.True(t.Status == TaskStatus.RanToCompletion || t.Exception?.InnerException is ObjectDisposedException or Injected,
                    $"round {round}: task {t.Status}: {t.Exception?.InnerException}");
            }
            Assert.True(Volatile.Read(ref registered) == Volatile.Read(ref ran), $"round {round} ({kindA}/{kindB}): {registered} registered, {ran} ran");
            Assert.Throws<ObjectDisposedException>(() => scheme.Epoch.Resume());
        }
    }
}
