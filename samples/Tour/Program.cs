using System;
using System.CommandLine;
using System.Diagnostics;
using System.IO;
using System.Linq;
using Epvs.Samples.CprCheckpoint;
using Epvs.Samples.OwnershipMap;
using Epvs.Samples.PersistentKv;
using Epvs.Samples.ResizableArray;

namespace Epvs.Samples.Tour;

/// <summary>
/// The Tour: each of the paper's systems, run briefly on this machine, with what it showed. Command line:
/// <c>[--duration d] [--threads n]</c> or the positional <c>[seconds-per-step]</c>.
/// </summary>
public static class Program
{
    /// <summary>Runs the Tour on the console.</summary>
    /// <param name="args">The command line.</param>
    /// <returns>0 when every step's checks held, 1 otherwise, 2 on a bad command line.</returns>
    public static int Main(string[] args)
    {
        // Ctrl-C or SIGTERM deletes the run's temporary files too (see TemporaryDirectory).
        TemporaryDirectory.DeleteAllOnTermination();
        return Run(args, Console.Out, Console.Error);
    }

    /// <summary>Runs the Tour with its output and errors going where the caller says (the tests call this).</summary>
    /// <param name="args">The command line.</param>
    /// <param name="output">Help and the run's report.</param>
    /// <param name="error">Errors.</param>
    /// <returns>0 when every step's checks held, 1 otherwise, 2 on a bad command line.</returns>
    public static int Run(string[] args, TextWriter output, TextWriter error)
    {
        var duration = SampleCli.Duration("--duration", "-d", "How long each step runs (the persistent-KV step at most 2 s)", TimeSpan.FromSeconds(3), TimeSpan.FromMilliseconds(100), TimeSpan.FromMinutes(10), "seconds-per-step");
        var threads = SampleCli.Int("--threads", "-t", "Worker or client threads per step", Math.Max(2, Environment.ProcessorCount), 1, 256);
        var command = new RootCommand("EPVS for .NET - a tour of the paper's systems: each sample runs briefly and the Tour prints what it showed. Exit code 0 when every check held.");
        duration.AddTo(command);
        threads.AddTo(command);
        return SampleCli.Invoke(command, args, output, error, parse => Tour(output, duration.Value(parse), threads.Value(parse)));
    }

    private static int Tour(TextWriter output, TimeSpan step, int threads)
    {
        var total = Stopwatch.StartNew();
        bool ok = true;

        output.WriteLine($"EPVS for .NET - a tour of the paper's systems ({Environment.ProcessorCount} cores, .NET {Environment.Version})");
        output.WriteLine();

        output.WriteLine("1. Resizable array (paper §3, Figs. 3-6; §6.1 Figs. 11-12): one push/read/write mix, every variant");
        var arrays = ResizableArrayDemo.Run(output, step / ResizableArrayFactory.AllKinds.Length, threads, pushPercent: 10);
        ThroughputResult latched = arrays[0];
        ThroughputResult best = arrays.Where(r => r.Name.Contains("EPVS", StringComparison.Ordinal)).MaxBy(r => r.MillionOpsPerSecond)!;
        string ratio = latched.MillionOpsPerSecond > 0 ? $"{best.MillionOpsPerSecond / latched.MillionOpsPerSecond:0.00}x the reader-writer latch" : "(the latched baseline completed no operation)";
        output.WriteLine($"  => best EPVS variant ({best.Name}) at {ratio}; it grew to {best.FinalCapacity:N0} slots while running (noisy on a shared machine: see benchmark/ for figures)");
        output.WriteLine();

        output.WriteLine("2. Ownership map (paper §5.1, Fig. 8): sharded FASTER stores, bucket transfers as version transitions");
        output.WriteLine($"  running for {SampleCli.Format(step)} ...");
        OwnershipMapDemo.Result ownership = OwnershipMapDemo.Run(output, step, clients: threads, shards: 3);
        bool ownershipOk = ownership.Misrouted == 0 && ownership.LostWrites == 0 && ownership.Transfers > 0;
        ok &= ownershipOk;
        output.WriteLine(ownershipOk
            ? $"  => {ownership.Transfers:N0} transfers with zero misrouted operations and zero lost writes"
            : "  => FAILED: misrouted operations, lost writes or no transfer (see above)");
        output.WriteLine();

        output.WriteLine("3. CPR checkpointing (paper §2.1, §5.2, Figs. 9-10): de-duplicated requests, REST -> WAIT_FLUSH -> REST");
        output.WriteLine($"  running for {SampleCli.Format(step)} ...");
        CprCheckpointDemo.Result cpr = CprCheckpointDemo.Run(output, step, clients: threads);
        bool cprOk = cpr.Inconsistencies == 0 && cpr.DuplicatesApplied == 0 && cpr.CheckedUnderLoad > 0;
        ok &= cprOk;
        output.WriteLine(cprOk
            ? $"  => {cpr.Checkpoints:N0} checkpoints taken, {cpr.CheckedUnderLoad:N0} of them under load and checked; recovered checkpoint {cpr.RecoveredVersion} is a consistent cut"
            : "  => FAILED: inconsistent checkpoint, a duplicate applied or no checkpoint under load (see above)");
        output.WriteLine();

        output.WriteLine("4. Persistent KV (Montage-style buffered durability on EPVS): write under load, crash, recover, compare");
        PersistentKvDemoResult kv = PersistentKvDemo.Run(TimeSpan.FromTicks(Math.Min(step.Ticks, TimeSpan.FromSeconds(2).Ticks)), output);
        ok &= kv.MatchesOpLog;
        output.WriteLine(kv.MatchesOpLog
            ? $"  => after a {kv.CrashKind}, recovery kept the {kv.SurvivingOperations:N0} operations of versions <= {kv.RecoveredVersion}: a consistent prefix of the op log"
            : "  => FAILED: the recovered map does not match the op log (see above)");
        output.WriteLine();

        output.WriteLine($"Tour {(ok ? "completed" : "FAILED")} in {total.Elapsed.TotalSeconds:0.0} s. Each sample runs alone too: dotnet run -c Release --project samples/<Sample> -- --help");
        return ok ? SampleCli.Success : SampleCli.Failed;
    }
}
