using System;
using System.Globalization;
using Epvs.Samples.PersistentKv;

// Usage: dotnet run -c Release --project samples/PersistentKv [seconds]
//        (internal) ... writer <heap-path> <seed>   — the child process the demo kills
if (args.Length >= 3 && args[0] == PersistentKvWriter.Role)
{
    return PersistentKvWriter.Run(args[1], int.Parse(args[2], CultureInfo.InvariantCulture));
}

double seconds = args.Length > 0 ? double.Parse(args[0], CultureInfo.InvariantCulture) : 2.0;
Console.WriteLine("PersistentKv: a persistent hash map on the buffered-durable heap, written under load, crashed, recovered.");
PersistentKvDemoResult result = PersistentKvDemo.Run(TimeSpan.FromSeconds(seconds), Console.Out);
return result.MatchesOpLog ? 0 : 1;
