using System;
using Epvs.Benchmarks;

// Per-operation suite; `--help` lists the commands, benchmark/RESULTS.md the exact ones behind the published numbers.
//   dotnet run -c Release --project benchmark/Epvs.Benchmarks -- --filter '*' [--job short] [--artifacts DIR]
//   dotnet run -c Release --project benchmark/Epvs.Benchmarks -- plot REPORT.md OUT.svg
return BenchmarksCli.Run(args, Console.Out, Console.Error);
