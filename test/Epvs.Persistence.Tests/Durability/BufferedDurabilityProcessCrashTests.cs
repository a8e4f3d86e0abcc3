using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Globalization;
using System.Linq;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// Process crashes: a child process writing under load (two threads, 5 ms advance period) is killed with SIGKILL after a
/// seeded number of operations; the parent reopens the heap and checks it against the child's op log. On the libpmem
/// domain (PMEM_IS_PMEM_FORCE=1) a process crash keeps every store in the page cache, so payloads beyond the frontier
/// and half-written ones are all in the file: recovery must still cut exactly at the frontier. Through a private
/// mapping only what was written back (pwrite) is in the file: a store never written back is lost, while a write-back
/// not yet fenced survives a killed process in the page cache (it would not survive a power failure).
/// </summary>
public sealed class BufferedDurabilityProcessCrashTests
{
    private readonly ITestOutputHelper _output;

    public BufferedDurabilityProcessCrashTests(ITestOutputHelper output) => _output = output;

    [Theory]
    [InlineData(1, "pmem")]
    [InlineData(2, "pmem")]
    [InlineData(3, "pmem")]
    [InlineData(4, "private")]
    [InlineData(5, "private")]
    public void Sigkill_DuringAConcurrentWriteLoad_RecoversTheFrontierPrefixOfTheOpLog(int seed, string domain)
    {
        Assert.SkipWhen(domain == "private" && !OperatingSystem.IsLinux(), "private mappings are Linux only");
        using var dir = new TempDirectory();
        string path = dir.File("kill.heap");
        int target = new Random(seed).Next(2_000, 12_000);
        (OpLog log, long synced, int parsed) = RunAndKill(path, seed, target, domain);

        bool controlCaught;
        if (domain == "private")
        {
            // The control through a private mapping: a child whose advancer persists the frontier before it writes the
            // version back, killed in between (it stops there and says so). The frontier then covers payloads that
            // never reached the file, which the same check must report.
            string controlPath = dir.File("kill-control.heap");
            (OpLog controlLog, long controlSynced, _) = RunAndKill(controlPath, seed, int.MaxValue, "private-frontier-first", DurableChild.WindowLine);
            using BufferedDurableHeap broken = BufferedDurableHeap.Open(controlPath, new HeapFileOptions { Domain = PersistenceDomainKind.MappedFile }, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
            List<string> caught = Check(broken, controlLog, controlSynced, out _);
            _output.WriteLine($"control (frontier persisted before the write-back): {caught.Count} violations, e.g. {caught.FirstOrDefault()}");
            controlCaught = caught.Count > 0;
        }
        else
        {
            // The control first, on a copy: a recovery that keeps tags beyond the frontier must be caught by the same
            // check. Whether it can be depends on where the kill fell (payloads beyond the frontier must have reached
            // the file, and the op log must name an operation of a version beyond it, which a kill sometimes does not:
            // one logged nothing past version 15, its frontier), so a kill that missed it is followed by up to three more kills of the control's own;
            // uncaught in all four, the run is inconclusive (skipped), after the real check has run.
            string copy = dir.File("kill-copy.heap");
            System.IO.File.Copy(path, copy);
            controlCaught = KeepingTagsBeyondTheFrontierIsCaught(copy, log, synced);
            for (int extra = 1; extra <= 3 && !controlCaught; extra++)
            {
                string again = dir.File($"kill-control-{extra}.heap");
                int againSeed = seed + (100 * extra);
                (OpLog againLog, long againSynced, _) = RunAndKill(again, againSeed, new Random(againSeed).Next(2_000, 12_000), domain);
                controlCaught = KeepingTagsBeyondTheFrontierIsCaught(again, againLog, againSynced);
            }
        }

        using BufferedDurableHeap heap = BufferedDurableHeap.Open(path, new HeapFileOptions { Domain = PersistenceDomainKind.MappedFile }, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
        _output.WriteLine($"seed={seed} domain={domain} killed after {parsed} logged operations (target {target}); last Sync covered {synced}; last version {log.MaxVersion}; {heap.Recovery}");
        List<string> violations = Check(heap, log, synced, out long count);
        violations.AddRange(DurableCrashCheck.UidsAndLeaks(heap, count));
        Assert.Empty(violations);
        Assert.False(heap.Recovery.WasCleanShutdown);
        Assert.True(heap.Recovery.RecoveredVersion > 1, "nothing became durable before the kill; the test exercised nothing");
        Assert.SkipUnless(controlCaught, "inconclusive: the broken variant was not caught on any of its kills, so this run proves nothing");
    }

    /// <summary>Whether the check catches the broken control (a recovery keeping tags beyond the frontier) on the killed heap at <paramref name="path"/>.</summary>
    private bool KeepingTagsBeyondTheFrontierIsCaught(string path, OpLog log, long synced)
    {
        using BufferedDurableHeap broken = BufferedDurableHeap.Open(path, new HeapFileOptions { Domain = PersistenceDomainKind.MappedFile }, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, Faults = DurabilityFaults.KeepTagsBeyondFrontier });
        List<string> caught = Check(broken, log, synced, out _);
        _output.WriteLine($"control (recovery keeping tags beyond the frontier): {caught.Count} violations, e.g. {caught.FirstOrDefault()}");
        return caught.Count > 0;
    }

    /// <summary>Runs the child on <paramref name="path"/> until it logged <paramref name="target"/> operations (or printed <paramref name="killOnLine"/>), kills it, and parses its log.</summary>
    private static (OpLog Log, long Synced, int Parsed) RunAndKill(string path, int seed, int target, string domain, string? killOnLine = null)
    {
        var lines = new List<string>();
        int ops = 0;
        using var reached = new ManualResetEventSlim();
        using (Process child = TestProgram.StartChild(
            new Dictionary<string, string> { ["PMEM_IS_PMEM_FORCE"] = "1" },
            line =>
            {
                lock (lines)
                {
                    lines.Add(line);
                    if ((line.StartsWith("op ", StringComparison.Ordinal) && ++ops >= target) || line == killOnLine)
                    {
                        reached.Set();
                    }
                }
            },
            DurableChild.Role,
            path,
            seed.ToString(CultureInfo.InvariantCulture),
            domain))
        {
            bool got = reached.Wait(TimeSpan.FromSeconds(90));
            bool exited = child.HasExited;
            child.Kill(); // SIGKILL on Unix
            Assert.True(child.WaitForExit(30_000), "the killed child did not exit");
            child.WaitForExit();
            Assert.True(got && !exited, $"the child stopped before {target} operations: {string.Join(" | ", lines.Take(5))}");
        }

        var log = new OpLog(DurableChild.Threads);
        long synced = 0;
        int parsed = 0;
        lock (lines)
        {
            foreach (string line in lines)
            {
                string[] f = line.Split(' ');
                if (f.Length == 6 && f[0] == "op" && f[5] == ".")
                {
                    long key = long.Parse(f[3], CultureInfo.InvariantCulture);
                    log.Add(int.Parse(f[1], CultureInfo.InvariantCulture), new MapOp(long.Parse(f[2], CultureInfo.InvariantCulture), key, f[4] == "D" ? null : OpLog.ValueFor(key, int.Parse(f[4], CultureInfo.InvariantCulture))));
                    parsed++;
                }
                else if (f.Length == 3 && f[0] == "sync" && f[2] == ".")
                {
                    synced = Math.Max(synced, long.Parse(f[1], CultureInfo.InvariantCulture));
                }
            }
        }

        return (log, synced, parsed);
    }

    /// <summary>The recovered map against the op log's prefix at the recovered version, and Sync's promise.</summary>
    private static List<string> Check(BufferedDurableHeap heap, OpLog log, long synced, out long count)
    {
        long cut = heap.Recovery.RecoveredVersion;
        List<string> violations;
        count = 0;
        try
        {
            var map = new PersistentByteMap<long>(heap, DurableWorkload.MapTypeId);
            count = map.Count;
            violations = log.Compare(cut, DurableWorkload.Contents(map));
        }
        catch (System.IO.InvalidDataException inner)
        {
            violations = new List<string> { inner.Message };
        }

        if (cut < synced)
        {
            violations.Add($"a Sync covering version {synced} returned, but recovery kept only ≤ {cut}");
        }

        return violations;
    }
}
