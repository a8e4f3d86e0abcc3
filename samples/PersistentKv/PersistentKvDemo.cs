using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.IO;
using System.Linq;
using System.Runtime.InteropServices;
using System.Threading;
using Epvs.Persistence;

namespace Epvs.Samples.PersistentKv;

/// <summary>
/// Write under load, crash, reopen, show what survived and that it matches the op log. Used by this sample's Program
/// and by the Tour.
/// </summary>
public static class PersistentKvDemo
{
    private const int Seed = 20240607;

    /// <summary>
    /// Runs the whole story in about <paramref name="duration"/>: a child process writes to a persistent map under
    /// load (two threads, a 20 ms advance period, a Sync every 20,000 operations) and is killed with SIGKILL; the heap
    /// is reopened and the recovered map compared with the child's op log. When the child cannot be started (this
    /// assembly was copied without its runtime configuration), a simulated power failure in-process replaces it.
    /// </summary>
    /// <param name="duration">Roughly how long to write before the crash.</param>
    /// <param name="output">Where to print what happened.</param>
    /// <returns>What the run showed.</returns>
    public static PersistentKvDemoResult Run(TimeSpan duration, TextWriter output)
    {
        ArgumentNullException.ThrowIfNull(output);

        // Deleted afterwards, and on Ctrl-C or SIGTERM too (the 64 MiB heap was left behind); the child exits with this
        // process (see KillChild).
        using var dir = new TemporaryDirectory(Path.GetTempPath(), "epvs-persistentkv-");
        string path = dir.File("kv.heap");
        var lines = new List<string>();
        string crashKind = CanStartChild(out string? assembly)
            ? KillChild(assembly!, path, duration, lines, output)
            : SimulatePowerFailure(path, duration, lines, output);
        return Verify(path, lines, crashKind, output);
    }

    private static bool CanStartChild(out string? assembly)
    {
        assembly = typeof(PersistentKvDemo).Assembly.Location;
        return !string.IsNullOrEmpty(assembly) && File.Exists(Path.ChangeExtension(assembly, ".runtimeconfig.json")) && !OperatingSystem.IsBrowser();
    }

    private static string KillChild(string assembly, string path, TimeSpan duration, List<string> lines, TextWriter output)
    {
        // Its standard input stays open and empty while this process lives: the child exits at its end, so it never
        // outlives this process (see PersistentKvWriter.Run).
        var start = new ProcessStartInfo(DotnetHost()) { RedirectStandardInput = true, RedirectStandardOutput = true, RedirectStandardError = true, UseShellExecute = false };
        start.ArgumentList.Add("exec");
        start.ArgumentList.Add(assembly);
        start.ArgumentList.Add(PersistentKvWriter.Role);
        start.ArgumentList.Add(path);
        start.ArgumentList.Add(Seed.ToString(System.Globalization.CultureInfo.InvariantCulture));

        // libpmem's cache-flush path on an ordinary file (see the Epvs.Persistence README); without libpmem the
        // heap falls back to the mapped-file domain (pwrite or msync through the page cache), equally correct.
        start.Environment["PMEM_IS_PMEM_FORCE"] = "1";

        // The child is killed (SIGKILL): its runtime's diagnostic pipes and socket, which only a normal exit removes,
        // would be left in the temp directory by every run.
        start.Environment["DOTNET_EnableDiagnostics"] = "0";
        using var ready = new ManualResetEventSlim();
        using Process child = Process.Start(start)!;
        child.OutputDataReceived += (_, e) =>
        {
            if (e.Data is null)
            {
                return;
            }

            lock (lines)
            {
                lines.Add(e.Data);
            }

            if (e.Data.StartsWith("ready", StringComparison.Ordinal))
            {
                ready.Set();
            }
        };
        child.ErrorDataReceived += (_, e) =>
        {
            if (e.Data is not null)
            {
                output.WriteLine($"  child stderr: {e.Data}");
            }
        };
        child.BeginOutputReadLine();
        child.BeginErrorReadLine();
        if (!ready.Wait(TimeSpan.FromSeconds(60)))
        {
            child.Kill();
            throw new InvalidOperationException("The writer child process did not start within 60 s.");
        }

        string domain;
        lock (lines)
        {
            domain = lines[0]["ready".Length..].Trim();
        }

        output.WriteLine($"  writer child (pid {child.Id}) uses a {domain}");
        output.WriteLine($"  writing for {duration.TotalSeconds:0.#} s ...");
        child.WaitForExit(duration);
        child.Kill(); // SIGKILL: no finally blocks, no Dispose, no clean-shutdown flag
        child.WaitForExit();
        output.WriteLine($"  killed the writer with SIGKILL (exit code {child.ExitCode})");
        return "SIGKILL of a child process";
    }

    private static string SimulatePowerFailure(string path, TimeSpan duration, List<string> lines, TextWriter output)
    {
        var domain = new SimulatedPersistenceDomain(64L << 20);
        byte[] image;
        using (HeapFile file = HeapFile.Create(domain))
        using (var heap = BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromMilliseconds(20) }))
        {
            var map = new PersistentByteMap<long>(heap, PersistentKvWriter.MapTypeId);
            using var stop = new CancellationTokenSource(duration);
            var threads = Enumerable.Range(0, PersistentKvWriter.Threads).Select(t => new Thread(() => PersistentKvWriter.Write(heap, map, t, Seed, stop.Token, line => { lock (lines) { lines.Add(line); } }))).ToList();
            threads.ForEach(t => t.Start());
            stop.Token.WaitHandle.WaitOne();

            // The power fails while the writers are still running.
            image = domain.Crash(Seed);
            threads.ForEach(t => t.Join());
        }

        domain.Dispose();
        File.WriteAllBytes(path, image);
        output.WriteLine("  simulated a power failure while the writers ran (unflushed words kept or lost at random)");
        return "simulated power failure";
    }

    private static PersistentKvDemoResult Verify(string path, List<string> lines, string crashKind, TextWriter output)
    {
        var ops = new List<KvOp>();
        long synced = 0;
        lock (lines)
        {
            foreach (string line in lines)
            {
                if (KvOp.TryParse(line, out KvOp op))
                {
                    ops.Add(op);
                }
                else if (line.StartsWith("sync ", StringComparison.Ordinal) && line.EndsWith(" .", StringComparison.Ordinal))
                {
                    synced = Math.Max(synced, long.Parse(line.Split(' ')[1], System.Globalization.CultureInfo.InvariantCulture));
                }
            }
        }

        BufferedDurableHeap heap = crashKind.StartsWith("SIGKILL", StringComparison.Ordinal)
            ? BufferedDurableHeap.Open(path, null, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan })
            : OpenImage(path);
        using (heap)
        {
            var map = new PersistentByteMap<long>(heap, PersistentKvWriter.MapTypeId);
            long cut = heap.Recovery.RecoveredVersion;

            // The op log's prefix: per key, the last operation of a version ≤ cut (each key has one writer thread, so
            // the log's order per key is the order the operations ran in).
            var expected = new Dictionary<long, int>();
            long surviving = 0;
            foreach (KvOp op in ops.Where(o => o.Version <= cut))
            {
                surviving++;
                if (op.N < 0)
                {
                    expected.Remove(op.Key);
                }
                else
                {
                    expected[op.Key] = op.N;
                }
            }

            var recovered = map.ToList().ToDictionary(e => e.Key, e => e.Value);
            int wrong = expected.Count(e => !recovered.TryGetValue(e.Key, out byte[]? v) || !v.AsSpan().SequenceEqual(KvOp.ValueFor(e.Key, e.Value)));
            int extra = recovered.Keys.Count(k => !expected.ContainsKey(k));
            bool matches = wrong == 0 && extra == 0 && cut >= synced;
            long lastVersion = ops.Count == 0 ? 0 : ops.Max(o => o.Version);
            foreach (string line in DomainDescription.Describe(heap.Recovery))
            {
                output.WriteLine($"  {line}");
            }

            output.WriteLine($"  op log: {ops.Count:N0} operations in versions up to {lastVersion}; last Sync covered version {synced}");
            output.WriteLine($"  survived: the {surviving:N0} operations of versions ≤ {cut} (durable frontier); lost: {ops.Count - surviving:N0} of the last {lastVersion - cut} version(s) (about {lastVersion - cut} × 20 ms)");
            output.WriteLine($"  recovered map: {recovered.Count:N0} keys; op-log prefix: {expected.Count:N0} keys; wrong or missing {wrong}, extra {extra}, Sync honoured {(cut >= synced ? "yes" : "NO")}");
            output.WriteLine(matches ? "  MATCHES the op log: a consistent prefix, nothing acknowledged by Sync lost." : "  DOES NOT MATCH the op log.");
            return new PersistentKvDemoResult
            {
                CrashKind = crashKind,
                LoggedOperations = ops.Count,
                RecoveredVersion = cut,
                LastLoggedVersion = lastVersion,
                LastSyncedVersion = synced,
                SurvivingOperations = surviving,
                RecoveredKeys = recovered.Count,
                MatchesOpLog = matches,
                RecoveryMilliseconds = heap.Recovery.Duration.TotalMilliseconds,
            };
        }
    }

    private static BufferedDurableHeap OpenImage(string path)
    {
        var domain = SimulatedPersistenceDomain.FromImage(File.ReadAllBytes(path));
        HeapFile file = HeapFile.Open(domain);
        return BufferedDurableHeap.Open(file, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
    }

    private static string DotnetHost()
    {
        string? fromSdk = Environment.GetEnvironmentVariable("DOTNET_HOST_PATH");
        if (!string.IsNullOrEmpty(fromSdk) && File.Exists(fromSdk))
        {
            return fromSdk;
        }

        string root = Path.GetFullPath(Path.Combine(RuntimeEnvironment.GetRuntimeDirectory(), "..", "..", ".."));
        string host = Path.Combine(root, OperatingSystem.IsWindows() ? "dotnet.exe" : "dotnet");
        return File.Exists(host) ? host : "dotnet";
    }
}
