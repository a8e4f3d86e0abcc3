using System;
using System.Collections.Concurrent;
using System.Collections.Generic;
using System.Diagnostics;
using System.IO;
using System.Linq;
using System.Threading;
using Epvs.Samples.CprCheckpoint;
using Epvs.Samples.Tests.Infrastructure;
using Xunit;

namespace Epvs.Samples.Tests.CprCheckpoint;

public sealed class CprCheckpointTests : IDisposable
{
    private readonly ITestOutputHelper output;
    private readonly string directory = Path.Combine(Path.GetTempPath(), "epvs-cpr-test-" + Guid.NewGuid().ToString("N"));

    public CprCheckpointTests(ITestOutputHelper output) => this.output = output;

    public void Dispose()
    {
        try
        {
            Directory.Delete(directory, recursive: true);
        }
        catch (DirectoryNotFoundException)
        {
        }
    }

    [Fact]
    public void ConcurrentUpdatesWithBackToBackCheckpoints_EveryCheckpoint_IsAConsistentCut()
    {
        const int Checkpoints = 40;
        (List<CheckpointSnapshot> snapshots, long readCopyUpdates) = RunLoad(Checkpoints, breakAtomicity: false);

        var violations = snapshots.SelectMany(ConsistentCut.Violations).ToList();
        output.WriteLine($"{snapshots.Count} checkpoints, {readCopyUpdates} read-copy-updates during flushes, {violations.Count} violations");
        Assert.Equal(Checkpoints, snapshots.Count);
        Assert.True(violations.Count == 0, string.Join("\n", violations.Take(10)));
        // Not vacuous: requests ran during the checkpoints, and some of them hit frozen records.
        Assert.True(snapshots[^1].ClientSequenceNumbers.Values.Sum() > snapshots[0].ClientSequenceNumbers.Values.Sum(), "No request ran between the first and the last checkpoint.");
        Assert.True(readCopyUpdates > 0, "No request ran during a flush (read-copy-update never exercised).");
        for (int i = 1; i < snapshots.Count; i++)
        {
            Assert.Equal(snapshots[i - 1].Version + 1, snapshots[i].Version);
            foreach ((long client, long last) in snapshots[i - 1].ClientSequenceNumbers)
                Assert.True(snapshots[i].ClientSequenceNumbers[client] >= last, $"Client {client} went back from {last} between checkpoints {i - 1} and {i}.");
        }

        using CprStore recovered = CprStore.Recover(directory, out RecoveryReport report);
        Assert.Equal(snapshots[^1].Version, report.RecoveredVersion);
        Assert.Empty(report.Skipped);
        AssertStoreEquals(snapshots[^1], recovered);
    }

    [Fact]
    public void BatchedUpdatesWithBackToBackCheckpoints_EveryCheckpoint_IsAConsistentCut()
    {
        const int Checkpoints = 20;
        long readCopyUpdates;
        using (var store = new CprStore(directory, new CprStoreOptions { RetainedCheckpoints = 0, FlushToDisk = false }))
        {
            int stop = 0;
            Workers.Run(3, worker =>
            {
                if (worker < 2)
                {
                    // The sample's request stream (request s adds s to key KeyOf(client, s)), 64 requests per region.
                    using CprSession session = store.OpenSession(worker);
                    using CprBatch batch = session.BeginBatch();
                    long sequence = 0;
                    while (Volatile.Read(ref stop) == 0)
                    {
                        for (int i = 0; i < 64; i++)
                        {
                            sequence++;
                            Assert.Equal(RequestResult.Applied, batch.Add(sequence, DedupWorkload.KeyOf(worker, sequence), sequence));
                            if (sequence % 16 == 0)
                                Assert.Equal(RequestResult.Duplicate, batch.Add(sequence, DedupWorkload.KeyOf(worker, sequence), sequence));
                        }
                        Assert.True(batch.TryRead(DedupWorkload.KeyOf(worker, sequence), out long value) && value >= sequence);
                        batch.Refresh();
                    }
                    return;
                }
                try
                {
                    for (int i = 0; i < Checkpoints; i++)
                        store.TakeCheckpointAsync().GetAwaiter().GetResult();
                }
                finally
                {
                    Volatile.Write(ref stop, 1);
                }
            }, TimeSpan.FromSeconds(60));
            readCopyUpdates = store.ReadCopyUpdates;
        }

        var snapshots = Directory.EnumerateFiles(directory, "*" + CheckpointFile.Extension).Select(CheckpointFile.Read).OrderBy(s => s.Version).ToList();
        var violations = snapshots.SelectMany(ConsistentCut.Violations).ToList();
        output.WriteLine($"{snapshots.Count} checkpoints, {readCopyUpdates} read-copy-updates during flushes, {violations.Count} violations");
        Assert.Equal(Checkpoints, snapshots.Count);
        Assert.True(violations.Count == 0, string.Join("\n", violations.Take(10)));
        Assert.True(snapshots[^1].ClientSequenceNumbers.Values.Sum() > snapshots[0].ClientSequenceNumbers.Values.Sum(), "No request ran between the first and the last checkpoint.");
        // Batches cut only at whole batches of 64 requests.
        Assert.All(snapshots.SelectMany(s => s.ClientSequenceNumbers.Values), last => Assert.Equal(0, last % 64));
    }

    [Fact]
    public async System.Threading.Tasks.Task TakeCheckpoint_InsideOpenBatchOnSameThread_Fails()
    {
        using var store = new CprStore(directory, new CprStoreOptions { FlushToDisk = false });
        using CprSession session = store.OpenSession(0);
        System.Threading.Tasks.Task<CheckpointInfo> inside;
        using (CprBatch batch = session.BeginBatch())
        {
            Assert.Equal(RequestResult.Applied, batch.Upsert(1, 7, 70));
            inside = store.TakeCheckpointAsync(); // would wait for this thread's own batch: fails at once instead
        }
        await Assert.ThrowsAsync<InvalidOperationException>(() => inside);
        Assert.Equal(1, (await store.TakeCheckpointAsync()).Records);
    }

    [Fact]
    public void ConcurrentUpdatesWithBackToBackCheckpoints_DedupOutsideProtectionControl_IsCaught()
    {
        // The same load and oracle must catch a request whose update and de-duplication entry are not atomic with
        // respect to the checkpoint, or the test above proves nothing.
        const int Attempts = 3;
        for (int attempt = 0; attempt < Attempts; attempt++)
        {
            Dispose();
            (List<CheckpointSnapshot> snapshots, _) = RunLoad(40, breakAtomicity: true);
            var violations = snapshots.SelectMany(ConsistentCut.Violations).ToList();
            output.WriteLine($"control attempt {attempt}: {violations.Count} inconsistencies in {snapshots.Count} checkpoints{(violations.Count > 0 ? ", first: " + violations[0] : "")}");
            if (violations.Count > 0)
                return;
        }
        Assert.Fail($"Inconclusive: control not caught. {Attempts} runs with the de-duplication entry written outside the update's protected region produced only consistent checkpoints, so the passing test proves nothing.");
    }

    [Fact]
    public void ProcessKilledMidCheckpoint_Recover_ReturnsThePreviousCompleteCheckpoint()
    {
        const long StallAt = 4;
        string dll = Path.Combine(AppContext.BaseDirectory, "Epvs.Samples.CprCheckpoint.dll");
        Assert.True(File.Exists(dll), $"The sample's executable is not next to the tests: {dll}");
        string host = Environment.GetEnvironmentVariable("DOTNET_HOST_PATH") is { Length: > 0 } path ? path : "dotnet";
        var start = new ProcessStartInfo(host)
        {
            RedirectStandardOutput = true,
            RedirectStandardError = true,
            UseShellExecute = false,
        };
        foreach (string argument in new[] { dll, "crash-child", directory, StallAt.ToString(System.Globalization.CultureInfo.InvariantCulture) })
            start.ArgumentList.Add(argument);
        output.WriteLine($"{host} {string.Join(' ', start.ArgumentList)}");

        var lines = new BlockingCollection<string>();
        var errors = new ConcurrentQueue<string>();
        using var child = new Process { StartInfo = start };
        child.OutputDataReceived += (_, e) => { if (e.Data is not null) lines.Add(e.Data); };
        child.ErrorDataReceived += (_, e) => { if (e.Data is not null) errors.Enqueue(e.Data); };
        Assert.True(child.Start());
        child.BeginOutputReadLine();
        child.BeginErrorReadLine();

        long lastComplete = 0;
        bool killed = false;
        try
        {
            var deadline = DateTime.UtcNow + Workers.Timeout;
            while (!killed)
            {
                TimeSpan left = deadline - DateTime.UtcNow;
                string? line = null;
                if (left <= TimeSpan.Zero || !lines.TryTake(out line, left) || line is null)
                    Assert.Fail($"The child did not reach checkpoint {StallAt} within 30 s (exited: {child.HasExited}). stderr: {string.Join("\n", errors)}");
                output.WriteLine($"child: {line}");
                if (line.StartsWith("checkpoint-complete ", StringComparison.Ordinal))
                    lastComplete = long.Parse(line.AsSpan("checkpoint-complete ".Length), provider: System.Globalization.CultureInfo.InvariantCulture);
                else if (line.StartsWith("checkpointing ", StringComparison.Ordinal))
                {
                    Assert.Equal($"checkpointing {StallAt}", line);
                    child.Kill(entireProcessTree: true); // mid-checkpoint: its file is half written
                    killed = true;
                }
            }
        }
        finally
        {
            if (!child.HasExited)
                child.Kill(entireProcessTree: true);
            Assert.True(child.WaitForExit((int)Workers.Timeout.TotalMilliseconds), "The child did not exit after Kill.");
        }

        Assert.Equal(StallAt - 1, lastComplete);
        using CprStore recovered = CprStore.Recover(directory, out RecoveryReport report);
        output.WriteLine($"recovered {report.RecoveredVersion} from {report.RecoveredPath}; skipped: {string.Join("; ", report.Skipped)}");
        Assert.Equal(lastComplete, report.RecoveredVersion);
        SkippedCheckpoint skipped = Assert.Single(report.Skipped);
        Assert.EndsWith(CheckpointFile.TemporaryExtension, skipped.Path);
        Assert.Contains("incomplete", skipped.Reason);
        CheckpointSnapshot snapshot = CheckpointFile.Read(report.RecoveredPath!);
        Assert.Empty(ConsistentCut.Violations(snapshot));
        Assert.True(snapshot.ClientSequenceNumbers.Values.Sum() > 0, "The child applied no request before the checkpoint.");
        AssertStoreEquals(snapshot, recovered);
    }

    [Theory]
    [InlineData("flip", "checksum mismatch")]
    [InlineData("truncate", "truncated")]
    [InlineData("empty", "truncated")]
    [InlineData("magic", "bad magic")]
    public void DamagedLatestCheckpoint_Recover_FallsBackToThePreviousAndSaysWhy(string damage, string reason)
    {
        long[] lastSequence = TakeThreeCheckpoints();
        string latest = CheckpointFile.PathOf(directory, 3);
        Damage(latest, damage);

        using CprStore recovered = CprStore.Recover(directory, out RecoveryReport report);

        output.WriteLine(string.Join("; ", report.Skipped));
        Assert.Equal(2, report.RecoveredVersion);
        SkippedCheckpoint skipped = Assert.Single(report.Skipped);
        Assert.Equal(latest, skipped.Path);
        Assert.Contains(reason, skipped.Reason);
        Assert.Equal(lastSequence[2], report.ClientSequenceNumbers[0]); // the state of checkpoint 2, not 3
        var ex = Assert.Throws<CorruptCheckpointException>(() => CheckpointFile.Read(latest));
        Assert.Contains(latest, ex.Message);
        Assert.Contains(reason, ex.Message);
    }

    [Fact]
    public void EveryCheckpointDamaged_Recover_ThrowsInsteadOfReturningAnEmptyStore()
    {
        TakeThreeCheckpoints();
        for (long v = 1; v <= 3; v++)
            Damage(CheckpointFile.PathOf(directory, v), "flip");

        var ex = Assert.Throws<CorruptCheckpointException>(() => CprStore.Recover(directory, out _));
        Assert.Equal(CheckpointFile.PathOf(directory, 3), ex.Path);
        Assert.Contains("checksum mismatch", ex.Message);
    }

    [Fact]
    public void NewStore_InDirectoryWithCheckpoints_ThrowsInvalidOperation()
    {
        TakeThreeCheckpoints();

        var ex = Assert.Throws<InvalidOperationException>(() => new CprStore(directory));
        Assert.Contains("Recover", ex.Message);
    }

    [Fact]
    public async System.Threading.Tasks.Task ResentRequest_AfterRecovery_IsStillADuplicate()
    {
        using (var store = new CprStore(directory))
        {
            using CprSession session = store.OpenSession(7);
            Assert.Equal(RequestResult.Applied, session.Add(1, 100, 5));
            Assert.Equal(RequestResult.Duplicate, session.Add(1, 100, 5));
            Assert.Equal(RequestResult.Applied, session.Upsert(2, 101, 9));
            await store.TakeCheckpointAsync();
        }

        using CprStore recovered = CprStore.Recover(directory, out RecoveryReport report);
        using CprSession again = recovered.OpenSession(7);
        Assert.Equal(2, again.LastSequenceNumber);
        Assert.Equal(RequestResult.Duplicate, again.Add(2, 100, 5));
        Assert.True(again.TryRead(100, out long value));
        Assert.Equal(5, value);
        Assert.Equal(RequestResult.Applied, again.Add(3, 100, 1));
        Assert.True(again.TryRead(100, out value));
        Assert.Equal(6, value);
        Assert.Equal(2, recovered.Scheme.CurrentState.Version); // continues after checkpoint 1
    }

    /// <summary>Two clients run the sample's request stream while this thread takes <paramref name="checkpoints"/>
    /// checkpoints back to back; returns every checkpoint file's content, oldest first.</summary>
    private (List<CheckpointSnapshot> Snapshots, long ReadCopyUpdates) RunLoad(int checkpoints, bool breakAtomicity)
    {
        long readCopyUpdates;
        using (var store = new CprStore(directory, new CprStoreOptions { RetainedCheckpoints = 0, FlushToDisk = false }))
        {
            store.BreakDedupAtomicityForTesting = breakAtomicity;
            int stop = 0;
            Workers.Run(3, worker =>
            {
                if (worker < 2)
                {
                    using CprSession session = store.OpenSession(worker);
                    (_, long duplicatesApplied) = DedupWorkload.RunClient(session, ref stop);
                    if (duplicatesApplied != 0)
                        throw new InvalidOperationException($"{duplicatesApplied} resent requests were applied twice.");
                    return;
                }
                try
                {
                    for (int i = 0; i < checkpoints; i++)
                        store.TakeCheckpointAsync().GetAwaiter().GetResult();
                }
                finally
                {
                    Volatile.Write(ref stop, 1);
                }
            }, TimeSpan.FromSeconds(60));
            readCopyUpdates = store.ReadCopyUpdates;
        }
        var snapshots = Directory.EnumerateFiles(directory, "*" + CheckpointFile.Extension)
            .Select(CheckpointFile.Read)
            .OrderBy(s => s.Version)
            .ToList();
        return (snapshots, readCopyUpdates);
    }

    /// <summary>Client 0 applies requests and three checkpoints are taken; returns client 0's last sequence number at
    /// each checkpoint (index 1 to 3).</summary>
    private long[] TakeThreeCheckpoints()
    {
        var last = new long[4];
        using var store = new CprStore(directory, new CprStoreOptions { RetainedCheckpoints = 0 });
        using CprSession session = store.OpenSession(0);
        long sequence = 0;
        for (int v = 1; v <= 3; v++)
        {
            for (int i = 0; i < 100 * v; i++)
            {
                sequence++;
                session.Add(sequence, DedupWorkload.KeyOf(0, sequence), sequence);
            }
            last[v] = sequence;
            Assert.Equal(v, store.TakeCheckpointAsync().GetAwaiter().GetResult().Version);
        }
        return last;
    }

    private static void Damage(string path, string how)
    {
        byte[] bytes = File.ReadAllBytes(path);
        switch (how)
        {
            case "flip":
                bytes[bytes.Length / 2] ^= 0x5A;
                File.WriteAllBytes(path, bytes);
                break;
            case "truncate":
                File.WriteAllBytes(path, bytes.AsSpan(0, bytes.Length / 2).ToArray());
                break;
            case "empty":
                File.WriteAllBytes(path, []);
                break;
            case "magic":
                bytes[0] = (byte)'X';
                File.WriteAllBytes(path, bytes);
                break;
            default:
                throw new ArgumentOutOfRangeException(nameof(how), how, null);
        }
    }

    private static void AssertStoreEquals(CheckpointSnapshot expected, CprStore store)
    {
        Assert.Equal(expected.Records.Count, store.KeyCount);
        foreach ((long client, long last) in expected.ClientSequenceNumbers)
        {
            using CprSession session = store.OpenSession(client);
            Assert.Equal(last, session.LastSequenceNumber);
            foreach ((long key, long value) in expected.Records)
            {
                Assert.True(session.TryRead(key, out long actual));
                Assert.Equal(value, actual);
            }
        }
    }
}
