using System;
using System.Collections.Generic;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// A probe's finding: a heap full because its file could not grow (the process's file size limit here; a full file
/// system behaves the same) refused every delete, after Syncs and reopens too, so nothing could make room: the delete
/// reserve was kept only while the heap could not grow by its capacity (<c>MaxSize</c>), and once the medium refused,
/// no free segment was left for it. Each growth now leaves a spare segment of medium beyond the heap, into which the
/// heap grows by one when the medium refuses more; that segment becomes the reserve. Each case runs in a child process
/// (it sets its own RLIMIT_FSIZE).
/// </summary>
public sealed class GrowthRefusedDeleteTests
{
    private readonly ITestOutputHelper _output;

    public GrowthRefusedDeleteTests(ITestOutputHelper output) => _output = output;

    [Theory]
    [InlineData("limit")]
    [InlineData("maxsize")]
    [InlineData("nevergrew")]
    [InlineData("rawsticky")]
    public void AHeapFullBecauseItsFileCouldNotGrow_StillDeletes_AndReusesTheRoom(string scenario)
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "RLIMIT_FSIZE: Linux");
        (int code, string output) = Run(scenario);
        Assert.True(code == SafetyChild.Survived, $"exit {code}: {output}");
    }

    [Fact]
    public void GrowthWithoutASpareSegment_IsCaughtRefusingDeletes_Control()
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "RLIMIT_FSIZE: Linux");
        (int code, string output) = Run("nospare");
        Assert.True(code == SafetyChild.WrongOutcome, $"the control (no spare segment) was not caught: exit {code}: {output}");
        Assert.Contains("removed 0 of 50", output, StringComparison.Ordinal);

        // Without a reserve, the heap-full messages do not claim one (they did: "kept for deletes", "a reserve of their own").
        Assert.DoesNotContain("kept for deletes", output, StringComparison.Ordinal);
        Assert.DoesNotContain("reserve of their own", output, StringComparison.Ordinal);
    }

    private (int Code, string Output) Run(string scenario)
    {
        using var dir = new TempDirectory();
        (int code, string output) = TestProgram.RunChild(new Dictionary<string, string>(), GrowthRefusalChild.Role, scenario, dir.File("full.heap"));
        _output.WriteLine(output);
        return (code, output);
    }
}
