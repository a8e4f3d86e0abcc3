using System;
using Epvs.Scaling;

// Thread-scaling harness for the EPVS paper's §6 figures; `--help` lists the options, benchmark/RESULTS.md the commands.
//   dotnet run -c Release --project benchmark/Epvs.Scaling -- [--quick] [--figure 11,12,...] [--out DIR]
//   dotnet run -c Release --project benchmark/Epvs.Scaling -- plot [--figure ...] [--dir DIR]   (redraw from the CSVs)
return ScalingCli.Run(args, Console.Out, Console.Error);
