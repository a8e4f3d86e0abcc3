using System;
using System.IO;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// Issue 10, integrity in <see cref="DurabilityMode.Strict"/>: its payloads used to be written back by their operations
/// and never sealed, so a flipped payload bit reopened as a silently wrong value and a flipped header bit as a torn
/// allocation, freed without a report. The cycle that ends a version now seals strict payloads as it seals buffered
/// ones (they are durable before it: each operation fenced its own write-back), so a flip in a live block of a heap
/// written in strict mode is reported — after a clean close and as after a crash. The control leaves them unsealed and
/// must be caught opening silently wrong.
/// </summary>
public sealed class StrictModeSealTests
{
    private const int TypeId = 1;
    private const int Entries = 500;
    private static readonly HeapFileOptions FileOptions = new() { Size = 4L << 20, Domain = PersistenceDomainKind.MappedFile };

    /// <summary>Where in the block the flip lands: a bit of the value, or of the header's epoch word.</summary>
    public enum Flip
    {
        PayloadValue,
        HeaderEpoch,
    }

    [Theory]
    [InlineData(Flip.PayloadValue, false)]
    [InlineData(Flip.PayloadValue, true)]
    [InlineData(Flip.HeaderEpoch, false)]
    [InlineData(Flip.HeaderEpoch, true)]
    public void AFlipInALiveBlockOfAStrictHeap_IsReportedAsDamage(Flip flip, bool crashed)
    {
        using var dir = new TempDirectory();
        (string outcome, long victim, HeapFileException? refused) = FlipAndReopen(dir, flip, crashed, DurabilityFaults.None);
        Assert.True(refused is not null, outcome);
        Assert.Equal(HeapFileError.Corrupt, refused!.Error);
        Assert.Equal(new[] { victim }, refused.DamagedBlocks);
    }

    [Theory]
    [InlineData(Flip.PayloadValue)]
    [InlineData(Flip.HeaderEpoch)]
    public void Control_StrictPayloadsLeftUnsealed_OpenSilentlyWrong(Flip flip)
    {
        using var dir = new TempDirectory();
        (string outcome, _, HeapFileException? refused) = FlipAndReopen(dir, flip, crashed: true, DurabilityFaults.LeaveStrictPayloadsUnsealed);
        Assert.True(refused is null, $"the control was refused ({refused?.Message}): the test cannot tell sealed from unsealed strict payloads");
        Assert.Contains("silently", outcome, StringComparison.Ordinal);
    }

    [Fact]
    public void StrictHeap_AfterItsCycles_HasEveryLiveBlockSealed_AndReopensWithItsData()
    {
        using var dir = new TempDirectory();
        string path = CreateStrictMap(dir, DurabilityFaults.None);
        byte[] bytes = File.ReadAllBytes(path);
        foreach (long offset in ZeroedWordDamageTests.LiveBlocks(bytes))
        {
            Assert.Equal(HeapLayout.StateSealed, HeapLayout.CommitState(BitConverter.ToUInt64(bytes, (int)offset + HeapLayout.CommitOffset)));
        }

        using BufferedDurableHeap heap = BufferedDurableHeap.Open(path, FileOptions, new BufferedDurableHeapOptions { Mode = DurabilityMode.Strict, AdvancePeriod = Timeout.InfiniteTimeSpan });
        var map = new PersistentHashMap<long, long>(heap, TypeId);
        Assert.Equal(Entries, map.Count);
        for (long k = 0; k < Entries; k++)
        {
            Assert.True(map.TryGetValue(k, out long v) && v == Value(k), $"key {k}");
        }
    }

    /// <summary>
    /// A strict operation that calls a structure (whose operation nests in it) between allocating its own payload and
    /// writing it. The nested operation's end writes back the thread's pending payloads and used to empty the list, so the
    /// enclosing operation's later stores were never written back, and the cycle sealed the block over stale bytes:
    /// after Sync the durable image was refused as corrupt, and through a private mapping so was the file after a clean
    /// close (before seals, the payload came back as zeros). The enclosing operation's end must write it back again.
    /// </summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void AStoreAfterANestedOperationEnded_IsWrittenBackByTheEnclosingOperation(bool cleanCloseThroughPrivateMapping)
    {
        const int OwnType = 7;
        var options = new BufferedDurableHeapOptions { Mode = DurabilityMode.Strict, AdvancePeriod = Timeout.InfiniteTimeSpan };
        void Write(BufferedDurableHeap heap)
        {
            var map = new PersistentHashMap<long, long>(heap, TypeId);
            using DurableOperation op = heap.BeginOperation();
            PayloadRef own = op.Allocate(8000, OwnType);
            map.Set(1, 100);
            op.GetPayload(own).Fill(0xCD);
        }

        void Verify(BufferedDurableHeap heap)
        {
            RecoveredPayload own = Assert.Single(heap.TakeRecoveredPayloads(OwnType));
            Assert.True(heap.Heap.GetPayload(own.Block).IndexOfAnyExcept((byte)0xCD) < 0, "the enclosing operation's payload is not the one it wrote");
            Assert.True(new PersistentHashMap<long, long>(heap, TypeId).TryGetValue(1, out long v) && v == 100);
        }

        if (cleanCloseThroughPrivateMapping)
        {
            using var dir = new TempDirectory();
            string path = dir.File("nested.heap");
            var fileOptions = new HeapFileOptions { Size = 4L << 20, Domain = PersistenceDomainKind.MappedFile, MappedFileWriteBack = MappedFileWriteBack.PrivateMapping };
            using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, fileOptions, options))
            {
                Write(heap);
            }

            using BufferedDurableHeap reopened = BufferedDurableHeap.Open(path, fileOptions, options);
            Verify(reopened);
        }
        else
        {
            using var domain = new SimulatedPersistenceDomain(4 << 20);
            using HeapFile file = HeapFile.Create(domain);
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, options);
            Write(heap);
            heap.Sync();

            // The power fails right after Sync returned.
            using var image = SimulatedPersistenceDomain.FromImage(domain.GetDurableImage());
            using HeapFile again = HeapFile.Open(image);
            using BufferedDurableHeap recovered = BufferedDurableHeap.Open(again, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
            Verify(recovered);
        }
    }

    /// <summary>
    /// A nested operation whose write-back fails hands its thread's pending blocks — the enclosing operation's too — to
    /// the next cycle. That may be the cycle of the previous version, run while the enclosing operation is still open, so
    /// the carried copy can reach the file before the enclosing operation's later stores: the enclosing operation's own
    /// end must still write its blocks back (it used to find its list emptied, and the cycle of its version sealed over
    /// bytes the file never got: a Synced operation refused as damage after a crash).
    /// </summary>
    [Fact]
    public void ANestedOperationsFailedWriteBack_LeavesTheEnclosingOperationsLaterStoresToItsOwnEnd()
    {
        const int OwnType = 7;
        var options = new BufferedDurableHeapOptions { Mode = DurabilityMode.Strict, AdvancePeriod = Timeout.InfiniteTimeSpan };
        using var domain = new SimulatedPersistenceDomain(4 << 20);
        using HeapFile file = HeapFile.Create(domain);
        using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, options);
        using var firstOpen = new ManualResetEventSlim();
        using var syncTimedOut = new ManualResetEventSlim();
        using var nestedFailed = new ManualResetEventSlim();
        using var cycleRan = new ManualResetEventSlim();
        int failOnce = 0;
        heap.BeforeStrictWriteBackForTesting = () =>
        {
            if (Interlocked.Exchange(ref failOnce, 0) == 1)
            {
                throw new IOException("simulated write-back failure");
            }
        };

        Exception? workerError = null;
        var worker = new Thread(() =>
        {
            try
            {
                // Holds the transition to the next version in flight (a Sync times out) until it leaves.
                using (heap.BeginOperation())
                {
                    firstOpen.Set();
                    Assert.True(syncTimedOut.Wait(10_000));
                }

                using DurableOperation enclosing = heap.BeginOperation();
                PayloadRef own = enclosing.Allocate(4000, OwnType);
                enclosing.GetPayload(own).Fill(0xAA);
                Volatile.Write(ref failOnce, 1);
                try
                {
                    using DurableOperation nested = heap.BeginOperation();
                    nested.Allocate(16, OwnType + 1);
                }
                catch (IOException)
                {
                    // The nested operation's write-back failed; the caller carries on with its own operation.
                }

                nestedFailed.Set();
                Assert.True(cycleRan.Wait(10_000));
                enclosing.GetPayload(own).Fill(0xBB);
            }
            catch (Exception e)
            {
                workerError = e;
                nestedFailed.Set();
            }
        });
        worker.Start();
        Assert.True(firstOpen.Wait(10_000));
        Assert.Throws<TimeoutException>(() => heap.Sync(TimeSpan.FromMilliseconds(200)));
        syncTimedOut.Set();
        Assert.True(nestedFailed.Wait(10_000));

        // The cycle of the previous version runs now (its transition completed when the first operation left), while
        // the enclosing operation is open: it writes the carried blocks back.
        Assert.Throws<TimeoutException>(() => heap.Sync(TimeSpan.FromMilliseconds(200)));
        cycleRan.Set();
        Assert.True(worker.Join(10_000));
        Assert.Null(workerError);
        heap.Sync();

        // Power fails after Sync returned.
        using var image = SimulatedPersistenceDomain.FromImage(domain.GetDurableImage());
        using HeapFile again = HeapFile.Open(image);
        using BufferedDurableHeap recovered = BufferedDurableHeap.Open(again, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
        RecoveredPayload payload = Assert.Single(recovered.TakeRecoveredPayloads(OwnType));
        Assert.True(recovered.Heap.GetPayload(payload.Block).IndexOfAnyExcept((byte)0xBB) < 0, "the enclosing operation's payload is not what it wrote");
    }

    /// <summary>
    /// Writes a strict map (every key set, then half of them updated in a later version, some of them twice in one
    /// version: in place), closes it cleanly, flips one bit of one live block and reopens: the outcome in words, the
    /// block, and the refusal if the open refused.
    /// </summary>
    private static (string Outcome, long Victim, HeapFileException? Refused) FlipAndReopen(TempDirectory dir, Flip flip, bool crashed, DurabilityFaults faults)
    {
        string path = CreateStrictMap(dir, faults);
        byte[] bytes = File.ReadAllBytes(path);
        long victim = -1;
        foreach (long offset in ZeroedWordDamageTests.LiveBlocks(bytes))
        {
            // A block of the map (its payload is a key and a value), not the structure's own descriptor.
            if (BitConverter.ToInt32(bytes, (int)offset + HeapLayout.ShapeOffset) == 2 * sizeof(long))
            {
                victim = offset;
                break;
            }
        }

        Assert.True(victim >= 0, "no live block of the map");
        long key = BitConverter.ToInt64(bytes, (int)victim + HeapLayout.HeaderSize);
        int at = flip == Flip.PayloadValue ? HeapLayout.HeaderSize + sizeof(long) + 1 : HeapLayout.EpochOffset;
        bytes[victim + at] ^= 0x04;
        ZeroedWordDamageTests.WriteDamaged(path, bytes, crashed);

        try
        {
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(path, FileOptions, new BufferedDurableHeapOptions { Mode = DurabilityMode.Strict, AdvancePeriod = Timeout.InfiniteTimeSpan });
            var map = new PersistentHashMap<long, long>(heap, TypeId);
            bool found = map.TryGetValue(key, out long value);
            string outcome = !found ? $"opened silently without key {key}"
                : value != Value(key) ? $"opened silently with key {key} = {value} (wrote {Value(key)})"
                : map.Count != Entries ? $"opened silently with {map.Count} of {Entries} entries"
                : "opened with every entry intact";
            return (outcome, victim, null);
        }
        catch (HeapFileException e)
        {
            return ($"refused: {e.Message}", victim, e);
        }
    }

    private static string CreateStrictMap(TempDirectory dir, DurabilityFaults faults)
    {
        string path = dir.File("strict.heap");
        var options = new BufferedDurableHeapOptions { Mode = DurabilityMode.Strict, AdvancePeriod = Timeout.InfiniteTimeSpan, Faults = faults };
        using BufferedDurableHeap heap = BufferedDurableHeap.Create(path, FileOptions, options);
        var map = new PersistentHashMap<long, long>(heap, TypeId);
        for (long k = 0; k < Entries; k++)
        {
            map.Set(k, k);
        }

        heap.AdvanceVersion(Timeout.InfiniteTimeSpan);
        for (long k = 0; k < Entries; k += 2)
        {
            map.Set(k, -1);
            map.Set(k, Value(k));
        }

        for (long k = 1; k < Entries; k += 2)
        {
            map.Set(k, Value(k));
        }

        return path;
    }

    private static long Value(long key) => (key * 7919) + 3;
}
