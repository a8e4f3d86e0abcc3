using System;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// <see cref="WriteBackRuns"/> on persistent memory (here the simulated domain, which writes back cache lines as
/// pmem does): ranges added in ascending order that start no later than the run's end rounded up to a line are one
/// write-back; every byte of every range is durable after the fence, and no line that no range touches is written.
/// </summary>
public sealed unsafe class PersistentMemoryWriteBackRunsTests
{
    private const int Line = SimulatedPersistenceDomain.LineSize;

    [Fact]
    public void NeighbouringBlocks_AreOneWriteBack_AndEveryByteOfThemIsDurable()
    {
        using var domain = new SimulatedPersistenceDomain(16 * Line);
        Fill(domain);
        long points = domain.CrashPointCount;

        // Three 48-byte blocks back to back (the second and third share lines with their neighbours), then one that
        // starts where the line after the run's last begins, one inside the run, and one past the run's end on its
        // last line: still the same run.
        var runs = new WriteBackRuns(domain);
        runs.Add(0, 48);
        runs.Add(48, 48);
        runs.Add(96, 48);
        runs.Add(3 * Line, 48);
        runs.Add(16, 8);
        runs.Add((3 * Line) + 56, 8);
        runs.Flush();
        domain.Fence();

        Assert.Equal(points + 2, domain.CrashPointCount);
        byte[] durable = domain.GetDurableImage();
        Assert.True(durable.AsSpan(0, 4 * Line).SequenceEqual(Pattern(0, 4 * Line)), "a byte of a merged range is not durable");
        Assert.True(durable.AsSpan(4 * Line, 12 * Line).SequenceEqual(new byte[12 * Line]), "a line no range touches was written back");
    }

    [Fact]
    public void ARangeTwoLinesPastTheRun_IsAWriteBackOfItsOwn_AndTheLineBetweenIsNotWritten()
    {
        using var domain = new SimulatedPersistenceDomain(16 * Line);
        Fill(domain);
        long points = domain.CrashPointCount;

        var runs = new WriteBackRuns(domain);
        runs.Add(0, 48);
        runs.Add(2 * Line, 8);
        runs.Add((2 * Line) + 8, 8);

        // Not ascending: a run of its own too.
        runs.Add(Line / 2, 8);
        runs.Flush();
        domain.Fence();

        Assert.Equal(points + 4, domain.CrashPointCount);
        byte[] durable = domain.GetDurableImage();
        Assert.True(durable.AsSpan(0, 48).SequenceEqual(Pattern(0, 48)));
        Assert.True(durable.AsSpan(2 * Line, 16).SequenceEqual(Pattern(2 * Line, 16)));
        Assert.True(durable.AsSpan(Line, Line).SequenceEqual(new byte[Line]), "the line between the runs was written back");
    }

    /// <summary>Writes a pattern over the whole working image (nothing written back).</summary>
    private static void Fill(SimulatedPersistenceDomain domain)
    {
        Pattern(0, (int)domain.Length).CopyTo(new Span<byte>((void*)domain.BaseAddress, (int)domain.Length));
    }

    private static byte[] Pattern(long start, int length)
    {
        byte[] bytes = new byte[length];
        for (int i = 0; i < length; i++)
        {
            bytes[i] = (byte)(((start + i) * 7) + 1);
        }

        return bytes;
    }
}
