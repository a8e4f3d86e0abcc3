using System;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using Epvs.Scaling;
using Epvs.Scaling.Harness;
using ScottPlot.Plottables;
using Xunit;

namespace Epvs.Benchmarks.Tests.Cli;

/// <summary>The scaling harness's command line (exit codes, help, errors) and its plots, run in-process.</summary>
public sealed class ScalingCliTests
{
    // Two series over three thread counts, the last oversubscribed; three repetitions per point.
    private const string SmallCsv =
        "series,x,oversubscribed,median_mops,samples_mops\n" +
        "\"EPVS, depth 1\",1,no,10.0,9.00 10.0 12.0\n" +
        "\"EPVS, depth 1\",2,no,20.0,18.0 20.0 21.0\n" +
        "\"EPVS, depth 1\",4,yes,19.0,17.0 19.0 19.5\n" +
        "\"lock, \"\"quoted\"\"\",1,no,5.00,5.00 5.00 5.00\n" +
        "\"lock, \"\"quoted\"\"\",2,no,4.00,3.00 4.00 6.00\n" +
        "\"lock, \"\"quoted\"\"\",4,yes,3.00,2.00 3.00 3.50\n";

    private const string SmallMd =
        "### fig99: A small test figure\n\n- Command: `x`\n\n| threads | EPVS, depth 1 | lock |\n|---|---:|---:|\n| 1 | 10.0 | 5.00 |\n";

    private static (int Code, string Out, string Err) Run(params string[] args)
    {
        var output = new StringWriter();
        var error = new StringWriter();
        int code = ScalingCli.Run(args, output, error);
        return (code, output.ToString(), error.ToString());
    }

    [Theory]
    [InlineData("--help")]
    [InlineData("-h")]
    public void Help_PrintsOptionsAndPlotCommand_ExitsZero(string flag)
    {
        (int code, string output, _) = Run(flag);

        Assert.Equal(0, code);
        Assert.Contains("--figure", output);
        Assert.Contains("--threads", output);
        Assert.Contains("plot", output);
    }

    [Fact]
    public void PlotHelp_PrintsItsOptions_ExitsZero()
    {
        (int code, string output, _) = Run("plot", "--help");

        Assert.Equal(0, code);
        Assert.Contains("--dir", output);
        Assert.Contains("--format", output);
    }

    [Theory]
    [InlineData("unknown figure '99'", "--figure", "99")] // ended in an unhandled ArgumentException before
    [InlineData("unknown figure 'x'", "--figure", "11,x")]
    [InlineData("--figure", "--figure")]
    [InlineData("'0' is not a thread count", "--threads", "0,2")]
    [InlineData("'two' is not a thread count", "--threads", "two")]
    [InlineData("--duration: 0 is outside", "--duration", "0")]
    [InlineData("--duration", "--duration", "fast")]
    [InlineData("--repetitions: 101 is outside", "--repetitions", "101")]
    [InlineData("--bogus", "--bogus")]
    [InlineData("gif", "plot", "--format", "gif")]
    [InlineData("unknown figure '5'", "plot", "--figure", "5")]
    public void BadInput_NamesTheProblem_ExitsTwoWithoutRunning(string expected, params string[] args)
    {
        (int code, string output, string error) = Run(args);

        Assert.Equal(ScalingCli.BadInput, code);
        Assert.Contains(expected, error);
        Assert.DoesNotContain("machine:", output); // nothing was measured
    }

    [Fact]
    public void NoOptions_AllFiguresWithPublishedSettings()
    {
        var runs = new List<(IReadOnlyList<string> Figures, RunSettings Settings, string Dir)>();

        int code = ScalingCli.Run([], TextWriter.Null, TextWriter.Null, (f, s, d) => { runs.Add((f, s, d)); return 0; });

        Assert.Equal(0, code);
        (IReadOnlyList<string> figures, RunSettings settings, string dir) = Assert.Single(runs);
        Assert.Equal(ScalingCli.AllFigures, figures);
        Assert.Equal(RunSettings.Full, settings);
        Assert.Equal([1, 2, 4, 8], settings.Threads);
        Assert.EndsWith(Path.Combine("benchmark", "results", ""), Path.Combine(dir, ""));
    }

    [Fact]
    public void Options_OverrideSettings_FiguresDeduplicatedInOrder()
    {
        var runs = new List<(IReadOnlyList<string> Figures, RunSettings Settings, string Dir)>();
        string[] args = ["--quick", "--figure", "16,17", "-f", "16", "--threads", "4,1", "--duration", "10", "--repetitions", "2", "--out", "/tmp/x"];

        int code = ScalingCli.Run(args, TextWriter.Null, TextWriter.Null, (f, s, d) => { runs.Add((f, s, d)); return 0; });

        Assert.Equal(0, code);
        (IReadOnlyList<string> figures, RunSettings settings, string dir) = Assert.Single(runs);
        Assert.Equal(["16", "17"], figures);
        Assert.True(settings.Quick);
        Assert.Equal([1, 4], settings.Threads);
        Assert.Equal(TimeSpan.FromMilliseconds(10), settings.Duration);
        Assert.Equal(2, settings.Repetitions);
        Assert.Equal("/tmp/x", dir);
    }

    [Fact]
    public void Plot_MissingDirectory_ExitsTwo()
    {
        using var dir = new TempDirectory();

        (int code, _, string error) = Run("plot", "--dir", dir.File("absent"));

        Assert.Equal(ScalingCli.BadInput, code);
        Assert.Contains("no directory", error);
    }

    [Fact]
    public void Plot_DirectoryWithoutSelectedCsv_ExitsTwo()
    {
        using var dir = new TempDirectory();
        File.WriteAllText(dir.File("fig16.csv"), SmallCsv);

        (int code, _, string error) = Run("plot", "--dir", dir.Path, "--figure", "17");

        Assert.Equal(ScalingCli.BadInput, code);
        Assert.Contains("no fig<N>.csv", error);
    }

    [Fact]
    public void Plot_SmallCsv_WritesPngWithEverySeries()
    {
        using var dir = new TempDirectory();
        File.WriteAllText(dir.File("fig12-push10.csv"), SmallCsv);
        File.WriteAllText(dir.File("fig12-push10.md"), SmallMd.Replace("fig99", "fig12-push10"));

        (int code, string output, _) = Run("plot", "--dir", dir.Path, "--figure", "12");

        Assert.Equal(0, code);
        Assert.Contains("fig12-push10: 2 series x 3 points", output);
        Assert.True(TempDirectory.IsPng(dir.File("fig12-push10.png")));
    }

    [Fact]
    public void Plot_SvgFormat_WritesSvg()
    {
        using var dir = new TempDirectory();
        File.WriteAllText(dir.File("fig11.csv"), SmallCsv);

        (int code, _, _) = Run("plot", "--dir", dir.Path, "--figure", "11", "--format", "svg");

        Assert.Equal(0, code);
        Assert.StartsWith("<?xml", File.ReadAllText(dir.File("fig11.svg")));
    }

    [Fact]
    public void Build_OneLineAndOneMinMaxWhiskerPerSeries_OversubscribedShaded()
    {
        using var dir = new TempDirectory();
        File.WriteAllText(dir.File("fig99.csv"), SmallCsv);
        FigureResult fig = FigureResult.ReadCsv(dir.File("fig99.csv"), "t", "threads");

        ScottPlot.Plot plot = FigurePlot.Build(fig);

        Scatter[] lines = plot.GetPlottables().OfType<Scatter>().ToArray();
        ErrorBar[] whiskers = plot.GetPlottables().OfType<ErrorBar>().ToArray();
        Assert.Equal(["EPVS, depth 1", "lock, \"quoted\""], lines.Select(l => l.LegendText));
        Assert.Equal(2, whiskers.Length);
        // The line is at the median; the whisker reaches the smallest and the largest repetition.
        Assert.Equal([10.0, 20.0, 19.0], whiskers[0].Ys);
        Assert.Equal([1.0, 2.0, 2.0], whiskers[0].YErrorNegative);
        Assert.Equal([2.0, 1.0, 0.5], whiskers[0].YErrorPositive);
        // Same mechanism name "EPVS"/"lock" differ by colour; both are variant 0 of their mechanism.
        Assert.NotEqual(lines[0].Color, lines[1].Color);
        Assert.NotEqual(lines[0].MarkerShape, lines[1].MarkerShape);
        Assert.Single(plot.GetPlottables().OfType<HorizontalSpan>());
    }

    [Fact]
    public void Build_ThirteenSeries_NoTwoLookAlike()
    {
        var fig = new FigureResult("fig20", "t", "threads", ["1", "2"], xIsThreads: true);
        string[] mechanisms = ["a", "b", "c", "d", "e", "f", "g"];
        foreach (string m in mechanisms)
        {
            foreach (string depth in (string[])["depth 1", "depth 4"])
            {
                if (m == "a" && depth == "depth 4")
                    continue; // 13 series, as in fig20
                fig.Add($"{m}, {depth}", "1", new Measurement(1, [1]));
            }
        }

        Scatter[] lines = FigurePlot.Build(fig).GetPlottables().OfType<Scatter>().ToArray();

        Assert.Equal(13, lines.Length);
        Assert.Equal(13, lines.Select(l => (l.Color, l.LinePattern.ToString(), l.MarkerShape)).Distinct().Count());
        Assert.Equal(13, lines.Select(l => l.MarkerShape).Distinct().Count());
    }

    [Fact]
    public void WriteThenReadCsv_RoundTripsEverySample()
    {
        using var dir = new TempDirectory();
        var fig = new FigureResult("fig98", "round trip", "threads", ["1", "2", "64"], xIsThreads: true);
        fig.Add("x, \"y\"", "1", new Measurement(2.5, [2.0, 2.5, 3.25]));
        fig.Add("x, \"y\"", "64", new Measurement(1.5, [1.5]));
        fig.Write(dir.Path);

        FigureResult back = FigureResult.ReadCsv(dir.File("fig98.csv"), "round trip", "threads");

        Assert.True(TempDirectory.IsPng(dir.File("fig98.png")));
        Assert.Equal(["x, \"y\""], back.Series);
        Assert.True(back.TryGetMeasurement("x, \"y\"", "1", out Measurement? m));
        Assert.Equal(2.5, m.Median);
        Assert.Equal([2.0, 2.5, 3.25], m.Samples);
        Assert.False(back.TryGetMeasurement("x, \"y\"", "2", out _));
        Assert.Equal(fig.IsOversubscribed("64"), back.IsOversubscribed("64"));
        Assert.False(back.IsOversubscribed("1"));
    }

    [Theory]
    [InlineData("series,x\n\"a\",1\n", "first line")]
    [InlineData("series,x,oversubscribed,median_mops,samples_mops\n\"a\",1,no,fast,1\n", "'fast' is not a number")]
    [InlineData("series,x,oversubscribed,median_mops,samples_mops\n\"a\",1,no\n", "expected 5 fields")]
    public void ReadCsv_Malformed_ThrowsNamingTheLine(string csv, string expected)
    {
        using var dir = new TempDirectory();
        File.WriteAllText(dir.File("fig11.csv"), csv);

        var e = Assert.Throws<FormatException>(() => FigureResult.ReadCsv(dir.File("fig11.csv"), "t", "threads"));
        Assert.Contains(expected, e.Message);
    }

    [Fact]
    public void ReadLabels_TakesTitleAndXLabelFromMarkdown()
    {
        using var dir = new TempDirectory();
        File.WriteAllText(dir.File("fig99.md"), SmallMd);

        (string title, string xLabel) = ScalingCli.ReadLabels(dir.File("fig99.md"), "fig99");

        Assert.Equal("A small test figure", title);
        Assert.Equal("threads", xLabel);
    }

    [Fact]
    public void WrapTitle_Fig16Title_TwoLinesThatFit()
    {
        const string fig16 = "Checkpointing a KV store, YCSB 50:50 uniform, fine and coarse regions (paper Fig. 16)";

        string[] lines = FigurePlot.WrapTitle(fig16).Split('\n');

        Assert.Equal(2, lines.Length);
        Assert.All(lines, l => Assert.InRange(l.Length, 1, 70));
        Assert.Equal(fig16, string.Join(' ', lines));
    }
}
