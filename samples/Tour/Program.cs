using System;
using System.Diagnostics;
using System.Globalization;
using System.Linq;
using Epvs.Samples.CprCheckpoint;
using Epvs.Samples.OwnershipMap;
using Epvs.Samples.PersistentKv;
using Epvs.Samples.ResizableArray;

// The Tour: each of the paper's systems, run briefly on this machine, with what it showed.
// Usage: dotnet run -c Release --project samples/Tour [seconds-per-step]
double seconds = args.Length > 0 ? double.Parse(args[0], CultureInfo.InvariantCulture) : 3.0;
int threads = Math.Max(2, Environment.ProcessorCount);
var total = Stopwatch.StartNew();
bool ok = true;

Console.WriteLine($"EPVS for .NET - a tour of the paper's systems ({Environment.ProcessorCount} cores, .NET {Environment.Version})");
Console.WriteLine();

Console.WriteLine("1. Resizable array (paper §3, Figs. 3-6; §6.1 Figs. 11-12): one push/read/write mix, every variant");
var arrays = ResizableArrayDemo.Run(Console.Out, TimeSpan.FromSeconds(seconds / ResizableArrayFactory.AllKinds.Length), threads, pushPercent: 10);
ThroughputResult latched = arrays[0];
ThroughputResult best = arrays.Where(r => r.Name.Contains("EPVS", StringComparison.Ordinal)).MaxBy(r => r.MillionOpsPerSecond)!;
Console.WriteLine($"  => best EPVS variant ({best.Name}) at {best.MillionOpsPerSecond / latched.MillionOpsPerSecond:0.00}x the reader-writer latch; it grew to {best.FinalCapacity:N0} slots while running (noisy on a shared machine: see benchmark/ for figures)");
Console.WriteLine();

Console.WriteLine("2. Ownership map (paper §5.1, Fig. 8): sharded FASTER stores, bucket transfers as version transitions");
OwnershipMapDemo.Result ownership = OwnershipMapDemo.Run(Console.Out, TimeSpan.FromSeconds(seconds), clients: threads, shards: 3);
bool ownershipOk = ownership.Misrouted == 0 && ownership.LostWrites == 0 && ownership.Transfers > 0;
ok &= ownershipOk;
Console.WriteLine(ownershipOk
    ? $"  => {ownership.Transfers:N0} transfers with zero misrouted operations and zero lost writes"
    : "  => FAILED: misrouted operations or lost writes (see above)");
Console.WriteLine();

Console.WriteLine("3. CPR checkpointing (paper §2.1, §5.2, Figs. 9-10): de-duplicated requests, REST -> WAIT_FLUSH -> REST");
CprCheckpointDemo.Result cpr = CprCheckpointDemo.Run(Console.Out, TimeSpan.FromSeconds(seconds), clients: threads);
bool cprOk = cpr.Inconsistencies == 0 && cpr.DuplicatesApplied == 0 && cpr.Checkpoints > 0;
ok &= cprOk;
Console.WriteLine(cprOk
    ? $"  => {cpr.Checkpoints:N0} checkpoints taken; recovered checkpoint {cpr.RecoveredVersion} is a consistent cut"
    : "  => FAILED: inconsistent checkpoint or a duplicate applied (see above)");
Console.WriteLine();

Console.WriteLine("4. Persistent KV (Montage-style buffered durability on EPVS): write under load, crash, recover, compare");
PersistentKvDemoResult kv = PersistentKvDemo.Run(TimeSpan.FromSeconds(Math.Min(seconds, 2)), Console.Out);
ok &= kv.MatchesOpLog;
Console.WriteLine(kv.MatchesOpLog
    ? $"  => after a {kv.CrashKind}, recovery kept the {kv.SurvivingOperations:N0} operations of versions <= {kv.RecoveredVersion}: a consistent prefix of the op log"
    : "  => FAILED: the recovered map does not match the op log (see above)");
Console.WriteLine();

Console.WriteLine($"Tour {(ok ? "completed" : "FAILED")} in {total.Elapsed.TotalSeconds:0.0} s. Each sample runs alone too: dotnet run -c Release --project samples/<Sample>");
return ok ? 0 : 1;
