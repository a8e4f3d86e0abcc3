using System;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using BenchmarkDotNet.Configs;
using BenchmarkDotNet.ConsoleArguments;
using BenchmarkDotNet.ConsoleArguments.ListBenchmarks;
using BenchmarkDotNet.Jobs;
using BenchmarkDotNet.Loggers;
using BenchmarkDotNet.Reports;

namespace Epvs.Benchmarks;

/// <summary>
/// What the repository's BenchmarkDotNet programs share: a configuration whose default job gives way to a job named on
/// the command line, BenchmarkDotNet's arguments validated before anything runs, and exit codes <c>0</c> done,
/// <see cref="Failed"/> a benchmark failed, <see cref="BadInput"/> bad command line.
/// </summary>
public static class BenchmarkSuite
{
    /// <summary>Exit code for a run in which a benchmark failed or did not validate.</summary>
    public const int Failed = 1;

    /// <summary>Exit code for a command line that does not parse or validate (nothing was run).</summary>
    public const int BadInput = 2;

    /// <summary>Whether <paramref name="bdnArgs"/> name a job (<c>--job</c>, <c>-j</c> or <c>--job=</c>).</summary>
    /// <param name="bdnArgs">BenchmarkDotNet's arguments.</param>
    /// <returns>Whether a job is named.</returns>
    public static bool NamesJob(IReadOnlyList<string> bdnArgs)
    {
        ArgumentNullException.ThrowIfNull(bdnArgs);
        return bdnArgs.Any(a => a is "-j" or "--job" || a.StartsWith("--job=", StringComparison.Ordinal));
    }

    /// <summary>
    /// <paramref name="config"/> with <paramref name="defaultJob"/> as its default job, left out when
    /// <paramref name="bdnArgs"/> name a job (BenchmarkDotNet 0.15 keeps a default job's explicit counts over the named
    /// job's, so <c>--job dry</c> would still run the default's iterations); and <paramref name="everyJob"/>'s settings
    /// applied to every job that runs, named or default (a BenchmarkDotNet mutator job), for what a suite needs whatever
    /// the job, such as an environment variable of the benchmark processes.
    /// </summary>
    /// <param name="config">The suite's diagnosers, columns and options.</param>
    /// <param name="bdnArgs">BenchmarkDotNet's arguments.</param>
    /// <param name="defaultJob">The job to run when none is named.</param>
    /// <param name="everyJob">Settings for every job, or null.</param>
    /// <returns>The configuration to run <paramref name="bdnArgs"/> with.</returns>
    public static IConfig CreateConfig(IConfig config, IReadOnlyList<string> bdnArgs, Job defaultJob, Job? everyJob = null)
    {
        ArgumentNullException.ThrowIfNull(config);
        ArgumentNullException.ThrowIfNull(defaultJob);
        if (!NamesJob(bdnArgs))
        {
            config = config.AddJob(defaultJob.AsDefault());
        }

        return everyJob is null ? config : config.AddJob(everyJob.AsMutator());
    }

    /// <summary>
    /// Validates <paramref name="bdnArgs"/> with BenchmarkDotNet's own parser, runs them and returns the exit code:
    /// <c>0</c> when every benchmark ran (or a listing or help was asked for), <see cref="Failed"/> when one failed or did
    /// not validate, <see cref="BadInput"/> when BenchmarkDotNet refused the arguments (nothing runs) or the filter
    /// matched no benchmark. A typo is then a message and exit code 2, not an empty successful run.
    /// </summary>
    /// <param name="bdnArgs">BenchmarkDotNet's arguments.</param>
    /// <param name="config">The configuration, from <see cref="CreateConfig"/>.</param>
    /// <param name="output">Help and the closing line (BenchmarkDotNet's own log still goes to the console).</param>
    /// <param name="error">Errors.</param>
    /// <param name="helpHint">Where the program's options and BenchmarkDotNet's are listed, for the error message.</param>
    /// <param name="runBenchmarks">Runs the validated arguments and returns the summaries (tests replace it).</param>
    /// <returns>The exit code.</returns>
    public static int Run(string[] bdnArgs, IConfig config, TextWriter output, TextWriter error, string helpHint, Func<string[], IConfig, IReadOnlyList<Summary>> runBenchmarks)
    {
        ArgumentNullException.ThrowIfNull(bdnArgs);
        ArgumentNullException.ThrowIfNull(output);
        ArgumentNullException.ThrowIfNull(error);
        ArgumentNullException.ThrowIfNull(runBenchmarks);
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
            error.WriteLine($"error: BenchmarkDotNet did not accept the arguments above. {helpHint}");
            return BadInput;
        }

        bool listing = options.ListBenchmarkCaseMode != ListBenchmarkCaseMode.Disabled || options.PrintInformation;
        IReadOnlyList<Summary> summaries = runBenchmarks(bdnArgs, config);
        if (listing)
        {
            return 0;
        }

        if (options.Filters.Any() && summaries.Sum(s => s.BenchmarksCases.Length) == 0)
        {
            error.WriteLine($"error: no benchmark matches --filter {string.Join(' ', options.Filters)} (try --list flat)");
            return BadInput;
        }

        int failed = summaries.Sum(s => s.Reports.Count(r => !r.Success)) + summaries.Count(s => s.HasCriticalValidationErrors);
        if (failed > 0)
        {
            error.WriteLine($"error: {failed} benchmark(s) failed or did not validate; see the log above.");
            return Failed;
        }

        output.WriteLine($"ran {summaries.Sum(s => s.BenchmarksCases.Length)} benchmark case(s); reports in {summaries.FirstOrDefault()?.ResultsDirectoryPath ?? "(none)"}");
        return 0;
    }
}
