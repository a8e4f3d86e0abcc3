using System;
using System.Buffers.Binary;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

public sealed class SimulatedPersistenceDomainTests
{
    private const int Seeds = 40;

    [Fact]
    public void Crash_AfterWriteBackAndFence_StoreIsDurableForEverySeed()
    {
        using var domain = new SimulatedPersistenceDomain(4096);
        WriteWord(domain, 128, 0x1122334455667788);
        domain.WriteBack(128, 8);
        domain.Fence();
        for (int seed = 0; seed < Seeds; seed++)
        {
            Assert.Equal(0x1122334455667788UL, ReadWord(domain.Crash(seed), 128));
        }
    }

    [Fact]
    public void Crash_WriteBackWithoutFence_StoreSurvivesForSomeSeedsOnly()
    {
        using var domain = new SimulatedPersistenceDomain(4096);
        WriteWord(domain, 64, 42);
        domain.WriteBack(64, 8);
        int survived = 0;
        for (int seed = 0; seed < Seeds; seed++)
        {
            survived += ReadWord(domain.Crash(seed), 64) == 42 ? 1 : 0;
        }

        Assert.InRange(survived, 1, Seeds - 1);
    }

    [Fact]
    public void Crash_UnflushedStores_SurviveAsArbitrarySubsetsOfWholeWords()
    {
        using var domain = new SimulatedPersistenceDomain(4096);
        for (int w = 0; w < 8; w++)
        {
            WriteWord(domain, w * 8, ulong.MaxValue - (ulong)w);
        }

        bool sawMixed = false, sawNone = false, sawAll = false;
        for (int seed = 0; seed < Seeds; seed++)
        {
            byte[] image = domain.Crash(seed);
            int kept = 0;
            for (int w = 0; w < 8; w++)
            {
                ulong value = ReadWord(image, w * 8);
                Assert.True(value == 0 || value == ulong.MaxValue - (ulong)w, $"seed {seed}: word {w} is torn: 0x{value:X}");
                kept += value == 0 ? 0 : 1;
            }

            sawMixed |= kept is > 0 and < 8;
            sawNone |= kept == 0;
            sawAll |= kept == 8;
        }

        Assert.True(sawMixed && sawNone && sawAll, $"mixed={sawMixed} none={sawNone} all={sawAll}");
    }

    [Fact]
    public void Fence_OnAnotherThread_DoesNotMakeThisThreadsWriteBackDurable()
    {
        using var domain = new SimulatedPersistenceDomain(4096);
        WriteWord(domain, 256, 7);
        domain.WriteBack(256, 8);
        var other = new Thread(domain.Fence);
        other.Start();
        Assert.True(other.Join(Workers.JoinTimeout));
        Assert.Equal(0UL, ReadWord(domain.GetDurableImage(), 256));

        domain.Fence();
        Assert.Equal(7UL, ReadWord(domain.GetDurableImage(), 256));
    }

    [Fact]
    public void WriteBack_ThenLaterStore_FenceMakesTheWrittenBackSnapshotDurable()
    {
        using var domain = new SimulatedPersistenceDomain(4096);
        WriteWord(domain, 0, 1);
        domain.WriteBack(0, 8);
        WriteWord(domain, 0, 2);
        domain.Fence();
        Assert.Equal(1UL, ReadWord(domain.GetDurableImage(), 0));
    }

    [Fact]
    public void ArmCrash_AtEachPoint_CapturesTheStateBeforeThatEvent()
    {
        using var domain = new SimulatedPersistenceDomain(4096);
        for (long point = 0; point <= 4; point++)
        {
            domain.ArmCrash(point, seed: 0);
        }

        WriteWord(domain, 0, 5);
        domain.Persist(0, 8); // points 0 (write-back) and 1 (fence)
        WriteWord(domain, 8, 6);
        domain.Persist(8, 8); // points 2 and 3
        Assert.Equal(4, domain.CrashPointCount);

        var crashes = domain.CapturedCrashes;
        Assert.Equal([0L, 1L, 2L, 3L], new[] { crashes[0].Point, crashes[1].Point, crashes[2].Point, crashes[3].Point });

        // Point 2 comes after the first fence: the first word is durable whatever the seed chose.
        Assert.Equal(5UL, ReadWord(crashes[2].Image, 0));
        Assert.Equal(5UL, ReadWord(domain.Crash(99), 0));
        Assert.Equal(6UL, ReadWord(domain.Crash(99), 8));
    }

    /// <summary>
    /// A probe's finding: after Dispose, ArmCrash at a point already passed said "has already passed", and at a point
    /// ahead it armed a crash that no event could ever reach, without a word; every other member of a disposed domain
    /// throws <see cref="ObjectDisposedException"/>.
    /// </summary>
    [Theory]
    [InlineData(0L)]
    [InlineData(100L)]
    public void ArmCrash_AfterDispose_ThrowsObjectDisposed(long point)
    {
        var domain = new SimulatedPersistenceDomain(4096);
        WriteWord(domain, 0, 5);
        domain.Persist(0, 8); // points 0 and 1 pass
        domain.Dispose();
        Assert.Throws<ObjectDisposedException>(() => domain.ArmCrash(point, seed: 0));
    }

    [Fact]
    public void TryGrow_WithinCapacity_KeepsBaseAddressAndContents()
    {
        using var domain = new SimulatedPersistenceDomain(4096, capacity: 16384);
        IntPtr before = domain.BaseAddress;
        WriteWord(domain, 0, 9);
        Assert.True(domain.TryGrow(8192));
        Assert.False(domain.TryGrow(32768));
        Assert.Equal(before, domain.BaseAddress);
        Assert.Equal(8192, domain.Length);
        Assert.Equal(9UL, BinaryPrimitives.ReadUInt64LittleEndian(domain.GetSpan(0, 8)));
    }

    private static void WriteWord(SimulatedPersistenceDomain domain, long offset, ulong value) =>
        BinaryPrimitives.WriteUInt64LittleEndian(domain.GetSpan(offset, 8), value);

    private static ulong ReadWord(byte[] image, int offset) => BinaryPrimitives.ReadUInt64LittleEndian(image.AsSpan(offset));
}
