using System;
using System.CommandLine;
using System.CommandLine.Parsing;
using System.IO;
using System.Linq;
using System.Threading;

namespace Epvs.Persistence.Benchmarks;

/// <summary>The command line of the comparison table (issue #10): options, validation (exit 2 on bad input), quick mode.</summary>
internal static class ComparisonCli
{
    internal const int BadInput = 2;

    internal static int Run(string[] args, TextWriter output, TextWriter error)
    {
        var quick = new Option<bool>("--quick") { Description = "Smoke run (about 30 s): 100 K keys, 200 ms cells, 1 repetition, 30 syncs, 128 MiB recovery heap." };
        var threads = new Option<int[]?>("--threads") { Description = "Thread counts, comma-separated, 1 to 64 (default 1,2).", HelpName = "N,N", CustomParser = ParseThreads };
        var keys = new Option<int?>("--keys") { Description = "Key range, all preloaded, 1000 to 100000000 (default 1000000).", HelpName = "N", CustomParser = r => ParseInt(r, "--keys", 1000, 100_000_000) };
        var duration = new Option<int?>("--duration") { Description = "Milliseconds per throughput cell, 10 to 600000 (default 1000).", HelpName = "MS", CustomParser = r => ParseInt(r, "--duration", 10, 600_000) };
        var repetitions = new Option<int?>("--repetitions") { Description = "Interleaved repetitions, median reported, 1 to 100 (default 5).", HelpName = "N", CustomParser = r => ParseInt(r, "--repetitions", 1, 100) };
        var syncs = new Option<int?>("--syncs") { Description = "Sync and lag samples each, 5 to 100000 (default 200).", HelpName = "N", CustomParser = r => ParseInt(r, "--syncs", 5, 100_000) };
        var recovery = new Option<int?>("--recovery-mib") { Description = "Size of the crash-recovery heap in MiB, 16 to 65536 (default 1024).", HelpName = "MIB", CustomParser = r => ParseInt(r, "--recovery-mib", 16, 65_536) };
        var domain = new Option<string>("--domain") { Description = "Persistence domain of the map's heap.", DefaultValueFactory = _ => "mapped" };
        domain.AcceptOnlyFromAmong("mapped", "pmem");
        var writeBack = new Option<string>("--write-back") { Description = "How the mapped domain writes back: auto (private on Linux when the heap fits in a quarter of memory), private (pwrite), shared (msync).", DefaultValueFactory = _ => "auto" };
        writeBack.AcceptOnlyFromAmong("auto", "private", "shared");
        var lagWriters = new Option<int?>("--lag-writers") { Description = "Writer threads while Sync latency and durability lag are sampled, 1 to 64 (default 1); more than the advancer keeps up with shows the lag bound at work.", HelpName = "N", CustomParser = r => ParseInt(r, "--lag-writers", 1, 64) };
        var maxVersionAge = new Option<string>("--max-version-age") { Description = "BufferedDurableHeapOptions.MaxVersionAge of the map's heap: 'default' (1.25 advance periods), 'none' (no bound) or milliseconds, 1 to 600000.", HelpName = "MS|none|default", DefaultValueFactory = _ => "default" };
        maxVersionAge.Validators.Add(r =>
        {
            string text = r.GetValueOrDefault<string>() ?? "default";
            if (text is not ("default" or "none") && (!int.TryParse(text, System.Globalization.NumberStyles.Integer, System.Globalization.CultureInfo.InvariantCulture, out int ms) || ms < 1 || ms > 600_000))
            {
                r.AddError($"--max-version-age takes 'default', 'none' or milliseconds from 1 to 600000, not '{text}'");
            }
        });
        var period = new Option<int?>("--period") { Description = "BufferedDurableHeapOptions.AdvancePeriod of the map's heap in milliseconds, 1 to 10000 (default 20); Sync latency and the lag are also reported in periods of it.", HelpName = "MS", CustomParser = r => ParseInt(r, "--period", 1, 10_000) };
        var unsafeSweeps = new Option<bool>("--unsafe-sweeps-not-durable") { Description = "EXPERIMENT, not crash-safe: the map's heap hands swept blocks out without making their frees durable first (no sweep-log entry; a crash can then leave a reuse that recovery reports as damage). Measures what making the frees durable before reuse costs the cycles: an upper bound for a cheaper scheme." };
        var fenceOnly = new Option<bool>("--unsafe-sweeps-fence-only") { Description = "EXPERIMENT, not crash-safe: as --unsafe-sweeps-not-durable, but each sweep still fences, after handing its blocks out (the fences' cost to the cycles that a scheme making the frees durable in a few bytes would still pay)." };
        var refillOnce = new Option<bool>("--refill-sweeps-once") { Description = "EXPERIMENT, crash-safe: the map's heap refills an empty pool with one sweep of its own and takes the heap-full path (a flush of every parked free inside the writer's operation) when others took its blocks first or the parked frees were in a sweep in flight: the behaviour before 2026-12-02, for an A/B run." };
        var noPrefault = new Option<bool>("--no-prefault") { Description = "EXPERIMENT, crash-safe: the mapped-file domain formats segments without populating their pages first (madvise MADV_POPULATE_WRITE), so each page of a fresh segment faults at its first store: the behaviour before 2026-12-02, for an A/B run." };
        var dir = new Option<string?>("--dir") { Description = "Directory for the heap files (default: EPVS_BENCH_DIR or the temp directory).", HelpName = "DIR" };
        var root = new RootCommand(
            "EPVS persistence benchmarks. Without a subcommand: the issue #10 table, side by side in one run — " +
            "PersistentHashMap vs ConcurrentDictionary upsert/read throughput, Sync latency and durability lag under load, 1 GiB crash recovery. " +
            "'durability ...' runs the older per-mode harness ('durability --help'); 'bdn ...' passes the rest to BenchmarkDotNet " +
            "('bdn --help').")
        {
            quick, threads, keys, duration, repetitions, syncs, recovery, domain, writeBack, lagWriters, maxVersionAge, period, unsafeSweeps, fenceOnly, refillOnce, noPrefault, dir,
        };
        root.Subcommands.Add(DurabilityHarness.CreateCommand());
        root.SetAction(parse =>
        {
            bool q = parse.GetValue(quick);
            string directory = parse.GetValue(dir) ?? Environment.GetEnvironmentVariable("EPVS_BENCH_DIR") ?? Path.GetTempPath();
            if (!Directory.Exists(directory))
            {
                error.WriteLine($"error: --dir '{directory}' is not a directory");
                return BadInput;
            }

            var settings = new ComparisonSettings(
                parse.GetValue(threads) is { Length: > 0 } t ? t : [1, 2],
                parse.GetValue(keys) ?? (q ? 100_000 : 1_000_000),
                TimeSpan.FromMilliseconds(parse.GetValue(duration) ?? (q ? 200 : 1000)),
                parse.GetValue(repetitions) ?? (q ? 1 : 5),
                parse.GetValue(syncs) ?? (q ? 30 : 200),
                (long)(parse.GetValue(recovery) ?? (q ? 128 : 1024)) << 20,
                parse.GetValue(domain) == "pmem" ? PersistenceDomainKind.Pmem : PersistenceDomainKind.MappedFile,
                parse.GetValue(writeBack) switch { "private" => MappedFileWriteBack.PrivateMapping, "shared" => MappedFileWriteBack.SharedMapping, _ => MappedFileWriteBack.Auto },
                directory,
                q,
                parse.GetValue(lagWriters) ?? 1,
                parse.GetValue(maxVersionAge) switch
                {
                    "none" => Timeout.InfiniteTimeSpan,
                    "default" or null => null,
                    string ms => TimeSpan.FromMilliseconds(int.Parse(ms, System.Globalization.CultureInfo.InvariantCulture)),
                },
                TimeSpan.FromMilliseconds(parse.GetValue(period) ?? 20),
                parse.GetValue(unsafeSweeps) || parse.GetValue(fenceOnly),
                parse.GetValue(fenceOnly),
                parse.GetValue(refillOnce),
                parse.GetValue(noPrefault));
            return MapComparison.Run(settings, output);
        });

        ParseResult parsed = root.Parse(args);
        if (parsed.Errors.Count > 0)
        {
            // System.CommandLine's own error action exits with 1; a bad command line is 2 here, as for the other tools.
            foreach (ParseError e in parsed.Errors)
            {
                error.WriteLine($"error: {e.Message}");
            }

            error.WriteLine(parsed.CommandResult.Command == root ? "Try '--help'." : $"Try '{parsed.CommandResult.Command.Name} --help'.");
            return BadInput;
        }

        return parsed.Invoke(new InvocationConfiguration { Output = output, Error = error });
    }

    private static int? ParseInt(ArgumentResult result, string name, int min, int max)
    {
        string text = result.Tokens.Count == 1 ? result.Tokens[0].Value : string.Empty;
        if (!int.TryParse(text, System.Globalization.NumberStyles.Integer, System.Globalization.CultureInfo.InvariantCulture, out int value) || value < min || value > max)
        {
            result.AddError($"{name} must be an integer from {min} to {max}, not '{text}'");
            return null;
        }

        return value;
    }

    private static int[]? ParseThreads(ArgumentResult result)
    {
        var list = new System.Collections.Generic.List<int>();
        foreach (Token token in result.Tokens)
        {
            foreach (string part in token.Value.Split(',', StringSplitOptions.RemoveEmptyEntries | StringSplitOptions.TrimEntries))
            {
                if (!int.TryParse(part, System.Globalization.NumberStyles.Integer, System.Globalization.CultureInfo.InvariantCulture, out int n) || n < 1 || n > 64)
                {
                    result.AddError($"--threads takes thread counts from 1 to 64, not '{part}'");
                    return null;
                }

                list.Add(n);
            }
        }

        if (list.Count == 0)
        {
            result.AddError("--threads needs at least one thread count");
            return null;
        }

        return list.Distinct().ToArray();
    }
}
