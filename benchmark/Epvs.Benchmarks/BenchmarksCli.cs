using System;
using System.Collections.Generic;
using System.CommandLine;
using System.CommandLine.Parsing;
using System.IO;
using System.Linq;
using BenchmarkDotNet.Columns;
using BenchmarkDotNet.Configs;
using BenchmarkDotNet.Diagnosers;
using BenchmarkDotNet.Jobs;
using BenchmarkDotNet.Reports;
using BenchmarkDotNet.Running;

namespace Epvs.Benchmarks;

/// <summary>
/// The command line of the per-operation suite: run benchmarks (every argument this program does not know goes to
/// BenchmarkDotNet: <c>--filter</c>, <c>--job</c>, <c>--artifacts</c>, <c>--list</c>…) or draw a report (<c>plot</c>).
/// Exit codes: 0 done, 1 a benchmark failed, 2 bad command line.
/// </summary>
public static class BenchmarksCli
{
    /// <summary>Exit code for a command line that does not parse or validate.</summary>
    public const int BadInput = BenchmarkSuite.BadInput;

    /// <summary>Parses <paramref name="args"/> and runs the command, writing to the given writers.</summary>
    /// <param name="args">The command line.</param>
    /// <param name="output">Help and results (BenchmarkDotNet's own log still goes to the console).</param>
    /// <param name="error">Errors.</param>
    /// <param name="runBenchmarks">Runs the validated BenchmarkDotNet arguments and returns the summaries; the
    /// default runs <see cref="BenchmarkSwitcher"/> over this assembly. Tests replace it to see what would run.</param>
    public static int Run(string[] args, TextWriter output, TextWriter error, Func<string[], IConfig, IReadOnlyList<Summary>>? runBenchmarks = null)
    {
        runBenchmarks ??= (bdnArgs, config) => BenchmarkSwitcher.FromAssembly(typeof(LightEpochBenchmarks).Assembly).Run(bdnArgs, config).ToList();

        var report = new Argument<FileInfo>("report") { Description = "The joined GitHub-Markdown report of a run (*-report-github.md)." };
        report.AcceptExistingOnly();
        var image = new Argument<FileInfo>("image") { Description = "The chart to write: .svg or .png." };
        image.Validators.Add(r =>
        {
            string ext = Path.GetExtension(r.GetValueOrDefault<FileInfo>()?.Name ?? "").ToLowerInvariant();
            if (ext is not (".svg" or ".png"))
                r.AddError($"image: '{ext}' is not .svg or .png");
        });
        var plot = new Command("plot", "Draw a report of a previous run as a bar chart of the medians (see benchmark/RESULTS.md).")
        {
            report, image,
        };
        plot.Aliases.Add("--plot"); // the spelling RESULTS.md used before this command line existed
        plot.SetAction(parse =>
        {
            int bars = ReportPlot.Write(parse.GetValue(report)!.FullName, parse.GetValue(image)!.FullName);
            output.WriteLine($"{bars} bars -> {parse.GetValue(image)!.FullName}");
            return bars > 0 ? 0 : 1;
        });

        var root = new RootCommand(
            "Per-operation costs of Epvs next to FASTER.core 2.6.5 and lock baselines (BenchmarkDotNet). Every argument " +
            "not listed here goes to BenchmarkDotNet, e.g. --filter '*Refresh*', --job short, --list flat, " +
            "--artifacts DIR; put BenchmarkDotNet's own --help after '--' (dotnet run ... -- -- --help). -h is this " +
            "program's help: to hide columns write BenchmarkDotNet's --hide in full.")
        {
            TreatUnmatchedTokensAsErrors = false,
        };
        root.Subcommands.Add(plot);
        root.SetAction(parse =>
        {
            string[] bdnArgs = parse.UnmatchedTokens.ToArray();
            return BenchmarkSuite.Run(bdnArgs, CreateConfig(bdnArgs), output, error, "Try '--help', or '-- --help' for BenchmarkDotNet's own options.", runBenchmarks);
        });

        ParseResult parsed = root.Parse(args);
        // System.CommandLine's own error action exits with 1; a bad command line is 2 here, as for the other tools.
        if (Epvs.Samples.SampleCli.ReportErrors(parsed, error))
            return BadInput;
        return parsed.Invoke(new InvocationConfiguration { Output = output, Error = error });
    }

    /// <summary>
    /// The suite's configuration for <paramref name="bdnArgs"/>. The default job is shorter than BenchmarkDotNet's
    /// (3 warm-up and 10 measured iterations, one launch) so the whole suite finishes in minutes on a 2-core machine;
    /// it is left out when the command line names a job (e.g. --job short or --job dry: see
    /// <see cref="BenchmarkSuite.CreateConfig"/>). Median (the statistic RESULTS.md quotes; BDN shows it only for skewed
    /// samples otherwise), Min and Max are always reported, for the chart's bars and whiskers.
    /// </summary>
    public static IConfig CreateConfig(IReadOnlyList<string> bdnArgs)
    {
        IConfig config = DefaultConfig.Instance
            .AddDiagnoser(MemoryDiagnoser.Default)
            .AddColumn(StatisticColumn.Median, StatisticColumn.Min, StatisticColumn.Max)
            .WithOptions(ConfigOptions.JoinSummary);
        return BenchmarkSuite.CreateConfig(config, bdnArgs, Job.Default
            .WithLaunchCount(1)
            .WithWarmupCount(3)
            .WithIterationCount(10));
    }
}
