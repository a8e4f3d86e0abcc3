using System;
using System.Diagnostics;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// A probe: a deferred action registered on the heap's public epoch (<c>heap.VersionScheme.Epoch.BumpCurrentEpoch</c>)
/// that calls Sync, AdvanceVersion or Dispose. It runs in the drain of a thread ending its operation, and the transition
/// that the heap's cycle (another thread's AdvanceVersion here) waits for has its critical section pending in that same
/// drain, behind the action: the action waited for the cycle, the cycle for the cut, the cut for the action — for ever
/// with an infinite timeout (the ending operation never returned), or for the whole timeout with a message that blamed
/// an operation. These calls are now refused there (<see cref="Epvs.LightEpoch.ThisInstanceDraining"/>); the control
/// (<see cref="DurabilityFaults.WaitInsideTheEpochsDrain"/>) lets them wait, and must stall until its 2 s timeout.
/// </summary>
public sealed class DeferredActionWaitTests
{
    [Theory]
    [InlineData("Sync", false)]
    [InlineData("AdvanceVersion", false)]
    [InlineData("Dispose", false)]
    [InlineData("Sync", true)]
    [InlineData("AdvanceVersion", true)]
    [InlineData("Dispose", true)]
    public void AWaitForTheVersionInADeferredActionOfTheHeapsEpoch_IsRefused_NotStalled(string call, bool control)
    {
        using var dir = new TempDirectory();
        var heap = BufferedDurableHeap.Create(
            dir.File("a.heap"),
            new HeapFileOptions { Size = 4L << 20, Domain = PersistenceDomainKind.MappedFile },
            new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, SyncTimeout = TimeSpan.FromSeconds(2), Faults = control ? DurabilityFaults.WaitInsideTheEpochsDrain : DurabilityFaults.None });
        try
        {
            var map = new PersistentHashMap<int, int>(heap, typeId: 1);
            map.Set(1, 1);
            heap.Sync();

            using var holderIn = new ManualResetEventSlim();
            using var holderGo = new ManualResetEventSlim();
            using var actionEnded = new ManualResetEventSlim();
            Exception? inAction = null;
            var holder = new Thread(() =>
            {
                using DurableOperation op = heap.BeginOperation();
                holderIn.Set();
                holderGo.Wait(TimeSpan.FromSeconds(30));
            });
            holder.Start();
            Assert.True(holderIn.Wait(TimeSpan.FromSeconds(30)));

            // Runs in the holder's drain as it ends its operation.
            heap.VersionScheme.Epoch.BumpCurrentEpoch(() =>
            {
                inAction = Record.Exception(() =>
                {
                    switch (call)
                    {
                        case "Sync":
                            heap.Sync(TimeSpan.FromSeconds(2));
                            break;
                        case "AdvanceVersion":
                            heap.AdvanceVersion(TimeSpan.FromSeconds(2));
                            break;
                        default:
                            heap.Dispose();
                            break;
                    }
                });
                actionEnded.Set();
            });

            // Another thread's cycle: its transition waits for the holder's operation (its critical section is then
            // pending, to run in the holder's drain behind the action).
            Exception? advanceFailure = null;
            var advance = new Thread(() => advanceFailure = Record.Exception(() => heap.AdvanceVersion(TimeSpan.FromSeconds(30))));
            advance.Start();
            var watch = Stopwatch.StartNew();
            while (!heap.VersionScheme.CurrentState.IsIntermediate && advance.IsAlive && watch.Elapsed < TimeSpan.FromSeconds(30))
            {
                Thread.Yield();
            }

            Assert.True(heap.VersionScheme.CurrentState.IsIntermediate, "the transition never waited for the holder's operation");
            holderGo.Set();
            Assert.True(actionEnded.Wait(TimeSpan.FromSeconds(30)), "the deferred action never ended");
            Assert.True(holder.Join(TimeSpan.FromSeconds(30)), "the holder's operation never finished ending");
            if (control)
            {
                // It waited out its timeout behind the transition pending in its own drain (in one run of the whole suite
                // the AdvanceVersion case did not, once: reported as inconclusive, with what happened).
                Assert.True(advance.Join(TimeSpan.FromSeconds(30)));
                bool stalled = inAction is TimeoutException || (call == "Dispose" && inAction is not null);
                Assert.SkipUnless(stalled, $"inconclusive: the control did not stall this run (the action's call: {inAction?.GetType().Name ?? "returned"}: {inAction?.Message}; the other thread's AdvanceVersion: {advanceFailure?.GetType().Name ?? "returned"})");
                return;
            }

            InvalidOperationException refused = Assert.IsType<InvalidOperationException>(inAction);
            Assert.Contains("deferred action", refused.Message, StringComparison.Ordinal);

            // Refused before anything changed: the cycle completes, and the heap goes on.
            Assert.True(advance.Join(TimeSpan.FromSeconds(30)));
            Assert.Null(advanceFailure);
            map.Set(2, 2);
            heap.Sync();
        }
        finally
        {
            Record.Exception(heap.Dispose);
        }
    }

    /// <summary>SyncAsync does not wait: a deferred action of the heap's epoch may call it (a review found it refused too).</summary>
    [Fact]
    public void SyncAsyncInADeferredActionOfTheHeapsEpoch_IsAllowed_AndCompletes()
    {
        using var dir = new TempDirectory();
        using var heap = BufferedDurableHeap.Create(dir.File("a.heap"), new HeapFileOptions { Size = 4L << 20, Domain = PersistenceDomainKind.MappedFile }, new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromMilliseconds(10) });
        var map = new PersistentHashMap<int, int>(heap, typeId: 1);
        map.Set(1, 1);
        Exception? inAction = null;
        System.Threading.Tasks.Task? task = null;
        heap.VersionScheme.Epoch.BumpCurrentEpoch(() => inAction = Record.Exception(() => { task = heap.SyncAsync(); }));
        using (heap.VersionScheme.Epoch.EnterScope())
        {
        }

        Assert.Null(inAction);
        Assert.NotNull(task);
        Assert.True(((IAsyncResult)task).AsyncWaitHandle.WaitOne(TimeSpan.FromSeconds(30)), "the SyncAsync never completed");
        Assert.True(task.IsCompletedSuccessfully);
    }
}
