using System;
using System.Collections.Generic;
using System.Reflection;
using System.Threading;
using Epvs.Tests;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// A review's findings on the interrupt shield and this session's refusals, each a test that failed before its fix:
/// an interrupt caught at a concurrent collection's lock inside a cycle (the public Replace/Delete's claims) still failed
/// the heap; an interrupt the last advance of Dispose absorbed was requested again inside Dispose, where a later wait
/// threw it (operations reported not durable, no clean shutdown); a parallel scan's helpers stopped when a Dispose began
/// on another thread (Dispose waits for the scan); an operation a thread left open in a disposed heap kept refusing its
/// operations on every other heap.
/// </summary>
[Collection(nameof(InterruptedWorkTests))]
public sealed class ShieldReviewTests
{
    private static readonly HeapFileOptions Small = new() { Size = 8L << 20, Domain = PersistenceDomainKind.MappedFile };

    private readonly ITestOutputHelper _output;

    public ShieldReviewTests(ITestOutputHelper output) => _output = output;

    /// <summary>A thread (not started) that takes every lock of <paramref name="locks"/>, sets <paramref name="held"/>, and releases them once <paramref name="release"/> is set.</summary>
    private static Thread Holder(object[] locks, ManualResetEventSlim held, ManualResetEventSlim release) => new(() =>
    {
        foreach (object l in locks)
        {
            Monitor.Enter(l);
        }

        held.Set();
        release.Wait(Workers.JoinTimeout);
        foreach (object l in locks)
        {
            Monitor.Exit(l);
        }
    })
    { IsBackground = true };

    /// <summary>The stripe locks of the heap's ConcurrentDictionary of caller retirements (reflection).</summary>
    private static object[] ClaimLocks(BufferedDurableHeap heap)
    {
        object dict = typeof(BufferedDurableHeap).GetField("_retiredByCallers", BindingFlags.Instance | BindingFlags.NonPublic)!.GetValue(heap)!;
        object tables = dict.GetType().GetField("_tables", BindingFlags.Instance | BindingFlags.NonPublic)!.GetValue(dict)!;
        return (object[])tables.GetType().GetField("_locks", BindingFlags.Instance | BindingFlags.NonPublic)!.GetValue(tables)!;
    }

    /// <summary>
    /// A cycle's reclamation (inside RunCycle's shield) forgets caller retirements through ConcurrentDictionary.TryRemove,
    /// which takes a plain Monitor lock: an interrupt of the thread running the cycle (a Sync) while that lock is contended
    /// escapes the shield, the cycle is recorded as failed and the heap fails for good.
    /// Expected (the shield's promise): Sync runs to its end, the heap goes on. Fails if the finding holds.
    /// </summary>
    [Fact]
    public void AnInterruptWhileTheClaimsDictionaryIsContended_DoesNotFailTheHeap()
    {
        using var dir = new TempDirectory();
        using BufferedDurableHeap heap = BufferedDurableHeap.Create(dir.File("claims.heap"), Small, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
        var blocks = new List<PayloadRef>();
        using (DurableOperation op = heap.BeginOperation())
        {
            for (int i = 0; i < 64; i++)
            {
                blocks.Add(op.Allocate(48, 7));
            }
        }

        heap.Sync();
        using (DurableOperation op = heap.BeginOperation())
        {
            foreach (PayloadRef block in blocks)
            {
                op.Delete(block); // public Delete: claims each retirement in _retiredByCallers
            }
        }

        Assert.True(heap.RetirementClaimsForTesting > 0);
        object[] locks = ClaimLocks(heap);
        using var held = new ManualResetEventSlim();
        using var release = new ManualResetEventSlim();
        Thread holder = Holder(locks, held, release);

        Exception? failure = null;
        bool hookRan = false;
        Thread? worker = null;
        heap.AfterReclaimMarkedForTesting = () =>
        {
            if (Thread.CurrentThread == worker && !hookRan)
            {
                hookRan = true;
                // Inside RunCycle's shield (AfterTransition → Reclaim), before the flush that forgets the claims.
                holder.Start();
                held.Wait(Workers.JoinTimeout);
                Thread.CurrentThread.Interrupt(); // pending: thrown at the dictionary's contended lock
            }
        };
        worker = new Thread(() =>
        {
            failure = Record.Exception(() =>
            {
                for (int i = 0; i < 4 && !hookRan; i++)
                {
                    heap.Sync();
                }
            });
            PendingInterrupt.TryConsume();
        })
        { IsBackground = true };
        // The stripe locks are released once the worker has caught the interrupt at one of them (absorbed, it waits on).
        InterruptShield.InterruptCaughtForTesting = () =>
        {
            if (Thread.CurrentThread == worker)
            {
                release.Set();
            }
        };
        try
        {
            worker.Start();
            Assert.True(worker.Join(Workers.JoinTimeout));
        }
        finally
        {
            release.Set();
            InterruptShield.InterruptCaughtForTesting = null;
            heap.AfterReclaimMarkedForTesting = null;
        }

        Assert.True(hookRan, "the reclamation of the deleted payloads never ran");
        Exception? after = Record.Exception(() =>
        {
            using (DurableOperation op = heap.BeginOperation())
            {
                op.Allocate(48, 7);
            }

            heap.Sync();
        });
        _output.WriteLine($"Sync threw {failure?.GetType().Name}: {failure?.Message}\nafter: {after?.GetType().Name}: {after?.Message}");
        Assert.Null(failure);
        Assert.Null(after);
    }

    /// <summary>
    /// ForEachAllocated used to complete while a Dispose on another thread waited for it (the call is protected). The
    /// scan's per-segment EnterOperation (3660c5b) checks the disposed flag first, so once a Dispose has begun elsewhere
    /// the scan stops at its next segment and throws (wrapped by Parallel.ForEach) instead of completing.
    /// </summary>
    [Fact]
    public void AScanRacingADisposeOnAnotherThread_StillCompletes()
    {
        using var dir = new TempDirectory();
        PersistentHeap heap = PersistentHeap.Create(dir.File("scan.heap"), Small);
        int allocated = 0;
        foreach (int size in new[] { 40, 200, 900, 3000 })
        {
            for (int i = 0; i < 4; i++)
            {
                heap.Allocate(size, 1);
                allocated++;
            }
        }

        int visited = 0;
        Thread? disposer = null;
        Exception? disposeFailure = null;
        Exception? scan = Record.Exception(() => heap.ForEachAllocated((block, header) =>
        {
            if (Interlocked.Increment(ref visited) == 1)
            {
                disposer = new Thread(() => disposeFailure = Record.Exception(heap.Dispose)) { IsBackground = true };
                disposer.Start();
                var spinner = new SpinWait();
                while (Volatile.Read(ref heap.File.DisposedFlagForTesting) == 0)
                {
                    spinner.SpinOnce();
                }
            }
        }));
        Assert.True(disposer!.Join(Workers.JoinTimeout));
        _output.WriteLine($"visited {visited} of {allocated}; scan threw {scan?.GetType().Name}: {scan?.Message} / {scan?.InnerException?.GetType().Name}; dispose: {disposeFailure?.Message}");
        Assert.Null(scan);
        Assert.Equal(allocated, visited);
    }

    /// <summary>
    /// A thread that leaked a DurableOperation of one heap (never disposed) used to be refused every operation of any
    /// other BufferedDurableHeap, for good, even after the first heap was disposed. An operation left open in a disposed
    /// heap no longer counts.
    /// </summary>
    [Fact]
    public void ALeakedOperationOfADisposedHeap_DoesNotRefuseTheThreadsOperationsOnOtherHeaps()
    {
        using var dir = new TempDirectory();
        Exception? failure = null;
        bool disposeEnded = false;
        var t = new Thread(() =>
        {
            BufferedDurableHeap a = BufferedDurableHeap.Create(dir.File("a.heap"), Small, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, SyncTimeout = TimeSpan.FromMilliseconds(200) });
            _ = a.BeginOperation(); // leaked
            var d = new Thread(() => Record.Exception(a.Dispose)) { IsBackground = true };
            d.Start();
            disposeEnded = d.Join(Workers.JoinTimeout);
            if (!disposeEnded)
            {
                return;
            }

            using BufferedDurableHeap b = BufferedDurableHeap.Create(dir.File("b.heap"), Small, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
            failure = Record.Exception(() =>
            {
                using DurableOperation op = b.BeginOperation();
            });
        })
        { IsBackground = true };
        t.Start();
        Assert.True(t.Join(Workers.JoinTimeout));
        Assert.True(disposeEnded, "A's Dispose hung");
        _output.WriteLine($"b.BeginOperation threw {failure?.GetType().Name}: {failure?.Message}");
        Assert.Null(failure);
    }
    /// <summary>
    /// Dispose's waits absorb an interrupt and hold it until Dispose ends (Dispose's shield). An interrupt that Dispose's
    /// own last advance absorbs inside RunCycle's shield is requested again when that scope ends — in the middle of
    /// Dispose — and SaveStateForReopen's plain (unshielded) pool lock then throws it: Dispose reports that operations
    /// were not made durable (all were) and leaves no clean-shutdown mark / saved state.
    /// </summary>
    [Fact]
    public void AnInterruptAbsorbedInDisposesLastAdvance_DoesNotFailTheRestOfDispose()
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "private mapping fence gate");
        using var dir = new TempDirectory();
        var opts = new HeapFileOptions { Size = 8L << 20, Domain = PersistenceDomainKind.MappedFile, MappedFileWriteBack = MappedFileWriteBack.PrivateMapping };
        BufferedDurableHeap heap = BufferedDurableHeap.Create(dir.File("dispose.heap"), opts, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
        var map = new PersistentHashMap<int, int>(heap, typeId: 1);
        for (int k = 0; k < 100; k++)
        {
            map.Set(k, k);
        }

        heap.Sync();
        for (int k = 100; k < 200; k++)
        {
            map.Set(k, k); // inserts only: no frees, so the last cycle takes no pool lock
        }

        var domain = (MappedFilePersistenceDomain)heap.Heap.File.Domain;
        object syncGate = typeof(MappedFilePersistenceDomain).GetField("_syncGate", BindingFlags.Instance | BindingFlags.NonPublic)!.GetValue(domain)!;
        var pools = (object[])typeof(PersistentHeap).GetField("_pools", BindingFlags.Instance | BindingFlags.NonPublic)!.GetValue(heap.Heap)!;
        using var gateHeld = new ManualResetEventSlim();
        using var poolsHeld = new ManualResetEventSlim();
        var releaseGate = new ManualResetEventSlim();
        var releasePools = new ManualResetEventSlim();
        var gateHolder = new Thread(() =>
        {
            Monitor.Enter(syncGate);
            gateHeld.Set();
            releaseGate.Wait(Workers.JoinTimeout);
            Monitor.Exit(syncGate);
        })
        { IsBackground = true };
        var poolHolder = new Thread(() =>
        {
            foreach (object p in pools) Monitor.Enter(p);
            poolsHeld.Set();
            releasePools.Wait(Workers.JoinTimeout);
            foreach (object p in pools) Monitor.Exit(p);
        })
        { IsBackground = true };
        Thread? disposer = null;
        bool interrupted = false;
        bool absorbed = false;
        heap.BeforeSealForTesting = _ =>
        {
            if (Thread.CurrentThread == disposer && !interrupted)
            {
                interrupted = true;
                gateHolder.Start();
                gateHeld.Wait(Workers.JoinTimeout);
                Thread.CurrentThread.Interrupt(); // the write-back's fence blocks on the held gate: the shield absorbs it
            }
        };
        InterruptShield.InterruptCaughtForTesting = () =>
        {
            if (Thread.CurrentThread == disposer)
            {
                absorbed = true;
                releaseGate.Set();
            }
        };
        Exception? failure = null;
        try
        {
            poolHolder.Start();
            Assert.True(poolsHeld.Wait(Workers.JoinTimeout));
            disposer = new Thread(() =>
            {
                failure = Record.Exception(heap.Dispose);
                PendingInterrupt.TryConsume();
            })
            { IsBackground = true };
            disposer.Start();

            // The pools stay held until the disposer, past the interrupt its last advance absorbed, blocks on one of them
            // (its next wait: the gate is released): then the interrupt, if it was requested again inside Dispose, is
            // thrown there. Polled, with the disposer's end as the other way out.
            var spinner = new SpinWait();
            while (!disposer.Join(0) && !(Volatile.Read(ref absorbed) && (disposer.ThreadState & ThreadState.WaitSleepJoin) != 0 && !gateHolder.IsAlive))
            {
                spinner.SpinOnce(sleep1Threshold: -1);
            }

            releasePools.Set();
            Assert.True(disposer.Join(Workers.JoinTimeout));
        }
        finally
        {
            releaseGate.Set();
            releasePools.Set();
            InterruptShield.InterruptCaughtForTesting = null;
        }

        _output.WriteLine($"interrupted in the last advance: {interrupted}, absorbed by the shield: {absorbed}; Dispose threw {failure?.GetType().Name}: {failure?.Message}");
        Assert.True(interrupted && absorbed, "the scenario did not happen");
        Assert.Null(failure);
    }

    /// <summary>
    /// A probe's finding: a byte map's update that changes the value's size within its version replaces the payload by a
    /// copy under a new uid, then allocates an anti-payload for the old one. An interrupt at a pool's lock in the second
    /// allocation skipped the undo of the first (it undid only for a full heap): the copy stayed live beside the current
    /// payload, and the reopen refused the file (two live payloads of one key). Here the anti-payload's class pool is
    /// held by another thread when the replacing thread, interrupted, allocates it (a fresh thread, whose cache of that
    /// class is empty). The control (<see cref="DurabilityFaults.UndoCopyOnlyWhenFull"/>) is the old replace.
    /// </summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void AnInterruptBetweenAReplacesCopyAndItsAntiPayload_LeavesOneLivePayloadPerKey(bool control)
    {
        using var dir = new TempDirectory();
        string path = dir.File("replace.heap");
        var options = new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, Faults = control ? DurabilityFaults.UndoCopyOnlyWhenFull : DurabilityFaults.None };
        Exception? set = null;
        bool caught = false;
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, Small, options))
        {
            var map = new PersistentByteMap<long>(heap, typeId: 1);
            var pools = (object[])typeof(PersistentHeap).GetField("_pools", BindingFlags.Instance | BindingFlags.NonPublic)!.GetValue(heap.Heap)!;
            object antiPool = pools[0];
            using var held = new ManualResetEventSlim();
            using var release = new ManualResetEventSlim();
            var holder = new Thread(() =>
            {
                Monitor.Enter(antiPool);
                held.Set();
                release.Wait(Workers.JoinTimeout);
                Monitor.Exit(antiPool);
            })
            { IsBackground = true };
            Thread? replacer = null;
            heap.AfterReplaceCopiedForTesting = _ =>
            {
                if (Thread.CurrentThread == replacer)
                {
                    holder.Start();
                    held.Wait(Workers.JoinTimeout);
                    Thread.CurrentThread.Interrupt(); // pending: thrown at the anti-payload pool's contended lock
                }
            };
            InterruptShield.InterruptCaughtForTesting = () =>
            {
                if (Thread.CurrentThread == replacer)
                {
                    caught = true;
                    release.Set();
                }
            };
            try
            {
                replacer = new Thread(() =>
                {
                    map.Set(7, new byte[100]); // an insert of one size class (this thread allocates nothing of class 0)
                    set = Record.Exception(() => map.Set(7, new byte[300])); // another size, same version: copy + anti-payload
                    PendingInterrupt.TryConsume();
                })
                { IsBackground = true };
                replacer.Start();
                Assert.True(replacer.Join(Workers.JoinTimeout));
            }
            finally
            {
                release.Set();
                InterruptShield.InterruptCaughtForTesting = null;
                heap.AfterReplaceCopiedForTesting = null;
            }

            _output.WriteLine($"control {control}: Set threw {set?.GetType().Name}: {set?.Message}; interrupt caught inside the shield: {caught}");
            if (control)
            {
                Assert.IsType<ThreadInterruptedException>(set);
            }
            else
            {
                Assert.Null(set);
                Assert.True(caught, "the anti-payload's allocation never waited with the interrupt pending");
                Assert.Equal(300, map.Get(7)!.Length);
            }

            heap.Sync();
        }

        Exception? reopen = Record.Exception(() =>
        {
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(path, Small);
            var map = new PersistentByteMap<long>(heap, typeId: 1);
            Assert.Equal(control ? 100 : 300, map.Get(7)!.Length);
        });
        if (control)
        {
            // The copy stayed live beside the current payload: the reopen refuses the file.
            Assert.IsType<System.IO.InvalidDataException>(reopen);
            return;
        }

        Assert.Null(reopen);
    }

    /// <summary>
    /// A probe's finding: a Replace or Delete that fails after taking its retirement claim gives the claim back through
    /// the claims dictionary, whose lock is a wait; interrupted there (outside any shield), the claim stayed on a payload
    /// that is still live, and every later Replace or Delete of it was refused for the rest of the session. The give-back
    /// now runs to its end. Here the Replace fails on its size (after its claim), and the dictionary's locks are held
    /// when it gives the claim back with an interrupt pending; they are released once the interrupt is caught.
    /// </summary>
    [Fact]
    public void AnInterruptedClaimGiveBack_LeavesNoClaimOnALivePayload()
    {
        using var dir = new TempDirectory();
        using BufferedDurableHeap heap = BufferedDurableHeap.Create(dir.File("claim.heap"), Small, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
        PayloadRef current;
        using (DurableOperation op = heap.BeginOperation())
        {
            current = op.Allocate(100, 7);
        }

        heap.Sync(); // an older version's payload: the replace copies under its uid, without a shield
        object[] locks = ClaimLocks(heap);
        using var held = new ManualResetEventSlim();
        using var release = new ManualResetEventSlim();
        Thread holder = Holder(locks, held, release);
        Thread? replacer = null;
        heap.ClaimGivenBackForTesting = () =>
        {
            if (Thread.CurrentThread == replacer)
            {
                holder.Start();
                held.Wait(Workers.JoinTimeout);
                Thread.CurrentThread.Interrupt(); // pending: thrown at the dictionary's contended lock
            }
        };
        InterruptShield.InterruptCaughtForTesting = () =>
        {
            if (Thread.CurrentThread == replacer)
            {
                release.Set();
            }
        };
        Exception? failure = null;
        try
        {
            replacer = new Thread(() =>
            {
                using (DurableOperation op = heap.BeginOperation())
                {
                    try
                    {
                        op.Replace(current, int.MaxValue);
                    }
                    catch (Exception e)
                    {
                        failure = e;
                    }
                }

                PendingInterrupt.TryConsume();
            })
            { IsBackground = true };
            replacer.Start();
            Assert.True(replacer.Join(Workers.JoinTimeout));
        }
        finally
        {
            release.Set();
            heap.ClaimGivenBackForTesting = null;
            InterruptShield.InterruptCaughtForTesting = null;
        }

        _output.WriteLine($"Replace threw {failure?.GetType().Name}: {failure?.Message}; claims left {heap.RetirementClaimsForTesting}");
        Assert.IsType<ArgumentOutOfRangeException>(failure);
        Assert.Equal(0, heap.RetirementClaimsForTesting);
        using (DurableOperation op = heap.BeginOperation())
        {
            op.Replace(current, 200); // the live payload can still be replaced
        }
    }
}
