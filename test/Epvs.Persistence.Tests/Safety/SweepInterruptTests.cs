using System;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// Review E: a sweep that writes its frees back outside the sweep's lock takes that lock again to end (to record a
/// failure and stop counting itself in flight). A <see cref="Thread.Interrupt"/> that landed on that wait skipped both:
/// the sweep stayed counted in flight for good, so every later flush (before an anti-payload's free, Dispose's
/// clean-shutdown save) waited for ever. The end now runs in a shield (<see cref="InterruptShield"/>), which absorbs the
/// interrupt and requests it again once the end is done. The control lets the interrupt through on the sweeping thread
/// (<see cref="InterruptShield.InterruptibleForTesting"/>). Shares a collection with the other tests of the shield's hooks.
/// </summary>
[Collection(nameof(InterruptedWorkTests))]
public sealed class SweepInterruptTests
{
    private static readonly TimeSpan Wait = TimeSpan.FromSeconds(30);

    [Fact]
    public void AnInterruptAsASweepEnds_IsAbsorbed_AndNoLaterFlushWaitsForThatSweep() => InterruptTheSweepsEnd(control: false);

    /// <summary>
    /// The control: the sweep's end lets the interrupt through, as before the shield; the interrupt escapes the sweep (and
    /// leaves it counted in flight, so this heap is abandoned: its Dispose would wait for that sweep for ever).
    /// </summary>
    [Fact]
    public void Control_AnInterruptLetThroughAsASweepEnds_EscapesTheSweep() => InterruptTheSweepsEnd(control: true);

    private static void InterruptTheSweepsEnd(bool control)
    {
        var fixture = new ParkedFrees(HeapFaults.None);
        PersistentHeap heap = fixture.Heap.Heap;
        object gate = heap.PendingGateForTesting;
        using var entered = new ManualResetEventSlim();
        using var seen = new ManualResetEventSlim();
        int go = 0;

        // Not an interruptible wait (a spin), so the interrupt stays pending until the sweep's end blocks on the lock.
        heap.AfterSweepMarkedForTesting = () =>
        {
            entered.Set();
            while (Volatile.Read(ref go) == 0)
            {
                Thread.SpinWait(64);
            }
        };
        Exception? failure = null;
        Thread? sweeper = null;
        sweeper = new Thread(() =>
        {
            InterruptShield.InterruptibleForTesting = control;
            failure = Record.Exception(() => heap.SweepPendingFrees(1, 0));
        })
        { IsBackground = true };
        InterruptShield.InterruptCaughtForTesting = () =>
        {
            if (Thread.CurrentThread == sweeper)
            {
                seen.Set();
            }
        };
        try
        {
            sweeper.Start();
            Assert.True(entered.Wait(Wait), "the sweep never marked its frees");
            Monitor.Enter(gate);
            try
            {
                sweeper.Interrupt();
                Volatile.Write(ref go, 1);
                Assert.True(seen.Wait(TimeSpan.FromSeconds(10)), "the sweep's end never blocked with the interrupt pending (or let it through)");
            }
            finally
            {
                Monitor.Exit(gate);
            }

            Assert.True(sweeper.Join(Wait));
            if (control)
            {
                Assert.IsType<ThreadInterruptedException>(failure);
                return;
            }

            Assert.Null(failure);
            heap.AfterSweepMarkedForTesting = null;
            var flush = new Thread(heap.FlushPendingFrees) { IsBackground = true };
            flush.Start();
            Assert.True(flush.Join(Wait), "a flush waited for a sweep left counted in flight");
            Assert.Equal(0, heap.PendingFreeBlocks);
        }
        finally
        {
            InterruptShield.InterruptCaughtForTesting = null;
            Volatile.Write(ref go, 1);

            // Bounded: with the bug, the heap's Dispose flushes and would wait for ever for the sweep left in flight (the
            // control's does: it is left to wait on a background thread).
            var dispose = new Thread(fixture.Dispose) { IsBackground = true };
            dispose.Start();
            Assert.True(control || dispose.Join(Wait), "Dispose waited for a sweep left counted in flight");
        }
    }
}
