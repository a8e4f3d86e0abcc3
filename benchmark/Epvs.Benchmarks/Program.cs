using BenchmarkDotNet.Configs;
using BenchmarkDotNet.Diagnosers;
using BenchmarkDotNet.Jobs;
using BenchmarkDotNet.Running;
using Epvs.Benchmarks;

// --plot REPORT.md OUT.svg: draw the joined report of a previous run (see RESULTS.md) instead of running benchmarks.
if (args.Length == 3 && args[0] == "--plot")
{
    ReportPlot.Write(args[1], args[2]);
    return;
}

// The default job is shorter than BenchmarkDotNet's (3 warm-up and 10 measured iterations, one launch) so the whole
// suite finishes in minutes on a 2-core machine; any --job on the command line (e.g. --job short) replaces it.
IConfig config = DefaultConfig.Instance
    .AddJob(Job.Default
        .WithLaunchCount(1)
        .WithWarmupCount(3)
        .WithIterationCount(10)
        .AsDefault())
    .AddDiagnoser(MemoryDiagnoser.Default)
    .WithOptions(ConfigOptions.JoinSummary);
BenchmarkSwitcher.FromAssembly(typeof(LightEpochBenchmarks).Assembly).Run(args, config);
