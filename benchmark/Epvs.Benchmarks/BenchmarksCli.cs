using System;
using System.Collections.Generic;
using System.CommandLine;
using System.CommandLine.Parsing;
using System.IO;
using System.Linq;
using BenchmarkDotNet.Columns;
using BenchmarkDotNet.Configs;
using BenchmarkDotNet.ConsoleArguments;
using BenchmarkDotNet.ConsoleArguments.ListBenchmarks;
using BenchmarkDotNet.Diagnosers;
using BenchmarkDotNet.Jobs;
using BenchmarkDotNet.Loggers;
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
    public const int BadInput = 2;

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
        root.SetAction(parse => RunSuite(parse.UnmatchedTokens.ToArray(), output, error, runBenchmarks));

        ParseResult parsed = root.Parse(args);
        // System.CommandLine's own error action exits with 1; a bad command line is 2 here, as for the other tools.
        if (Epvs.Samples.SampleCli.ReportErrors(parsed, error))
            return BadInput;
        return parsed.Invoke(new InvocationConfiguration { Output = output, Error = error });
    }

    /// <summary>
    /// The suite's configuration for <paramref name="bdnArgs"/>. The default job is shorter than BenchmarkDotNet's
    /// (3 warm-up and 10 measured iterations, one launch) so the whole suite finishes in minutes on a 2-core machine;
    /// it is left out when the command line names a job (e.g. --job short or --job dry), because BenchmarkDotNet 0.15
    /// keeps a default job's explicit counts over the named job's. Median (the statistic RESULTS.md quotes; BDN shows
    /// it only for skewed samples otherwise), Min and Max are always reported, for the chart's bars and whiskers.
    /// </summary>
    public static IConfig CreateConfig(IReadOnlyList<string> bdnArgs)
    {
        IConfig config = DefaultConfig.Instance
            .AddDiagnoser(MemoryDiagnoser.Default)
            .AddColumn(StatisticColumn.Median, StatisticColumn.Min, StatisticColumn.Max)
            .WithOptions(ConfigOptions.JoinSummary);
        bool namesJob = bdnArgs.Any(a => a is "-j" or "--job" || a.StartsWith("--job=", StringComparison.Ordinal));
        return namesJob ? config : config.AddJob(Job.Default
            .WithLaunchCount(1)
            .WithWarmupCount(3)
            .WithIterationCount(10)
            .AsDefault());
    }

    private static int RunSuite(string[] bdnArgs, TextWriter output, TextWriter error, Func<string[], IConfig, IReadOnlyList<Summary>> runBenchmarks)
    {
        // Validate BenchmarkDotNet's arguments with its own parser first, so a typo is exit code 2 with its message
        // rather than an empty run.
        IConfig config = CreateConfig(bdnArgs);
        var log = new AccumulationLogger();
        (bool ok, _, CommandLineOptions? options) = ConfigParser.Parse(bdnArgs, log, config);
        if (bdnArgs.Contains("--help"))
        {
            // BenchmarkDotNet's parser reports its own help as a failure to parse; here it is what was asked for.
            output.Write(log.GetLog());
            return 0;
        }
        if (!ok || options is null)
        {
            // BenchmarkDotNet follows its errors with its whole option list; keep the errors.
            string text = log.GetLog();
            int usage = text.IndexOf("USAGE:", StringComparison.Ordinal);
            error.Write(usage >= 0 ? text[..usage] : text);
            error.WriteLine("error: BenchmarkDotNet did not accept the arguments above. Try '--help', or '-- --help' for BenchmarkDotNet's own options.");
            return BadInput;
        }
        bool listing = options.ListBenchmarkCaseMode != ListBenchmarkCaseMode.Disabled || options.PrintInformation;
        IReadOnlyList<Summary> summaries = runBenchmarks(bdnArgs, config);
        if (listing)
            return 0;
        if (options.Filters.Any() && summaries.Sum(s => s.BenchmarksCases.Length) == 0)
        {
            error.WriteLine($"error: no benchmark matches --filter {string.Join(' ', options.Filters)} (try --list flat)");
            return BadInput;
        }
        int failed = summaries.Sum(s => s.Reports.Count(r => !r.Success)) + summaries.Count(s => s.HasCriticalValidationErrors);
        if (failed > 0)
        {
            error.WriteLine($"error: {failed} benchmark(s) failed or did not validate; see the log above.");
            return 1;
        }
        output.WriteLine($"ran {summaries.Sum(s => s.BenchmarksCases.Length)} benchmark case(s); reports in {summaries.FirstOrDefault()?.ResultsDirectoryPath ?? "(none)"}");
        return 0;
    }
}
