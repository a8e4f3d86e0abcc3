using System;
using Epvs.Scaling;

// Ctrl-C or SIGTERM deletes a run's heap and checkpoint files too (see TemporaryDirectory).
Epvs.Samples.TemporaryDirectory.DeleteAllOnTermination();

// Thread-scaling harness for the EPVS paper's §6 figures; `--help` lists the options, benchmark/RESULTS.md the commands.
//   dotnet run -c Release --project benchmark/Epvs.Scaling -- [--quick] [--figure 11,12,...] [--out DIR]
//   dotnet run -c Release --project benchmark/Epvs.Scaling -- plot [--figure ...] [--dir DIR]   (redraw from the CSVs)
return ScalingCli.Run(args, Console.Out, Console.Error);
