using System;
using System.Threading;
using Epvs.Tests;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// <see cref="Thread.Interrupt"/> of a thread waiting inside the hash map's DRAM index. A probe: of a
/// <see cref="PersistentHashMap{TKey, TValue}.Set"/> whose insert makes the
/// DRAM index grow. The growth comes after the insert and waits for every lock stripe and for each slot an update
/// holds: an interrupt that broke the stripe wait made <c>Set</c> throw <see cref="ThreadInterruptedException"/> with
/// its key in the map (a failed call that changed the map), and one that broke the slot wait's sleep was taken for a
/// failure of a key's <c>GetHashCode</c> and swallowed (the interrupt lost, the index left at its size). The growth now
/// runs to its end inside an <see cref="InterruptShield"/> scope and requests the interrupt again after. A review: of a
/// <see cref="PersistentHashMap{TKey, TValue}.TryGetValue"/> that waits for a value being stored (a lock-free read
/// retries, with SpinWait's sleeps): it threw <see cref="ThreadInterruptedException"/>, and since each attempt copies
/// into the caller's <c>out</c> location, left a mix of two values there; the retries run in a shield too. Deterministic:
/// the interrupt is pending before the call, the wait blocks on what the test holds, and the test lets go once the wait
/// has caught the interrupt (<see cref="InterruptShield.InterruptCaughtForTesting"/>). The control lets the interrupt
/// through inside the shield (<see cref="InterruptShield.InterruptibleForTesting"/>): the old behaviour, caught.
/// </summary>
[Collection(nameof(InterruptedWorkTests))]
public sealed class InterruptedIndexWaitTests
{
    private const int FirstCapacity = 1024;

    /// <summary>The interrupted growth waits for a lock stripe that the test holds.</summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void AnInterruptDuringTheGrowthsStripeWait_NeitherFailsTheSetNorIsLost(bool control)
    {
        using var dir = new TempDirectory();
        using BufferedDurableHeap heap = HandDriven(dir);
        var map = new PersistentHashMap<long, long>(heap, typeId: 1);
        long key = FillToHalf(map);

        // A stripe other than the insert's own (which the insert takes before the growth).
        ValueIndex<long, long> index = map.CoreForTesting.IndexForTesting;
        object insertLock = index.LockFor(ValueIndex<long, long>.Hash(key));
        object held = insertLock;
        for (long k = key + 1; ReferenceEquals(held, insertLock); k++)
        {
            held = index.LockFor(ValueIndex<long, long>.Hash(k));
        }

        (Exception? failure, bool pending) = InterruptWhileBlocked(() => map.Set(key, 42), control, hold: () => Monitor.Enter(held), release: () => Monitor.Exit(held));
        Assert.True(map.TryGetValue(key, out long value) && value == 42, "the insert is in the map");
        if (control)
        {
            Assert.IsType<ThreadInterruptedException>(failure);
            return;
        }

        Assert.Null(failure);
        Assert.True(pending, "the interrupt was swallowed: the thread's next wait must still see it");
        Assert.True(map.IndexCapacity > FirstCapacity, "the index did not grow");
    }

    /// <summary>The interrupted growth waits (spinning, and at times sleeping) for the slot of a key whose update is parked inside its lock.</summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void AnInterruptDuringTheGrowthsSlotWait_IsNotTakenForAHashFailure(bool control)
    {
        using var dir = new TempDirectory();
        using BufferedDurableHeap heap = HandDriven(dir);
        var map = new PersistentHashMap<long, long>(heap, typeId: 1);
        long key = FillToHalf(map);
        using var parked = new ManualResetEventSlim();
        using var releaseUpdate = new ManualResetEventSlim();
        heap.InsideSlotLockForTesting = () =>
        {
            parked.Set();
            Assert.True(releaseUpdate.Wait(Workers.JoinTimeout));
        };
        var updater = new Thread(() => map.Set(0, 100)) { IsBackground = true };
        updater.Start();
        Assert.True(parked.Wait(Workers.JoinTimeout), "the update never took its slot");
        heap.InsideSlotLockForTesting = null;

        (Exception? failure, bool pending) = InterruptWhileBlocked(() => map.Set(key, 42), control, hold: () => { }, release: releaseUpdate.Set);
        Assert.True(updater.Join(Workers.JoinTimeout));
        Assert.True(map.TryGetValue(key, out long value) && value == 42, "the insert is in the map");
        Assert.True(map.TryGetValue(0, out long updated) && updated == 100, "the parked update is in the map");
        if (control)
        {
            // The old way: the interrupt taken for a key's hash failure, swallowed, and the index not grown.
            Assert.False(failure is null && pending && map.IndexCapacity > FirstCapacity, "the control's interrupt went through the slot wait, yet nothing was lost");
            return;
        }

        Assert.Null(failure);
        Assert.True(pending, "the interrupt was lost: the thread's next wait must still see it");
        Assert.Null(map.CoreForTesting.IndexForTesting.KeyHashFailure);
        Assert.True(map.IndexCapacity > FirstCapacity, "the index did not grow");
    }

    /// <summary>
    /// The interrupted read waits for the value of a key whose update is parked inside its slot lock (made to keep
    /// readers waiting for the whole update: the fault <see cref="DurabilityFaults.ReadersWaitForSlotLock"/>, used here
    /// only to hold a read in its retries for as long as the test needs).
    /// </summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void AnInterruptDuringAReadsRetries_NeitherFailsTheReadNorIsLost(bool control)
    {
        using var dir = new TempDirectory();
        using BufferedDurableHeap heap = HandDriven(dir, DurabilityFaults.ReadersWaitForSlotLock);
        var map = new PersistentHashMap<long, HashMapReadTests.Wide>(heap, typeId: 1);
        map.Set(7, HashMapReadTests.Wide.Of(70));
        using var parked = new ManualResetEventSlim();
        using var releaseUpdate = new ManualResetEventSlim();
        heap.InsideSlotLockForTesting = () =>
        {
            parked.Set();
            Assert.True(releaseUpdate.Wait(Workers.JoinTimeout));
        };
        var updater = new Thread(() => map.Set(7, HashMapReadTests.Wide.Of(71))) { IsBackground = true };
        updater.Start();
        Assert.True(parked.Wait(Workers.JoinTimeout), "the update never took its slot");
        heap.InsideSlotLockForTesting = null;

        var read = new HashMapReadTests.Wide[1];
        bool found = false;
        (Exception? failure, bool pending) = InterruptWhileBlocked(() => found = map.TryGetValue(7, out read[0]), control, hold: () => { }, release: releaseUpdate.Set);
        Assert.True(updater.Join(Workers.JoinTimeout));
        if (control)
        {
            Assert.IsType<ThreadInterruptedException>(failure);
            return;
        }

        Assert.Null(failure);
        Assert.True(pending, "the interrupt was lost: the thread's next wait must still see it");
        Assert.True(found && read[0].IsUniform && ((ReadOnlySpan<long>)read[0])[0] == 71, "the read returned a value the map never held");
    }

    private static BufferedDurableHeap HandDriven(TempDirectory dir, DurabilityFaults faults = DurabilityFaults.None) =>
        BufferedDurableHeap.Create(dir.File("g.heap"), new HeapFileOptions { Size = 4L << 20 }, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, Faults = faults });

    /// <summary>Fills the index to half its slots, so that the next insert asks for a growth; returns that insert's key.</summary>
    private static long FillToHalf(PersistentHashMap<long, long> map)
    {
        long key = 0;
        while (map.Count < FirstCapacity / 2)
        {
            map.Set(key, key);
            key++;
        }

        Assert.Equal(FirstCapacity, map.IndexCapacity);
        return key;
    }

    /// <summary>
    /// Runs <paramref name="call"/> on a new thread with an interrupt pending while the test holds what the call waits for
    /// (<paramref name="hold"/>); lets go (<paramref name="release"/>) once the call's wait caught the interrupt inside its
    /// shield. Returns what the call threw and whether the interrupt was still pending on its thread afterwards.
    /// </summary>
    private static (Exception? Failure, bool Pending) InterruptWhileBlocked(Action call, bool control, Action hold, Action release)
    {
        var caught = new ManualResetEventSlim(); // not disposed: a stale hook call must not throw
        Thread? caller = null;
        InterruptShield.InterruptCaughtForTesting = () =>
        {
            if (Thread.CurrentThread == caller)
            {
                caught.Set();
            }
        };
        hold();
        bool released = false;
        try
        {
            var interrupted = new InterruptedThread(call, control);
            caller = interrupted.Thread;
            caller.Start();
            Assert.True(caught.Wait(Workers.JoinTimeout), "the call never blocked inside its shield with the interrupt pending");
            release();
            released = true;
            Assert.True(caller.Join(Workers.JoinTimeout));
            return (interrupted.Failure, interrupted.InterruptPending);
        }
        finally
        {
            if (!released)
            {
                release();
            }

            InterruptShield.InterruptCaughtForTesting = null;
        }
    }
}
