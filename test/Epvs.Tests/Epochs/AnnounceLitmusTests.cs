using System;
using System.Diagnostics;
using System.Threading;
using Xunit;

namespace Epvs.Tests;

/// <summary>
/// The store-buffering litmus test of DESIGN §2.2. A reader announces its protection and then reads the scheme's
/// state; a transitioner publishes a new state (full fence) and then scans for protected readers. The reader stays
/// protected until the scan is over, so a round in which the reader missed the new state and the scan missed the
/// reader is a region that overlapped a critical section. FASTER announces with a plain store, which x64 may
/// reorder after the reader's load; the control does exactly that and must be caught here before a clean run of
/// the real announce means anything.
/// </summary>
public class AnnounceLitmusTests
{
    private readonly ITestOutputHelper output;

    public AnnounceLitmusTests(ITestOutputHelper output) => this.output = output;

    private sealed class Side
    {
        public required Action Announce;
        public required Action Retract;
        public required Func<bool> ScanSeesReader;
    }

    /// <summary>Runs until <paramref name="rounds"/> rounds or <paramref name="budget"/>; returns (overlaps, rounds).</summary>
    private static (long Overlaps, long Rounds) Run(Side side, long rounds, TimeSpan budget, bool stopAtFirst)
    {
        long state = 0;
        long readerMissed = 0;
        var meet = new SpinRendezvous();
        long overlaps = 0;
        long completed = 0;
        int stop = 0;
        var sw = Stopwatch.StartNew();

        var reader = GuardedThread.Start(() =>
        {
            for (long r = 1; ; r++)
            {
                meet.Meet(3 * r - 2);
                if (Volatile.Read(ref stop) != 0)
                    return;
                side.Announce();
                // Acquire load of the state, as in Enter.
                long seen = Volatile.Read(ref state);
                meet.Meet(3 * r - 1);      // stay protected until the scan is over
                side.Retract();
                if (seen != r)
                    Volatile.Write(ref readerMissed, r);
                meet.Meet(3 * r);
            }
        }, "litmus reader");

        for (long r = 1; ; r++)
        {
            meet.Meet(3 * r - 2);
            if (Volatile.Read(ref stop) != 0)
                break;
            // Publish the new state with a full fence (the CAS to intermediate), then scan.
            Interlocked.Exchange(ref state, r);
            bool sawReader = side.ScanSeesReader();
            meet.Meet(3 * r - 1);
            meet.Meet(3 * r);
            if (!sawReader && Volatile.Read(ref readerMissed) == r)
                overlaps++;
            completed = r;
            if (r >= rounds || sw.Elapsed > budget || (stopAtFirst && overlaps > 0))
                Volatile.Write(ref stop, 1);
        }
        reader.Join();
        return (overlaps, completed);
    }

    private static long controlSlot;

    [Fact]
    public void Announce_StoreBufferingLitmus_RealAnnounceNeverMissedWhileFenceLessControlIs()
    {
        // The control: FASTER's announce, a release store of the slot with no fence before the state is read.
        var fenceless = new Side
        {
            Announce = () => Volatile.Write(ref controlSlot, 1),
            Retract = () => Volatile.Write(ref controlSlot, 0),
            ScanSeesReader = () => Volatile.Read(ref controlSlot) != 0,
        };
        (long caught, long controlRounds) = Run(fenceless, rounds: 2_000_000, TimeSpan.FromSeconds(10), stopAtFirst: false);
        output.WriteLine($"fence-less control: {caught} overlaps in {controlRounds} rounds");

        using var epoch = new LightEpoch();
        var real = new Side
        {
            Announce = epoch.Resume,
            Retract = epoch.Suspend,
            ScanSeesReader = () => epoch.IsHeldBack(long.MaxValue - 3),
        };
        (long overlaps, long realRounds) = Run(real, rounds: Math.Max(controlRounds, 200_000), TimeSpan.FromSeconds(15), stopAtFirst: false);
        output.WriteLine($"LightEpoch.Resume: {overlaps} overlaps in {realRounds} rounds");

        Assert.Equal(0, overlaps);
        Assert.SkipWhen(caught == 0, $"inconclusive: the fence-less control was not caught in {controlRounds} rounds on this machine, so the clean run of the real announce proves nothing here");
    }
}
