using System;
using System.Globalization;
using Epvs.Samples.ResizableArray;

// Usage: dotnet run -c Release --project samples/ResizableArray [seconds-per-variant] [threads] [push-percent]
double seconds = args.Length > 0 ? double.Parse(args[0], CultureInfo.InvariantCulture) : 1.0;
int threads = args.Length > 1 ? int.Parse(args[1], CultureInfo.InvariantCulture) : Environment.ProcessorCount;
int pushPercent = args.Length > 2 ? int.Parse(args[2], CultureInfo.InvariantCulture) : 10;

Console.WriteLine("Resizable array (paper §3, Figs. 3-6): the same push/read/write mix on every variant.");
ResizableArrayDemo.Run(Console.Out, TimeSpan.FromSeconds(seconds), threads, pushPercent);
