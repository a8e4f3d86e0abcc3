using System;
using System.Globalization;
using Epvs.Samples.OwnershipMap;

// Usage: dotnet run -c Release --project samples/OwnershipMap [seconds] [client-threads] [shards]
double seconds = args.Length > 0 ? double.Parse(args[0], CultureInfo.InvariantCulture) : 3.0;
int clients = args.Length > 1 ? int.Parse(args[1], CultureInfo.InvariantCulture) : 2;
int shards = args.Length > 2 ? int.Parse(args[2], CultureInfo.InvariantCulture) : 3;

Console.WriteLine("Ownership map (paper §5.1, Fig. 8): sharded FASTER stores, bucket transfers as EPVS version transitions.");
OwnershipMapDemo.Result result = OwnershipMapDemo.Run(Console.Out, TimeSpan.FromSeconds(seconds), clients, shards);
return result.Misrouted == 0 && result.LostWrites == 0 ? 0 : 1;
