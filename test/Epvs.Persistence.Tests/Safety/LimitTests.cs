using System;
using System.Collections.Generic;
using System.Runtime.InteropServices;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// A probe of the file format's limits. A buffered heap whose versions reached 2^42 (the clock is a sealed word of 42
/// bits) failed, and its file could never be opened again: every open begins a new version. Heaps now stop writing
/// 2^20 versions before that and keep those for opens. Crafted files whose checked words hold values past what the
/// format writes made the open throw the wrong exception (a large block's size word of 2^31; a saved state of more than
/// 2^28 words). Each runs in a child process (<see cref="LimitsChild"/>).
/// </summary>
public sealed class LimitTests
{
    private readonly ITestOutputHelper _output;

    public LimitTests(ITestOutputHelper output) => _output = output;

    [Fact]
    public void VersionSpaceUsedUp_WritesStopWithAClearRefusal_AndTheFileReopensWithEverythingAcknowledged() =>
        Assert.Equal("verdict: ok", Run("version-limit"));

    [Fact]
    public void VersionSpaceUsedUp_IsCaught_WhenTransitionsRunPastTheLimit_Control()
    {
        string verdict = Run("version-limit", control: true);
        Assert.StartsWith("verdict: broken:", verdict, StringComparison.Ordinal);
    }

    [Fact]
    public void VersionSpaceUsedUp_DisposeRunsNoTransitionPastIt_AndEachReopenUsesOneVersion() =>
        Assert.Equal("verdict: ok", Run("dispose-at-limit"));

    [Fact]
    public void ClockAtTheLargestSealedValue_TheOpenIsRefusedAsVersionSpaceExhausted_OneBelowOpensReadOnly() =>
        Assert.Equal("verdict: ok", Run("clock-at-max"));

    /// <summary>The control (a size word just inside an int) shows the crafted block is reported as damage either way.</summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void LargeBlockWithASizeWordOf2Pow31_IsReportedAsDamage(bool control) =>
        Assert.Equal("verdict: ok", Run("large-size-word", control));

    [Fact]
    public void SavedStateOfMoreThan2Pow28Words_IsRejected_AndTheHeapOpensByAScan() =>
        Assert.Equal("verdict: ok", Run("saved-state-words"));

    /// <summary>Past 2^24 words the hash of a saved state or segment table is taken in chunks: the same value as one shot.</summary>
    [Fact]
    public unsafe void HashOfMoreThanAChunk_EqualsTheOneShotHash()
    {
        const long Count = (1L << 24) + 5;
        ulong* words = (ulong*)NativeMemory.Alloc((nuint)(Count * sizeof(ulong)));
        try
        {
            var random = new Random(7);
            for (long i = 0; i < Count; i++)
            {
                words[i] = (ulong)random.NextInt64();
            }

            ulong oneShot = System.IO.Hashing.XxHash3.HashToUInt64(new ReadOnlySpan<byte>(words, (int)(Count * sizeof(ulong))), 99);
            Assert.Equal(oneShot, HeapLayout.Hash(words, Count, 99));
            Assert.NotEqual(oneShot, HeapLayout.Hash(words, Count - 1, 99));
        }
        finally
        {
            NativeMemory.Free(words);
        }
    }

    private string Run(string scenario, bool control = false)
    {
        using var dir = new TempDirectory();
        var args = new List<string> { LimitsChild.Role, scenario, dir.File("limits.heap") };
        if (control)
        {
            args.Add("control");
        }

        (int code, string output) = TestProgram.RunChild(new Dictionary<string, string>(), args.ToArray());
        _output.WriteLine($"exit {code}: {output}");
        Assert.True(code == 0, $"exit {code}: {output}");
        foreach (string line in output.Split('\n'))
        {
            if (line.StartsWith("verdict: ", StringComparison.Ordinal))
            {
                return line.TrimEnd('\r');
            }
        }

        Assert.Fail($"no verdict: {output}");
        return "";
    }
}
