using System.Collections.Generic;
using System.IO;
using System.Linq;
using BenchmarkDotNet.Columns;
using BenchmarkDotNet.Configs;
using BenchmarkDotNet.Jobs;
using BenchmarkDotNet.Running;
using Epvs.Benchmarks;

namespace Epvs.Persistence.Benchmarks;

/// <summary>
/// The <c>bdn</c> command: the persistence classes under BenchmarkDotNet, with the per-operation suite's handling of the
/// command line (<see cref="BenchmarkSuite"/>): a named <c>--job</c> replaces the default job, BenchmarkDotNet's
/// arguments are validated first, and the exit code says whether every benchmark ran.
/// </summary>
internal static class PersistenceSuite
{
    /// <summary>
    /// The configuration for <paramref name="bdnArgs"/>: a default job of 3 warm-up and 15 measured iterations unless a
    /// job is named, and PMEM_IS_PMEM_FORCE=1 on every job, named or not. It must be in the native environment of the
    /// process that loads libpmem, and BenchmarkDotNet starts each benchmark in a child process with its job's variables.
    /// Median, Min and Max are always reported (RESULTS.md quotes medians; BenchmarkDotNet shows the median only for
    /// skewed samples otherwise).
    /// </summary>
    internal static IConfig CreateConfig(IReadOnlyList<string> bdnArgs) =>
        BenchmarkSuite.CreateConfig(
            DefaultConfig.Instance.AddColumn(StatisticColumn.Median, StatisticColumn.Min, StatisticColumn.Max),
            bdnArgs,
            Job.Default.WithWarmupCount(3).WithIterationCount(15),
            new Job("PmemForced").WithEnvironmentVariables(new EnvironmentVariable("PMEM_IS_PMEM_FORCE", "1")));

    internal static int Run(string[] bdnArgs, TextWriter output, TextWriter error) =>
        BenchmarkSuite.Run(
            bdnArgs,
            CreateConfig(bdnArgs),
            output,
            error,
            "Try 'bdn --help' for BenchmarkDotNet's options.",
            (args, config) => BenchmarkSwitcher.FromAssembly(typeof(AllocateWritePersistBenchmarks).Assembly).Run(args, config).ToList());
}
