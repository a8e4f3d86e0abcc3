using System;
using Epvs.Persistence.Benchmarks;

// Ctrl-C or SIGTERM deletes a run's heap and checkpoint files too (see TemporaryDirectory).
Epvs.Samples.TemporaryDirectory.DeleteAllOnTermination();

if (args.Length > 0 && args[0] == "bdn")
{
    // dotnet run -c Release --project benchmark/Epvs.Persistence.Benchmarks -- bdn --filter '*' [--job short]
    // Exit codes: 0 done, 1 a benchmark failed, 2 bad command line.
    return PersistenceSuite.Run(args[1..], Console.Out, Console.Error);
}

// The issue #10 comparison table, and the older harness:
//   dotnet run -c Release --project benchmark/Epvs.Persistence.Benchmarks -- durability [seconds-per-cell] [preload] [all|throughput|recovery|sync|advance|leak]
// (--help, durability --help for the options).
return ComparisonCli.Run(args, Console.Out, Console.Error);
