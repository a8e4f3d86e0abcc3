using System;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// Issue 10, integrity of blocks: a sealed block's check covers its header and payload, so every single-bit flip of
/// either is damage (never a valid, free or torn block), and recovery reports damage — with the blocks' offsets,
/// before it frees anything — or, when asked to salvage, drops exactly the damaged blocks and lists them.
/// </summary>
public sealed unsafe class BlockIntegrityTests
{
    private const int TypeId = 11;
    private const int Entries = 40;

    /// <summary>Payload sizes whose bytes the seal's CRC takes 8, 4, 2 and 1 at a time, up to the longest it takes raw, and past it (their XxHash3).</summary>
    public static TheoryData<int> PayloadSizes => new(0, 7, 16, 40, HeapLayout.RawCheckedPayload, HeapLayout.RawCheckedPayload + 1, 300);

    [Theory]
    [MemberData(nameof(PayloadSizes))]
    public void SealedBlock_EverySingleBitFlipOfHeaderOrPayload_IsDamageNeverAValidFreeOrTornBlock(int payloadSize)
    {
        var random = new Random(20261123);
        byte[] block = new byte[HeapLayout.HeaderSize + payloadSize];
        for (int sample = 0; sample < 20; sample++)
        {
            long offset = 4096 * 3 + (64L * random.Next(1000));
            uint generation = (uint)random.Next(1, 1 << 24);
            var kind = (PayloadKind)random.Next(1, 4);
            random.NextBytes(block.AsSpan(HeapLayout.HeaderSize));
            ulong uid = (ulong)random.NextInt64(1, long.MaxValue), epoch = (ulong)random.Next(1, 1000), shape = HeapLayout.Shape(payloadSize, random.Next(1 << 20));
            ulong commit = HeapLayout.SealedCommit(uid, epoch, shape, offset, generation, kind, block.AsSpan(HeapLayout.HeaderSize));
            BitConverter.TryWriteBytes(block.AsSpan(0), uid);
            BitConverter.TryWriteBytes(block.AsSpan(8), epoch);
            BitConverter.TryWriteBytes(block.AsSpan(16), shape);
            BitConverter.TryWriteBytes(block.AsSpan(24), commit);
            fixed (byte* p = block)
            {
                Assert.Equal(BlockState.Sealed, HeapLayout.Classify(p, offset, generation, 1024, out PayloadHeader header));
                Assert.Equal(((long)uid, (long)epoch, kind, payloadSize), (header.Uid, header.EpochTag, header.Kind, header.Size));
                for (int bit = 0; bit < block.Length * 8; bit++)
                {
                    p[bit / 8] ^= (byte)(1 << (bit % 8));
                    BlockState state = HeapLayout.Classify(p, offset, generation, 1024, out _);
                    p[bit / 8] ^= (byte)(1 << (bit % 8));
                    Assert.True(state == BlockState.Damaged, $"sample {sample}: flipping bit {bit} gave {state}");
                }
            }
        }
    }

    /// <summary>
    /// Format 11 pins its checks to CRC-32C (Castagnoli) of the words the format names, little-endian: against a
    /// bitwise reference (which gives the standard check value of "123456789"), not against the library's own code. A
    /// different algorithm, word, order or seed is a different file format, which this catches.
    /// </summary>
    [Theory]
    [MemberData(nameof(PayloadSizes))]
    public void Checks_AreCrc32COfTheWordsTheFormatNames(int payloadSize)
    {
        Assert.Equal(0xE306_9283u, ReferenceCrc32C("123456789"u8));
        var random = new Random(20261203 + payloadSize);
        for (int sample = 0; sample < 20; sample++)
        {
            long offset = 4096 * 3 + (16L * random.Next(100_000));
            uint generation = (uint)random.Next(0, 1 << 24);
            ulong uid = (ulong)random.NextInt64(), epoch = (ulong)random.NextInt64(), shape = HeapLayout.Shape(payloadSize, random.Next(1 << 20));
            var kind = (PayloadKind)random.Next(1, 4);
            byte[] payload = new byte[payloadSize];
            random.NextBytes(payload);
            ulong place = (ulong)offset ^ ((ulong)generation << 40);

            ulong allocated = HeapLayout.AllocatedCommit(uid, epoch, shape, offset, generation, kind);
            Assert.Equal(ReferenceCrc32C(Words(uid, epoch, shape, place, allocated & ~0xFFFF_FFFFUL)), (uint)allocated);

            ulong sealedCommit = HeapLayout.SealedCommit(uid, epoch, shape, offset, generation, kind, payload);
            // (The cut-off as a literal: moving it changes the format.)
            byte[] covered = payloadSize > 64 ? Words(System.IO.Hashing.XxHash3.HashToUInt64(payload)) : payload;
            Assert.Equal(ReferenceCrc32C([.. Words(uid, epoch, shape, place, sealedCommit & ~0xFFFF_FFFFUL), .. covered]), (uint)sealedCommit);

            foreach (ulong empty in new[] { HeapLayout.FreeWord(offset, generation), HeapLayout.UnusedWord(offset, generation) })
            {
                Assert.Equal(ReferenceCrc32C(Words(place, empty & ~0xFFFF_FFFFUL)), (uint)empty);
            }
        }
    }

    private static byte[] Words(params ulong[] words)
    {
        byte[] bytes = new byte[words.Length * sizeof(ulong)];
        for (int i = 0; i < words.Length; i++)
        {
            System.Buffers.Binary.BinaryPrimitives.WriteUInt64LittleEndian(bytes.AsSpan(i * sizeof(ulong)), words[i]);
        }

        return bytes;
    }

    /// <summary>CRC-32C bit by bit (reflected polynomial 0x82F63B78, initial and final XOR 0xFFFFFFFF).</summary>
    private static uint ReferenceCrc32C(ReadOnlySpan<byte> bytes)
    {
        uint crc = 0xFFFF_FFFFu;
        foreach (byte b in bytes)
        {
            crc ^= b;
            for (int bit = 0; bit < 8; bit++)
            {
                crc = (crc & 1) != 0 ? (crc >> 1) ^ 0x82F6_3B78u : crc >> 1;
            }
        }

        return ~crc;
    }

    [Fact]
    public void UnusedAndFreeWords_AreChecked_ZeroEverySingleBitFlipAndAMovedWordAreDamage()
    {
        var random = new Random(20261124);
        byte[] block = new byte[HeapLayout.HeaderSize];
        fixed (byte* p = block)
        {
            ulong* h = (ulong*)p;
            for (int sample = 0; sample < 50; sample++)
            {
                long offset = 4096 * 3 + (64L * random.Next(1000));
                uint generation = (uint)random.Next(0, 1 << 24);
                random.NextBytes(block);
                foreach ((ulong word, BlockState state) in new[] { (HeapLayout.UnusedWord(offset, generation), BlockState.Unused), (HeapLayout.FreeWord(offset, generation), BlockState.Free) })
                {
                    // Uid, Epoch and Shape are not covered (an interrupted allocation may have overwritten them).
                    h[3] = word;
                    Assert.Equal(state, HeapLayout.Classify(p, offset, generation, 1024, out _));
                    Assert.Equal(BlockState.Damaged, HeapLayout.Classify(p, offset + 64, generation, 1024, out _));
                    Assert.Equal(BlockState.Damaged, HeapLayout.Classify(p, offset, (generation + 1) & HeapLayout.GenerationMask, 1024, out _));
                    for (int bit = 0; bit < 64; bit++)
                    {
                        h[3] = word ^ (1UL << bit);
                        BlockState flipped = HeapLayout.Classify(p, offset, generation, 1024, out _);
                        Assert.True(flipped == BlockState.Damaged, $"sample {sample}: flipping bit {bit} of 0x{word:X16} ({state}) gave {flipped}");
                    }
                }

                h[3] = 0;
                Assert.Equal(BlockState.Damaged, HeapLayout.Classify(p, offset, generation, 1024, out _));
            }
        }
    }

    [Theory]
    [InlineData(16, 77u)]
    [InlineData(0, 0x5_0003u)]
    [InlineData(16, 0x5_0003u)]
    [InlineData(65, 0x5_0003u)]
    public void AllocatedOrSealedCommit_WithItsStateChanged_IsDamage(int payloadSize, uint generation)
    {
        // A generation whose low 16 bits are the version's tag (3) lets a sealed word damaged to "allocated" past the
        // generation filter, to the check that tells it from a torn allocation (its check is the seal's of the same words).
        byte[] block = new byte[HeapLayout.HeaderSize + payloadSize];
        new Random(payloadSize).NextBytes(block.AsSpan(HeapLayout.HeaderSize));
        const long Offset = 4096 * 5;
        uint Generation = generation;
        ulong uid = 9, epoch = 3, shape = HeapLayout.Shape(payloadSize, 5);
        fixed (byte* p = block)
        {
            ulong* h = (ulong*)p;
            h[0] = uid;
            h[1] = epoch;
            h[2] = shape;
            ulong[] commits =
            {
                HeapLayout.AllocatedCommit(uid, epoch, shape, Offset, Generation, PayloadKind.Alloc),
                HeapLayout.SealedCommit(uid, epoch, shape, Offset, Generation, PayloadKind.Update, block.AsSpan(HeapLayout.HeaderSize)),
            };
            foreach (ulong commit in commits)
            {
                // Sealed to allocated included (two bits apart): an allocated word's check is the header's, which fails
                // there, but it is the seal's check of the same words — damage, which no crash leaves, not a torn allocation.
                foreach (ulong state in new[] { HeapLayout.StateFree, HeapLayout.StateUnused, HeapLayout.StateAllocated, HeapLayout.StateSealed }.Where(state => state != HeapLayout.CommitState(commit)))
                {
                    // The adversary's one-byte edit: the state nibble replaced, kind and check left.
                    h[3] = (commit & ~(0xFUL << 52)) | (state << 52);
                    Assert.Equal(BlockState.Damaged, HeapLayout.Classify(p, Offset, Generation, 1024, out _));
                    if (state == HeapLayout.StateAllocated && (ushort)Generation == (ushort)epoch)
                    {
                        // Reached the seal's check (not refused for another generation first).
                        Assert.True(HeapLayout.SameGeneration(h[3], Generation));
                    }
                }
            }
        }
    }

    /// <summary>The same damage on a file: recovery refuses it (clean close and crash alike) instead of freeing a live entry as torn.</summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void Recovery_ASealedBlockWhoseStateReadsAllocated_IsRefusedAsDamage(bool crashed)
    {
        using var dir = new TempDirectory();
        string path = dir.File("state.heap");
        var fileOptions = new HeapFileOptions { Size = 4L << 20, Domain = PersistenceDomainKind.MappedFile };
        var options = new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan };
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, fileOptions, options))
        {
            var map = new PersistentHashMap<long, long>(heap, 1);
            for (long k = 0; k < 2000; k++)
            {
                map.Set(k, k * 3);
            }
        }

        byte[] bytes = File.ReadAllBytes(path);
        long victim = ZeroedWordDamageTests.LiveBlocks(bytes)[100];
        Assert.Equal(HeapLayout.StateSealed, HeapLayout.CommitState(BitConverter.ToUInt64(bytes, (int)victim + HeapLayout.CommitOffset)));
        int stateByte = (int)victim + HeapLayout.CommitOffset + 6;
        bytes[stateByte] = (byte)((bytes[stateByte] & 0x0F) | (byte)(HeapLayout.StateAllocated << 4));
        ZeroedWordDamageTests.WriteDamaged(path, bytes, crashed);

        HeapFileException refused = Assert.Throws<HeapFileException>(() => BufferedDurableHeap.Open(path, fileOptions, options).Dispose());
        Assert.Equal(HeapFileError.Corrupt, refused.Error);
        Assert.Equal(new[] { victim }, refused.DamagedBlocks);
    }

    [Fact]
    public void TornAllocation_AnySubsetOfTheFourStoresDurableOverAnUnusedOrFreeWord_IsFreeNeverDamage()
    {
        var random = new Random(20261125);
        byte[] block = new byte[HeapLayout.HeaderSize];
        fixed (byte* p = block)
        {
            ulong* h = (ulong*)p;
            for (int sample = 0; sample < 200; sample++)
            {
                long offset = 4096 * 3 + (64L * random.Next(1000));
                uint generation = (uint)random.Next(0, 1 << 24);
                bool wasFree = sample % 2 == 1;
                // The words the allocation replaces (a free block keeps its last header) and the allocation's, every
                // one different from the one it replaces (an equal word would make that store's durability moot).
                ulong[] before = wasFree
                    ? [(ulong)random.NextInt64(1L << 40), (ulong)random.Next(1, 100), HeapLayout.Shape(random.Next(0, 32), 4), HeapLayout.FreeWord(offset, generation)]
                    : [0, 0, 0, HeapLayout.UnusedWord(offset, generation)];
                ulong uid = (ulong)random.NextInt64(1, long.MaxValue) | (1UL << 62), epoch = (ulong)random.Next(100, 200), shape = HeapLayout.Shape(random.Next(0, 32), 6);
                ulong[] after = { uid, epoch, shape, HeapLayout.AllocatedCommit(uid, epoch, shape, offset, generation, PayloadKind.Alloc) };
                for (int durable = 0; durable < 16; durable++)
                {
                    for (int w = 0; w < 4; w++)
                    {
                        h[w] = (durable & (1 << w)) != 0 ? after[w] : before[w];
                    }

                    BlockState state = HeapLayout.Classify(p, offset, generation, 32, out _);
                    BlockState expected = durable == 15 ? BlockState.Allocated : (durable & 8) != 0 ? BlockState.Torn : wasFree ? BlockState.Free : BlockState.Unused;
                    Assert.True(state == expected, $"sample {sample}: stores {Convert.ToString(durable, 2)} durable gave {state}, expected {expected}");
                }
            }
        }
    }

    [Fact]
    public void Reclaim_HandsABlockOutAgainOnlyAfterItsFreeIsDurable_NoCrashImageReportsDamage()
    {
        List<string> violations = ReuseDuringReclamation(DurabilityFaults.None, out int images);
        AssertNoDamage(violations, images);
    }

    [Fact]
    public void Reclaim_ReusingABlockBeforeItsFreeIsDurable_IsCaughtAsDamage()
    {
        // The control: a reused block's new bytes can reach the file under its old seal, which recovery must report.
        List<string> violations = ReuseDuringReclamation(DurabilityFaults.ReuseBeforeFreeIsDurable, out int images);
        AssertDamageCaught(violations, images);
    }

    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void Reclaim_ReusingABlockWhoseFreeWasNeverWrittenBack_IsCaughtAsDamage(bool sweepStillFences)
    {
        // The controls that the persistence benchmark's --unsafe-sweeps-not-durable and --unsafe-sweeps-fence-only
        // experiments run: a sweep that leaves its frees in memory (fenced or not) lets a reused block's new bytes reach
        // the file under its old seal too.
        HeapFaults heapFaults = HeapFaults.SweepFreesStayInMemory | (sweepStillFences ? HeapFaults.SweepFencesWithoutFrees : HeapFaults.None);
        List<string> violations = ReuseDuringReclamation(DurabilityFaults.None, out int images, heapFaults);
        AssertDamageCaught(violations, images);
    }

    [Fact]
    public void Recovery_ADamagedPayload_IsReportedWithItsOffsetBeforeAnyBlockChanges_AndSalvageDropsExactlyIt()
    {
        using var dir = new TempDirectory();
        string path = Path.Combine(dir.Path, "damaged.heap");
        var options = new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan };
        var fileOptions = new HeapFileOptions { Size = 1L << 20, Domain = PersistenceDomainKind.MappedFile };
        long victim = -1, victimKey = -1;
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, fileOptions, options))
        {
            var map = new PersistentHashMap<long, long>(heap, TypeId);
            for (long k = 0; k < Entries; k++)
            {
                map.Set(k, k * 7);
            }

            heap.Sync();
        }

        // Find one live block (reopened read-only in effect: no operation), then damage one payload bit on disk.
        using (BufferedDurableHeap heap = BufferedDurableHeap.Open(path, fileOptions, options))
        {
            heap.Heap.ForEachAllocated((block, header) =>
            {
                if (header.TypeId != 0 && Volatile.Read(ref victim) < 0)
                {
                    Interlocked.CompareExchange(ref victim, block.Offset, -1);
                }
            });
        }

        byte[] bytes = File.ReadAllBytes(path);
        victimKey = BitConverter.ToInt64(bytes, (int)victim + HeapLayout.HeaderSize);
        bytes[victim + HeapLayout.HeaderSize + 9] ^= 0x10;
        File.WriteAllBytes(path, bytes);
        long dataStart = BitConverter.ToInt64(bytes, HeapLayout.DataStartOffset);

        HeapFileException refused = Assert.Throws<HeapFileException>(() => BufferedDurableHeap.Open(path, fileOptions, options).Dispose());
        Assert.Equal(HeapFileError.Corrupt, refused.Error);
        Assert.Equal(new[] { victim }, refused.DamagedBlocks);
        Assert.Contains($"0x{victim:X}", refused.Message, StringComparison.Ordinal);
        byte[] after = File.ReadAllBytes(path);
        Assert.True(bytes.AsSpan((int)dataStart).SequenceEqual(after.AsSpan((int)dataStart)), "a refused recovery changed a block");

        var salvage = new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, SalvageDamagedBlocks = true };
        using (BufferedDurableHeap heap = BufferedDurableHeap.Open(path, fileOptions, salvage))
        {
            Assert.Equal(new[] { victim }, heap.Recovery.DamagedBlocks);
            var map = new PersistentHashMap<long, long>(heap, TypeId);
            Assert.Equal(Entries - 1, map.Count);
            Assert.False(map.TryGetValue(victimKey, out _));
            Assert.All(Enumerable.Range(0, Entries).Where(k => k != victimKey), k => Assert.True(map.TryGetValue(k, out long v) && v == k * 7));
        }

        // The salvage was durable: the next open finds no damage and the same entries.
        using (BufferedDurableHeap heap = BufferedDurableHeap.Open(path, fileOptions, options))
        {
            Assert.Empty(heap.Recovery.DamagedBlocks);
            Assert.Equal(Entries - 1, new PersistentHashMap<long, long>(heap, TypeId).Count);
        }
    }

    [Fact]
    public void Reclaim_AntiPayloads_AreHandedOutAgainOnlyAfterTheirFreesAreDurable_NoCrashImageReportsDamage()
    {
        List<string> violations = AntiPayloadReuseDuringReclamation(DurabilityFaults.None, out int images);
        AssertNoDamage(violations, images);
    }

    [Fact]
    public void Reclaim_ReusingAnAntiPayloadBeforeItsFreeIsDurable_IsCaughtAsDamage()
    {
        // The control of the eager free path (anti-payloads are freed eagerly, not deferred): the broken variant hands
        // each block out as soon as it is marked free, so a new anti-payload can reach the file under the old seal.
        List<string> violations = AntiPayloadReuseDuringReclamation(DurabilityFaults.ReuseBeforeFreeIsDurable, out int images);
        AssertDamageCaught(violations, images);
    }

    /// <summary>
    /// Thirty-two keys written in version 1, sixteen of them removed in version 2 (sixteen anti-payloads, which the
    /// eager free path frees); when reclamation has marked the anti-payloads free and before it writes the frees back
    /// (the eager path's test hook), the other sixteen keys are removed (new anti-payloads of the same size class), with
    /// a power failure armed at every later crash point (4 adversarial seeds each) through two more advances. Returns
    /// what reopening each image reported. (Large blocks, the eager path's other user, are safe by another mechanism: a
    /// reused segment's header is written durably as unused of a new generation before anything is written into it.)
    /// </summary>
    private static List<string> AntiPayloadReuseDuringReclamation(DurabilityFaults faults, out int images)
    {
        const long Capacity = 1 << 20;
        using var domain = new SimulatedPersistenceDomain(Capacity);
        using (HeapFile file = HeapFile.Create(domain))
        {
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, Faults = faults });
            var map = new PersistentHashMap<long, long>(heap, TypeId);
            for (long k = 0; k < 32; k++)
            {
                map.Set(k, k);
            }

            heap.AdvanceVersion(TimeSpan.FromSeconds(30));
            for (long k = 0; k < 16; k++)
            {
                map.Remove(k);
            }

            bool armed = false;
            heap.AfterEagerFreesMarkedForTesting = () =>
            {
                if (armed)
                {
                    return;
                }

                armed = true;
                ArmEveryLaterCrashPoint(domain);
                for (long k = 16; k < 32; k++)
                {
                    map.Remove(k);
                }
            };

            for (int i = 0; i < 3 && !armed; i++)
            {
                heap.AdvanceVersion(TimeSpan.FromSeconds(30));
            }

            Assert.True(armed, "the eager free path never ran its hook: the scenario exercised nothing");
            heap.AdvanceVersion(TimeSpan.FromSeconds(30));
            heap.AdvanceVersion(TimeSpan.FromSeconds(30));
        }

        images = domain.CapturedCrashes.Count;
        return DamagedCrashImages(domain, Capacity);
    }

    [Fact]
    public void Sweep_OnAWriterThreadWhileAnotherWriterAllocates_HandsBlocksOutOnlyAfterTheirFreesAreDurable()
    {
        List<string> violations = WriterSweepsUnderLoad(DurabilityFaults.None, out int images, out int writerSweeps);
        Assert.True(writerSweeps > 0, "no writer thread swept: the scenario exercised nothing");
        AssertNoDamage(violations, images);
    }

    [Fact]
    public void Sweep_OnAWriterThreadHandingBlocksOutBeforeTheirFreesAreDurable_IsCaughtAsDamage()
    {
        // The control: a sweep that hands its blocks out before the fence lets the other writer's new payloads reach
        // the file while the old seals are still there.
        List<string> violations = WriterSweepsUnderLoad(DurabilityFaults.ReuseBeforeFreeIsDurable, out int images, out int writerSweeps);
        AssertDamageCaught(violations, images, $" ({writerSweeps} sweeps by a writer)");
    }

    [Fact]
    public void Sweep_OnAWriterThread_WithAnotherWritersReuseInsideItsWindow_LeavesNoDamage()
    {
        List<string> violations = WriterSweepWithHandshake(DurabilityFaults.None, out int images);
        AssertNoDamage(violations, images);
    }

    [Fact]
    public void Sweep_OnAWriterThread_HandingBlocksOutEarly_IsCaughtEveryRun()
    {
        // Deterministic: the other writer's reuse falls inside the sweep's window by a handshake, not by timing.
        List<string> violations = WriterSweepWithHandshake(DurabilityFaults.ReuseBeforeFreeIsDurable, out int images);
        Assert.True(violations.Count != 0, $"none of {images} crash images of the control showed damage");
        Assert.Contains("damaged", violations[0], StringComparison.Ordinal);
    }

    /// <summary>
    /// The writer-thread sweep made deterministic (review E): a writer thread flushes the parked frees; in the sweep's
    /// hook (after the marks, before the write-back) a second writer writes 512 new keys on its own thread and finishes
    /// (with the control, into the sweep's own blocks, handed out early); only then are the next 64 crash points armed
    /// (4 adversarial seeds each), all of them inside the sweep's write-back. Returns what reopening each image reported.
    /// </summary>
    private static List<string> WriterSweepWithHandshake(DurabilityFaults faults, out int images)
    {
        const long Capacity = 16 << 20;
        const int Keys = 2_000;
        using var domain = new SimulatedPersistenceDomain(1 << 20, Capacity);
        using (HeapFile file = HeapFile.Create(domain))
        {
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, Faults = faults });
            var map = new PersistentHashMap<long, long>(heap, TypeId);
            for (long k = 0; k < Keys; k++)
            {
                map.Set(k, k);
            }

            // Two replacements and their reclamation: the version-0 copies (sealed, durable) are parked.
            for (int round = 1; round <= 2; round++)
            {
                heap.AdvanceVersion(TimeSpan.FromSeconds(30));
                for (long k = 0; k < Keys; k++)
                {
                    map.Set(k, k + round);
                }
            }

            for (int i = 0; i < 3; i++)
            {
                heap.AdvanceVersion(TimeSpan.FromSeconds(30));
            }

            Assert.True(heap.Heap.PendingFreeBlocks > 256, $"only {heap.Heap.PendingFreeBlocks} frees parked");
            Thread? sweeper = null;
            int done = 0;
            Exception? failure = null;
            heap.Heap.AfterSweepMarkedForTesting = () =>
            {
                if (Thread.CurrentThread != sweeper || Interlocked.Exchange(ref done, 1) != 0)
                {
                    return;
                }

                var writer = new Thread(() => failure = Record.Exception(() =>
                {
                    for (long k = Keys; k < Keys + 512; k++)
                    {
                        map.Set(k, -k);
                    }
                }))
                { IsBackground = true };
                writer.Start();
                if (!writer.Join(TimeSpan.FromSeconds(30)))
                {
                    throw new TimeoutException("the other writer did not finish (it waited for this sweep?)");
                }

                for (long p = domain.CrashPointCount; p < domain.CrashPointCount + 64; p++)
                {
                    for (int seed = 0; seed < 4; seed++)
                    {
                        domain.ArmCrash(p, (int)(p * 4) + seed);
                    }
                }
            };

            sweeper = new Thread(() => failure ??= Record.Exception(heap.Heap.FlushPendingFrees)) { IsBackground = true };
            sweeper.Start();
            Assert.True(sweeper.Join(TimeSpan.FromSeconds(60)));
            Assert.Null(failure);
            Assert.Equal(1, done);
            heap.Heap.AfterSweepMarkedForTesting = null;
        }

        images = domain.CapturedCrashes.Count;
        return DamagedCrashImages(domain, Capacity);
    }

    /// <summary>
    /// Two writer threads in lock-step rounds (a barrier; a third thread advances the version after each round): each
    /// writer owns 5,000 keys and replaces all of them every third round and 50 otherwise, so the advancer's sweep, sized
    /// by the last version, leaves frees parked. At the start of each round the second writer sweeps them on its own
    /// thread (<see cref="PersistentHeap.FlushPendingFrees"/>: the sweep an allocation runs when nothing is ready and
    /// no segment is free) while the first writer allocates. The first sixteen sweeps by a writer (this one's, or the
    /// other's own sweep when its allocation finds nothing ready) arm power failures at 14 crash points 48 apart from a
    /// little past the current one (2 adversarial seeds each), inside the window between marking the frees and making
    /// them durable. Returns what reopening each image reported.
    /// </summary>
    private static List<string> WriterSweepsUnderLoad(DurabilityFaults faults, out int images, out int writerSweeps)
    {
        const long Capacity = 16 << 20;
        const int KeysPerWriter = 5_000;
        const int Rounds = 60;
        using var domain = new SimulatedPersistenceDomain(1 << 20, Capacity);
        int sweeps = 0;
        using (HeapFile file = HeapFile.Create(domain))
        {
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, Faults = faults });
            var map = new PersistentHashMap<long, long>(heap, TypeId);
            for (long k = 0; k < 2 * KeysPerWriter; k++)
            {
                map.Set(k, k);
            }

            Thread? advancing = null;
            heap.Heap.AfterSweepMarkedForTesting = () =>
            {
                // Interlocked.Increment: writers sweep concurrently; atomicity only.
                if (Thread.CurrentThread != advancing && Interlocked.Increment(ref sweeps) <= 16)
                {
                    // Spread over the sweep's write-backs (one crash point per block here), so that some images fall after
                    // the other writer has taken blocks from this sweep. Each point is taken from the count at that step
                    // with a margin, and one that passed meanwhile is skipped: the other writer may be sweeping too,
                    // which passes a crash point per block.
                    for (int i = 0; i < 14; i++)
                    {
                        long p = domain.CrashPointCount + 64 + (i * 48);
                        for (int seed = 0; seed < 2; seed++)
                        {
                            try
                            {
                                domain.ArmCrash(p, (int)(p * 2) + seed);
                            }
                            catch (ArgumentOutOfRangeException)
                            {
                                // Passed already: one image fewer.
                            }
                        }
                    }
                }
            };

            // Rounds in lock step (a barrier, every wait bounded, no timing): worker 2 advances after each round, so each
            // version is one round, and the advancer's sweep, sized by a small version, leaves frees parked for the next
            // round's sweep by worker 1, which runs while worker 0 allocates.
            using var round = new Barrier(3);
            void Meet()
            {
                if (!round.SignalAndWait(Workers.JoinTimeout))
                {
                    throw new TimeoutException("a round's barrier timed out (another participant failed?)");
                }
            }

            Workers.Run(3, w =>
            {
                if (w == 2)
                {
                    // Published to the hook by the first barrier (a full fence) before any round can sweep.
                    advancing = Thread.CurrentThread;
                }

                long first = w * KeysPerWriter;
                for (int r = 0; r < Rounds; r++)
                {
                    Meet();
                    if (w == 2)
                    {
                        Meet();
                        heap.AdvanceVersion(TimeSpan.FromSeconds(30));
                        continue;
                    }

                    if (w == 1)
                    {
                        // A sweep on this writer's thread (the path an allocation takes when nothing is ready and no
                        // segment is free) while the other writer allocates.
                        heap.Heap.FlushPendingFrees();
                    }

                    for (long k = first; k < first + (r % 3 == 0 ? KeysPerWriter : 50); k++)
                    {
                        map.Set(k, r);
                    }

                    Meet();
                }
            });
        }

        images = domain.CapturedCrashes.Count;
        // Volatile.Read: the writers have been joined; a plain read would do, this one says the field is shared.
        writerSweeps = Volatile.Read(ref sweeps);
        return DamagedCrashImages(domain, Capacity);
    }

    /// <summary>A crash enumeration of the correct code: enough images, none refused as damaged.</summary>
    private static void AssertNoDamage(List<string> violations, int images)
    {
        Assert.True(images > 10, $"only {images} crash images");
        Assert.Empty(violations);
    }

    /// <summary>A crash enumeration of a broken control: some image refused as damaged, else the control is reported inconclusive (skipped).</summary>
    private static void AssertDamageCaught(List<string> violations, int images, string detail = "")
    {
        Assert.SkipWhen(violations.Count == 0, $"inconclusive: none of {images} crash images of the broken control{detail} showed damage");
        Assert.Contains("damaged", violations[0], StringComparison.Ordinal);
    }

    /// <summary>Arms a power failure at each of the next 64 crash points, 4 adversarial seeds each.</summary>
    private static void ArmEveryLaterCrashPoint(SimulatedPersistenceDomain domain)
    {
        for (long p = domain.CrashPointCount; p < domain.CrashPointCount + 64; p++)
        {
            for (int seed = 0; seed < 4; seed++)
            {
                domain.ArmCrash(p, (int)(p * 4) + seed);
            }
        }
    }

    /// <summary>Reopens every captured crash image; returns one line per image that recovery refused as damaged.</summary>
    private static List<string> DamagedCrashImages(SimulatedPersistenceDomain domain, long capacity)
    {
        var violations = new List<string>();
        foreach (SimulatedCrash crash in domain.CapturedCrashes)
        {
            try
            {
                using var image = SimulatedPersistenceDomain.FromImage(crash.Image, capacity);
                using HeapFile file = HeapFile.Open(image);
                using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });

                // Nothing reopens this copy: a clean shutdown would persist the whole heap into it for nothing.
                file.ForgoCleanShutdown();
            }
            catch (HeapFileException e) when (e.Error == HeapFileError.Corrupt)
            {
                violations.Add($"point {crash.Point} seed {crash.Seed}: damaged: {e.Message}");
            }
        }

        return violations;
    }

    /// <summary>
    /// Sixteen keys written in version 1 and replaced in version 2; once their version-1 blocks are reclaimed (deferred
    /// frees), the first sweep that takes them makes the frees durable and hands the blocks out, and sixteen new keys are
    /// written between the frees being marked and being written back (the sweep's test hook), with a power failure
    /// armed at every later crash point (4 adversarial seeds each) through two more advances. Returns what reopening each image reported.
    /// </summary>
    private static List<string> ReuseDuringReclamation(DurabilityFaults faults, out int images, HeapFaults heapFaults = HeapFaults.None)
    {
        const long Capacity = 1 << 20;
        using var domain = new SimulatedPersistenceDomain(Capacity);
        using (HeapFile file = HeapFile.Create(domain))
        {
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, Faults = faults, HeapFaults = heapFaults });
            var map = new PersistentHashMap<long, long>(heap, TypeId);
            for (long k = 0; k < 16; k++)
            {
                map.Set(k, k);
            }

            heap.AdvanceVersion(TimeSpan.FromSeconds(30));
            for (long k = 0; k < 16; k++)
            {
                map.Set(k, k + 100);
            }

            bool armed = false;
            heap.Heap.AfterSweepMarkedForTesting = () =>
            {
                if (armed)
                {
                    return;
                }

                armed = true;
                ArmEveryLaterCrashPoint(domain);

                for (long k = 1000; k < 1016; k++)
                {
                    map.Set(k, k);
                }
            };

            // The advancer's sweep (or, if it stocks nothing, the flush) takes the version-1 frees once they are reclaimed.
            for (int i = 0; i < 3 && !armed; i++)
            {
                heap.AdvanceVersion(TimeSpan.FromSeconds(30));
            }

            if (!armed)
            {
                heap.Heap.FlushPendingFrees();
            }

            Assert.True(armed, "no sweep ran its hook: the scenario exercised nothing");
            heap.AdvanceVersion(TimeSpan.FromSeconds(30));
            heap.AdvanceVersion(TimeSpan.FromSeconds(30));
        }

        images = domain.CapturedCrashes.Count;
        return DamagedCrashImages(domain, Capacity);
    }
}
