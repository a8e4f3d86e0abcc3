using System;
using BenchmarkDotNet.Configs;
using BenchmarkDotNet.Jobs;
using BenchmarkDotNet.Running;
using Epvs.Persistence.Benchmarks;

if (args.Length > 0 && args[0] == "durability")
{
    // dotnet run -c Release --project benchmark/Epvs.Persistence.Benchmarks -- durability [seconds-per-cell] [preload] [all|throughput|recovery|sync]
    return DurabilityHarness.Run(args);
}

if (args.Length == 0 || args[0] != "bdn")
{
    // The issue #10 comparison table (--help for the options).
    return ComparisonCli.Run(args, Console.Out, Console.Error);
}

args = args[1..];


// PMEM_IS_PMEM_FORCE must be in the native environment of the process that loads libpmem, so it is set on the job:
// BenchmarkDotNet starts each benchmark in a child process with these variables.
IConfig config = DefaultConfig.Instance
    .AddJob(Job.Default
        .WithWarmupCount(3)
        .WithIterationCount(15)
        .WithEnvironmentVariables(new EnvironmentVariable("PMEM_IS_PMEM_FORCE", "1"))
        .AsDefault());
BenchmarkSwitcher.FromAssembly(typeof(AllocateWritePersistBenchmarks).Assembly).Run(args, config);
return 0;
