using System;
using System.Collections.Generic;
using System.IO;
using Xunit;

namespace Epvs.Samples.Tests.Cli;

/// <summary>
/// Every sample's command line, run in-process through its <c>Program.Run</c>: help, validation with a message that
/// names the option and no stack trace, exit code 2 on bad input, 0 on success, and the positional form the READMEs give.
/// </summary>
public sealed class SampleCommandLineTests
{
    private delegate int Entry(string[] args, TextWriter output, TextWriter error);

    private static readonly Dictionary<string, Entry> Samples = new()
    {
        ["Tour"] = Epvs.Samples.Tour.Program.Run,
        ["ResizableArray"] = Epvs.Samples.ResizableArray.Program.Run,
        ["OwnershipMap"] = Epvs.Samples.OwnershipMap.Program.Run,
        ["CprCheckpoint"] = Epvs.Samples.CprCheckpoint.Program.Run,
        ["PersistentKv"] = Epvs.Samples.PersistentKv.Program.Run,
    };

    private readonly ITestOutputHelper _log;

    public SampleCommandLineTests(ITestOutputHelper log) => _log = log;

    public static TheoryData<string, string, string> HelpCases()
    {
        // sample, help flag, the options its help must list (space-separated)
        var data = new TheoryData<string, string, string>();
        foreach (string flag in new[] { "--help", "-h" })
        {
            data.Add("Tour", flag, "--duration --threads <seconds-per-step>");
            data.Add("ResizableArray", flag, "--duration --threads --push-percent <seconds-per-variant>");
            data.Add("OwnershipMap", flag, "--duration --clients --shards <seconds>");
            data.Add("CprCheckpoint", flag, "--duration --clients <seconds>");
            data.Add("PersistentKv", flag, "--duration <seconds>");
        }

        return data;
    }

    [Theory]
    [MemberData(nameof(HelpCases))]
    public void Help_ExitsZeroAndListsOptions(string sample, string flag, string options)
    {
        (int code, string output, string error) = Run(sample, flag);

        Assert.Equal(0, code);
        Assert.Equal(string.Empty, error);
        Assert.Contains("Usage:", output, StringComparison.Ordinal);
        foreach (string option in options.Split(' '))
        {
            Assert.Contains(option, output, StringComparison.Ordinal);
        }

        // Nothing ran, and the internal child-process roles stay out of the user's help.
        Assert.DoesNotContain("running for", output, StringComparison.Ordinal);
        Assert.DoesNotContain("crash-child", output, StringComparison.Ordinal);
        Assert.DoesNotContain("writer", output, StringComparison.Ordinal);
    }

    public static TheoryData<string, string[], string> BadInputCases() => new()
    {
        // sample, command line, what the message must name
        { "Tour", ["0"], "<seconds-per-step>" },
        { "Tour", ["-1"], "<seconds-per-step>" },
        { "Tour", ["--duration", "0"], "--duration" },
        { "Tour", ["--duration", "-1s"], "--duration" },
        { "Tour", ["--duration", "soon"], "--duration" },
        { "Tour", ["--threads", "0"], "--threads" },
        { "Tour", ["--bogus"], "--bogus" },
        { "Tour", ["1", "--duration", "1"], "--duration" },
        { "ResizableArray", ["abc"], "<seconds-per-variant>" },
        { "ResizableArray", ["--threads", "x"], "--threads" },
        { "ResizableArray", ["1", "2", "101"], "<push-percent>" },
        { "ResizableArray", ["--push-percent", "-5"], "--push-percent" },
        { "ResizableArray", ["--duration", "NaN"], "--duration" },
        { "ResizableArray", ["--duration", "1e308"], "--duration" },
        { "OwnershipMap", ["--shards", "1"], "--shards" },
        { "OwnershipMap", ["--clients", "2.5"], "--clients" },
        { "OwnershipMap", ["1", "2", "3", "4"], "4" },
        { "CprCheckpoint", ["--clients", "0"], "--clients" },
        { "CprCheckpoint", ["--duration"], "--duration" },
        { "PersistentKv", ["--duration", "10ms"], "--duration" },
        { "PersistentKv", ["-d", "11m"], "--duration" },
    };

    [Theory]
    [MemberData(nameof(BadInputCases))]
    public void BadInput_ExitsTwoWithOneLineNamingTheOptionAndNoStackTrace(string sample, string[] args, string named)
    {
        (int code, string output, string error) = Run(sample, args);

        Assert.Equal(2, code);
        Assert.Contains(named, error, StringComparison.Ordinal);
        Assert.Contains("--help", error, StringComparison.Ordinal);
        Assert.DoesNotContain("Exception", error, StringComparison.Ordinal);
        Assert.DoesNotContain("   at ", error, StringComparison.Ordinal);

        // Nothing ran.
        Assert.Equal(string.Empty, output);
    }

    [Fact]
    public void ResizableArray_PositionalFormFromTheReadme_RunsAndExitsZero()
    {
        (int code, string output, string error) = Run("ResizableArray", "0.05", "2", "10");

        Assert.Equal(0, code);
        Assert.Equal(string.Empty, error);
        Assert.Contains("2 threads, 10% push", output, StringComparison.Ordinal);
        Assert.Contains("EPVS-pinned", output, StringComparison.Ordinal);
    }

    [Theory]
    [InlineData("OwnershipMap", "--duration", "200ms", "--clients", "2", "--shards", "2")]
    [InlineData("CprCheckpoint", "-d", "0.2", "-c", "2")]
    public void NamedOptions_ShortRun_ExitsZero(string sample, params string[] args)
    {
        (int code, string output, string error) = Run(sample, args);

        Assert.Equal(0, code);
        Assert.Equal(string.Empty, error);
        Assert.Contains("running for 200ms", output, StringComparison.Ordinal);
    }

    [Fact]
    public void PersistentKv_ShortRun_DescribesTheDomainInWordsAndNeverClaimsPmemOnAnOrdinaryFile()
    {
        (int code, string output, string error) = Run("PersistentKv", "--duration", "300ms");

        Assert.Equal(0, code);
        Assert.Equal(string.Empty, error);
        Assert.Contains("MATCHES the op log", output, StringComparison.Ordinal);
        Assert.DoesNotContain("pmem=", output, StringComparison.Ordinal);
        Assert.DoesNotContain("clean=", output, StringComparison.Ordinal);
        Assert.Contains("reopened after a crash", output, StringComparison.Ordinal);

        // The sample's runtimeconfig is next to the tests, so the demo kills a real child. Its heap lives under the
        // temp directory, an ordinary file system here: whichever domain it used (libpmem when libpmem1 is installed,
        // as .ci/run does, else msync), it must say this is not persistent memory — libpmem's pmem_is_pmem says yes
        // only because the demo sets PMEM_IS_PMEM_FORCE=1.
        Assert.Contains("writer child", output, StringComparison.Ordinal);
        Assert.Contains("not persistent memory", output, StringComparison.Ordinal);
        Assert.Contains("killed the writer with SIGKILL", output, StringComparison.Ordinal);
    }

    [Fact]
    public void Tour_ShortRun_CompletesEveryStepAndReportsInWords()
    {
        (int code, string output, string error) = Run("Tour", "--duration", "300ms", "--threads", "2");

        Assert.Equal(0, code);
        Assert.Equal(string.Empty, error);
        Assert.Contains("Tour completed", output, StringComparison.Ordinal);
        Assert.Equal(2, CountOf(output, "running for 300ms ..."));
        Assert.Contains("x the reader-writer latch", output, StringComparison.Ordinal);
        foreach (string raw in new[] { "Infinity", "NaN", "pmem=", "clean=", "fast=", "clock=" })
        {
            Assert.DoesNotContain(raw, output, StringComparison.Ordinal);
        }
    }

    private static int CountOf(string text, string part)
    {
        int count = 0;
        for (int i = text.IndexOf(part, StringComparison.Ordinal); i >= 0; i = text.IndexOf(part, i + part.Length, StringComparison.Ordinal))
        {
            count++;
        }

        return count;
    }

    private (int Code, string Output, string Error) Run(string sample, params string[] args)
    {
        var output = new StringWriter();
        var error = new StringWriter();
        int code = Samples[sample](args, output, error);
        _log.WriteLine($"{sample} {string.Join(' ', args)} -> {code}");
        _log.WriteLine(output.ToString());
        _log.WriteLine(error.ToString());
        return (code, output.ToString(), error.ToString());
    }
}
