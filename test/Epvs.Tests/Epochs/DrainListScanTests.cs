using System;
using System.Threading;
using Xunit;

namespace Epvs.Tests;

/// <summary>
/// The list of deferred actions grows instead of blocking (G9), and never shrinks. A burst of registrations behind a
/// parked thread left it tens of thousands of slots long, and from then on every drain walked all of it: registrations
/// continued from the last one's slot, so even a few waiting actions were spread over the whole list. A registration
/// with another thread cycling Resume/Suspend went from about 1 µs to 50–130 µs per action on the benchmark machine.
/// Now few waiting actions are registered from the front and scans skip segments with nothing taken: after a burst, a
/// drain visits about the first segment. Counted (the scans' slot counter), not timed. Each half of the fix has a
/// control: the test catches either one undone.
/// </summary>
public class DrainListScanTests
{
    private const int Burst = 20_000;
    private const int Rounds = 1_000;
    private readonly ITestOutputHelper output;

    public DrainListScanTests(ITestOutputHelper output) => this.output = output;

    /// <summary>Grows the list with a burst behind a parked thread, runs it, then counts the slots scanned per
    /// registration of a Resume/BumpCurrentEpoch/Suspend loop. Returns (slots per round, list capacity).</summary>
    private (double PerRound, int Capacity) SlotsScannedPerRegistrationAfterABurst()
    {
        using var epoch = new LightEpoch();
        int ran = 0;
        using (var parked = new ParkedThread(epoch.Resume, epoch.Suspend))
        {
            for (int i = 0; i < Burst; i++)
                epoch.BumpCurrentEpoch(() => Interlocked.Increment(ref ran));
        }
        Assert.Equal(Burst, Volatile.Read(ref ran));
        int capacity = epoch.GetSnapshot().DrainListCapacity;
        Assert.True(capacity >= Burst, $"the burst grew the list to {capacity} slots only");

        DrainList list = epoch.DrainListForTesting;
        DrainList.CountScansForTesting = true;
        try
        {
            long before = Interlocked.Read(ref list.SlotsScannedForTesting);
            for (int i = 0; i < Rounds; i++)
            {
                epoch.Resume();
                epoch.BumpCurrentEpoch(() => Interlocked.Increment(ref ran));
                epoch.Suspend();
            }
            long scanned = Interlocked.Read(ref list.SlotsScannedForTesting) - before;
            Assert.Equal(Burst + Rounds, Volatile.Read(ref ran));
            return ((double)scanned / Rounds, capacity);
        }
        finally
        {
            DrainList.CountScansForTesting = false;
        }
    }

    [Fact]
    public void AfterABurstGrewTheList_EachDrainScansAboutTheFirstSegment()
    {
        (double rotating, int capacity) = WithFlag(() => DrainList.RotateInsertionsForTesting = true, () => DrainList.RotateInsertionsForTesting = false);
        (double everySegment, _) = WithFlag(() => DrainList.ScanEverySegmentForTesting = true, () => DrainList.ScanEverySegmentForTesting = false);
        (double perRound, _) = SlotsScannedPerRegistrationAfterABurst();
        output.WriteLine($"list of {capacity} slots; slots scanned per registration: {perRound:0.0} (controls: insertions continuing from the last slot {rotating:0.0}, every segment scanned {everySegment:0.0})");

        // The first segment has 16 slots, the second 32: a few scans of the first two segments per registration.
        Assert.True(perRound <= 256, $"{perRound:0.0} slots scanned per registration on a list of {capacity}");
        Assert.True(rotating > 1_000, $"INCONCLUSIVE: the control (insertions continuing from the last slot) scanned only {rotating:0.0} slots per registration");
        Assert.True(everySegment > 1_000, $"INCONCLUSIVE: the control (every segment scanned) scanned only {everySegment:0.0} slots per registration");
    }

    /// <summary>
    /// A probe's finding: behind 16 or more waiting actions a registration starts at the last one's segment, and after a
    /// burst that hint stayed in the burst's last, largest segment for the epoch's life: a thread holding back a rolling
    /// window of 40 actions made every drain walk that segment (131,088 slots per refresh after a burst of 200,000,
    /// against 48 on a fresh list). A hint far beyond what waits now is dropped.
    /// </summary>
    [Fact]
    public void AfterABurst_ARollingWindowAboveTheFirstSegment_ScansAboutWhatAFreshListScans()
    {
        double fresh = SlotsScannedPerRefreshOfARollingWindow(burst: 0);
        double afterBurst = SlotsScannedPerRefreshOfARollingWindow(burst: 200_000);
        DrainList.KeepFarInsertHintForTesting = true;
        double control;
        try
        {
            control = SlotsScannedPerRefreshOfARollingWindow(burst: 200_000);
        }
        finally
        {
            DrainList.KeepFarInsertHintForTesting = false;
        }

        output.WriteLine($"slots scanned per refresh: fresh list {fresh:0}, after a burst {afterBurst:0} (control, the far hint kept: {control:0})");
        Assert.True(afterBurst <= (4 * fresh) + 256, $"after a burst each refresh scanned {afterBurst:0} slots, a fresh list {fresh:0}");
        Assert.True(control > 10_000, $"INCONCLUSIVE: the control (the far hint kept) scanned only {control:0} slots per refresh");
    }

    /// <summary>After a burst of <paramref name="burst"/> actions behind a parked thread: one thread holds a rolling window
    /// of 40 actions back (registers them in its region, then refreshes, which drains the previous window).</summary>
    private static double SlotsScannedPerRefreshOfARollingWindow(int burst)
    {
        const int Window = 40;
        const int Refreshes = 200;
        using var epoch = new LightEpoch();
        int ran = 0;
        if (burst > 0)
        {
            using var parked = new ParkedThread(epoch.Resume, epoch.Suspend);
            for (int i = 0; i < burst; i++)
                epoch.BumpCurrentEpoch(() => Interlocked.Increment(ref ran));
        }
        Assert.Equal(burst, Volatile.Read(ref ran));
        DrainList list = epoch.DrainListForTesting;
        DrainList.CountScansForTesting = true;
        try
        {
            epoch.Resume();
            for (int i = 0; i < Window; i++)
                epoch.BumpCurrentEpoch(() => Interlocked.Increment(ref ran));
            long before = Interlocked.Read(ref list.SlotsScannedForTesting);
            for (int round = 0; round < Refreshes; round++)
            {
                epoch.ProtectAndDrain();
                for (int i = 0; i < Window; i++)
                    epoch.BumpCurrentEpoch(() => Interlocked.Increment(ref ran));
            }
            long scanned = Interlocked.Read(ref list.SlotsScannedForTesting) - before;
            epoch.Suspend();
            Assert.Equal(burst + ((Refreshes + 1) * Window), Volatile.Read(ref ran));
            return (double)scanned / Refreshes;
        }
        finally
        {
            DrainList.CountScansForTesting = false;
        }
    }

    private (double PerRound, int Capacity) WithFlag(Action on, Action off)
    {
        on();
        try
        {
            return SlotsScannedPerRegistrationAfterABurst();
        }
        finally
        {
            off();
        }
    }
}
