using System;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using BenchmarkDotNet.Configs;
using BenchmarkDotNet.Reports;
using Xunit;

namespace Epvs.Benchmarks.Tests.Cli;

/// <summary>The per-operation suite's command line: its own commands, and BenchmarkDotNet's arguments passed through.</summary>
public sealed class BenchmarksCliTests
{
    private const string Report =
        "| Type | Method | Categories | Refreshers | Mean | StdDev | Median | Min | Max |\n" +
        "|----- |------- |----------- |----------- |-----:|-------:|-------:|----:|----:|\n" +
        "| **A** | **Faster_Refresh** | **EPVS Refresh** | **?** | **4.7 ns** | **0.1 ns** | **4.66 ns** | **4.5 ns** | **5.0 ns** |\n" +
        "| A | Epvs_Refresh | EPVS Refresh | ? | 2.5 ns | 0.05 ns | 2.44 ns | 2.40 ns | 2.60 ns |\n" +
        "|   |              |              |   |        |         |         |         |         |\n" +
        "| B | Epvs_AdvanceVersion | TryAdvanceVersionWithCriticalSection | 1 | 433 ns | 9 ns | 1.2 μs | 400 ns | 2,000 ns |\n";

    private sealed class FakeSuite
    {
        public List<string[]> Calls { get; } = new();

        public IReadOnlyList<Summary> Run(string[] args, IConfig config)
        {
            Calls.Add(args);
            return [];
        }
    }

    private static (int Code, string Out, string Err) Run(FakeSuite suite, params string[] args)
    {
        var output = new StringWriter();
        var error = new StringWriter();
        int code = BenchmarksCli.Run(args, output, error, suite.Run);
        return (code, output.ToString(), error.ToString());
    }

    [Fact]
    public void Help_DescribesPassThroughAndPlot_ExitsZeroWithoutRunning()
    {
        var suite = new FakeSuite();

        (int code, string output, _) = Run(suite, "--help");

        Assert.Equal(0, code);
        Assert.Contains("BenchmarkDotNet", output);
        Assert.Contains("plot", output);
        Assert.Empty(suite.Calls);
    }

    [Fact]
    public void BenchmarkDotNetHelp_AfterDoubleDash_PrintsItsOptions_ExitsZeroWithoutRunning()
    {
        var suite = new FakeSuite();

        (int code, string output, _) = Run(suite, "--", "--help");

        Assert.Equal(0, code);
        Assert.Contains("--iterationCount", output);
        Assert.Empty(suite.Calls);
    }

    [Fact]
    public void BenchmarkDotNetArguments_PassThroughUnchanged()
    {
        var suite = new FakeSuite();
        string[] args = ["--list", "flat", "--filter", "*Refresh*", "--job", "short", "--artifacts", "/tmp/x"];

        (int code, _, _) = Run(suite, args);

        Assert.Equal(0, code);
        Assert.Equal(args, Assert.Single(suite.Calls));
    }

    [Theory]
    [InlineData(new[] { "--filter", "*" }, 1)]
    [InlineData(new[] { "--filter", "*", "--job", "dry" }, 0)] // else the default job's 10 iterations override dry's 1
    [InlineData(new[] { "-j", "short" }, 0)]
    public void CreateConfig_DefaultJobOnlyWhenNoJobIsNamed(string[] args, int defaultJobs)
    {
        Assert.Equal(defaultJobs, BenchmarksCli.CreateConfig(args).GetJobs().Count());
    }

    [Theory]
    [InlineData("invalid", "--job", "bogusjob")]
    [InlineData("has no value", "--filter")]
    [InlineData("not accept", "--launchCount", "many")]
    public void BadBenchmarkDotNetArguments_ExitTwoWithItsMessage_WithoutRunning(string expected, params string[] args)
    {
        var suite = new FakeSuite();

        (int code, _, string error) = Run(suite, args);

        Assert.Equal(BenchmarksCli.BadInput, code);
        Assert.Contains(expected, error);
        Assert.Empty(suite.Calls);
    }

    [Fact]
    public void FilterMatchingNothing_ExitsTwo()
    {
        var suite = new FakeSuite();

        (int code, _, string error) = Run(suite, "--filter", "*NoSuchBenchmark*", "--job", "dry");

        Assert.Equal(BenchmarksCli.BadInput, code);
        Assert.Contains("no benchmark matches", error);
    }

    [Theory]
    [InlineData("plot")]
    [InlineData("--plot")] // the spelling benchmark/RESULTS.md used before
    public void Plot_SmallReport_WritesPng(string command)
    {
        using var dir = new TempDirectory();
        File.WriteAllText(dir.File("report.md"), Report);

        (int code, string output, _) = Run(new FakeSuite(), command, dir.File("report.md"), dir.File("bdn.png"));

        Assert.Equal(0, code);
        Assert.Contains("3 bars", output);
        Assert.True(TempDirectory.IsPng(dir.File("bdn.png")));
    }

    [Theory]
    [InlineData("does not exist", "absent.md", "bdn.png")]
    [InlineData("'.txt' is not .svg or .png", "report.md", "bdn.txt")]
    public void Plot_BadArguments_ExitTwo(string expected, string report, string image)
    {
        using var dir = new TempDirectory();
        File.WriteAllText(dir.File("report.md"), Report);

        (int code, _, string error) = Run(new FakeSuite(), "plot", dir.File(report), dir.File(image));

        Assert.Equal(BenchmarksCli.BadInput, code);
        Assert.Contains(expected, error);
    }

    [Fact]
    public void Read_MedianAndMinMax_InNanoseconds()
    {
        using var dir = new TempDirectory();
        File.WriteAllText(dir.File("report.md"), Report);

        (IReadOnlyList<ReportPlot.Row> rows, bool minMax) = ReportPlot.Read(dir.File("report.md"));

        Assert.True(minMax);
        Assert.Equal(3, rows.Count);
        Assert.Equal(new ReportPlot.Row("EPVS Refresh", "Faster_Refresh", 4.66, 4.5, 5.0), rows[0]);
        Assert.Equal("TryAdvanceVersionWithCriticalSection, 1 other thread(s) refreshing", rows[2].Group);
        Assert.Equal(1200, rows[2].MedianNs, 6);
        Assert.Equal(2000, rows[2].HighNs, 6);
    }

    [Fact]
    public void Read_WithoutMinMax_WhiskersAreOneStdDev()
    {
        using var dir = new TempDirectory();
        File.WriteAllText(dir.File("report.md"), Report.Replace(" Min | Max |", " X | Y |"));

        (IReadOnlyList<ReportPlot.Row> rows, bool minMax) = ReportPlot.Read(dir.File("report.md"));

        Assert.False(minMax);
        Assert.Equal(4.56, rows[0].LowNs, 6);
        Assert.Equal(4.76, rows[0].HighNs, 6);
    }
}
