using System;
using System.Collections.Generic;
using System.Threading;
using Epvs.Tests;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// <see cref="Thread.Interrupt"/> of a thread whose Dispose waits (for a call in flight, or for the last advance): the
/// interrupt broke the wait with <see cref="ThreadInterruptedException"/>, which skipped the unmapping and the release of
/// the file lock (HeapFile: the file stayed locked for the life of the process, and a later Dispose did nothing), or failed
/// the last advance (BufferedDurableHeap: "not made durable"). Now Dispose runs to its end and requests the interrupt
/// again, for the thread's next wait. The disposing thread is interrupted before it calls Dispose (an interrupt stays
/// pending until the thread blocks), and a call parked inside the object makes Dispose block; the parked call leaves once
/// the wait has seen the interrupt (a hook). The control (<see cref="InterruptShield.InterruptibleForTesting"/> on the
/// disposing thread, the waits as before) must be caught. In the collection of the other tests of the shield's hooks.
/// </summary>
[Collection(nameof(InterruptedWorkTests))]
public sealed class InterruptedDisposeTests
{
    private static readonly HeapFileOptions Small = new() { Size = 4L << 20, Domain = PersistenceDomainKind.MappedFile };

    private readonly ITestOutputHelper _output;

    public InterruptedDisposeTests(ITestOutputHelper output) => _output = output;

    /// <summary>
    /// Parks a call inside the object (<paramref name="call"/> runs on a thread and calls the action it is given from
    /// inside), disposes on another thread with an interrupt pending, then lets the call leave once the interrupt was
    /// seen. Returns
    /// what Dispose threw and whether the interrupt was still pending on the disposing thread after it.
    /// </summary>
    private static (Exception? Dispose, bool InterruptPending) InterruptDisposeWhileACallIsInside(Action<Action> call, Action dispose, bool legacy)
    {
        try
        {
            using var inside = new ManualResetEventSlim();
            using var release = new ManualResetEventSlim();
            var parked = new Thread(() => call(() =>
            {
                inside.Set();
                release.Wait(Workers.JoinTimeout);
            }))
            { IsBackground = true };
            parked.Start();
            Assert.True(inside.Wait(Workers.JoinTimeout));

            Exception? failure = null;
            bool pending = false;
            var seen = new ManualResetEventSlim(); // not disposed: a stale hook call (another test's interrupt) must not throw
            Thread? disposer = null;
            InterruptShield.InterruptCaughtForTesting = () =>
            {
                if (Thread.CurrentThread == disposer)
                {
                    seen.Set();
                }
            };
            disposer = new Thread(() =>
            {
                InterruptShield.InterruptibleForTesting = legacy;
                Thread.CurrentThread.Interrupt(); // pending: the first wait that blocks in Dispose sees it
                failure = Record.Exception(dispose);
                pending = PendingInterrupt.TryConsume();
            })
            { IsBackground = true };
            disposer.Start();

            // The call stays inside until Dispose's wait for it has seen the interrupt (it cannot complete before).
            Assert.True(seen.Wait(Workers.JoinTimeout), "Dispose never blocked with the interrupt pending");
            release.Set();
            Assert.True(parked.Join(Workers.JoinTimeout));
            Assert.True(disposer.Join(Workers.JoinTimeout));
            return (failure, pending);
        }
        finally
        {
            InterruptShield.InterruptCaughtForTesting = null;
        }
    }

    private static bool CanReopen(string path, ref bool clean)
    {
        try
        {
            using HeapFile file = HeapFile.Open(path, Small);
            clean = file.WasCleanShutdown;
            return true;
        }
        catch (HeapFileException e) when (e.Error == HeapFileError.AlreadyOpen)
        {
            return false;
        }
    }

    [Fact]
    public void HeapFile_DisposeInterruptedWhileItWaitsForACall_StillClosesTheFile_AndKeepsTheInterrupt()
    {
        using var dir = new TempDirectory();
        (Exception? Dispose, bool InterruptPending, bool Reopened, bool Clean) Run(bool legacy)
        {
            string path = dir.File($"interrupted-{legacy}.heap");
            HeapFile file = HeapFile.Create(path, Small);
            var (dispose, pending) = InterruptDisposeWhileACallIsInside(
                park =>
                {
                    file.EnterOperation();
                    park();
                    file.ExitOperation();
                },
                file.Dispose,
                legacy);
            bool clean = false;
            bool reopened = CanReopen(path, ref clean);
            return (dispose, pending, reopened, clean);
        }

        var control = Run(legacy: true);
        var real = Run(legacy: false);
        _output.WriteLine($"control: {control.Dispose?.GetType().Name}, reopened {control.Reopened}; real: {real.Dispose?.GetType().Name}, pending {real.InterruptPending}, reopened {real.Reopened}");
        Assert.Null(real.Dispose);
        Assert.True(real.Reopened, "the interrupted Dispose left the file locked");
        Assert.True(real.Clean, "the interrupted Dispose did not close the file in order");
        Assert.True(real.InterruptPending, "the interrupt was swallowed");
        // Since a failure in the wait quarantines the mapping (DisposeFaultTests), the control releases the lock too; what
        // it still shows is the interrupt escaping Dispose and the file closed out of order.
        Assert.SkipWhen(control.Dispose is not ThreadInterruptedException || control.Clean, "inconclusive: the control (interruptible waits) was not caught");
    }

    [Fact]
    public void BufferedDurableHeap_DisposeInterruptedWhileTheLastAdvanceWaitsForAnOperation_StillMakesItDurable()
    {
        using var dir = new TempDirectory();
        var options = new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan };
        (Exception? Dispose, bool InterruptPending, Dictionary<int, int> Recovered, bool Clean) Run(bool legacy)
        {
            string path = dir.File($"interrupted-{legacy}.heap");
            BufferedDurableHeap heap = BufferedDurableHeap.Create(path, Small, options);
            var map = new PersistentHashMap<int, int>(heap, typeId: 1);
            map.Set(1, 10);
            var (dispose, pending) = InterruptDisposeWhileACallIsInside(
                park =>
                {
                    map.Set(2, 20); // completes before the Dispose; the parked operation below only holds the version
                    using DurableOperation op = heap.BeginOperation();
                    park();
                },
                heap.Dispose,
                legacy);
            using BufferedDurableHeap reopened = BufferedDurableHeap.Open(path, Small, options);
            return (dispose, pending, new PersistentHashMap<int, int>(reopened, typeId: 1).ToDictionary(), reopened.Heap.File.WasCleanShutdown);
        }

        var control = Run(legacy: true);
        var real = Run(legacy: false);
        _output.WriteLine($"control: {control.Dispose?.Message}, clean {control.Clean}; real: {real.Dispose?.Message}, pending {real.InterruptPending}, clean {real.Clean}");
        Assert.Null(real.Dispose);
        Assert.True(real.Clean);
        Assert.Equal(new Dictionary<int, int> { [1] = 10, [2] = 20 }, real.Recovered);
        Assert.True(real.InterruptPending, "the interrupt was swallowed");
        Assert.SkipWhen(control.Dispose is null, "inconclusive: the control (interruptible waits) was not caught");
    }
}
