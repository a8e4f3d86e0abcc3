using System;
using System.Diagnostics;
using System.IO;
using System.Threading;
using System.Threading.Tasks;

namespace Epvs.Samples.CprCheckpoint;

/// <summary>Runs clients while checkpoints are taken every few milliseconds, then recovers from the directory and
/// checks the recovered checkpoint. Used by this sample's Program and by the Tour.</summary>
public static class CprCheckpointDemo
{
    /// <summary>What a run did and found.</summary>
    /// <param name="Requests">Requests applied.</param>
    /// <param name="DuplicatesApplied">Resent requests that were applied again (must be 0).</param>
    /// <param name="Checkpoints">Checkpoints completed.</param>
    /// <param name="RecoveredVersion">The version recovered afterwards.</param>
    /// <param name="Inconsistencies">Inconsistencies in every checkpoint taken under load, each checked as it completed,
    /// and in the recovered one (must be 0).</param>
    /// <param name="Seconds">Duration.</param>
    /// <param name="CheckedUnderLoad">Checkpoints taken while the clients ran, each checked (at least one: a checkpoint
    /// taken at rest is consistent whatever the protocol does, so it proves nothing).</param>
    public sealed record Result(long Requests, long DuplicatesApplied, long Checkpoints, long RecoveredVersion, int Inconsistencies, double Seconds, int CheckedUnderLoad);

    /// <summary>Runs the demo in a fresh temporary directory (deleted afterwards) and prints its result.</summary>
    /// <param name="output">Where to print.</param>
    /// <param name="duration">How long the clients run.</param>
    /// <param name="clients">Client threads.</param>
    /// <param name="interval">Pause between checkpoints.</param>
    /// <returns>The result.</returns>
    public static Result Run(TextWriter output, TimeSpan duration, int clients = 2, TimeSpan? interval = null) =>
        Run(output, duration, clients, interval, breakAtomicityForTesting: false);

    /// <summary><see cref="Run(TextWriter, TimeSpan, int, TimeSpan?)"/>, with the store's broken control for tests
    /// (<see cref="CprStore.BreakDedupAtomicityForTesting"/>), which the demo's own check must catch.</summary>
    internal static Result Run(TextWriter output, TimeSpan duration, int clients, TimeSpan? interval, bool breakAtomicityForTesting)
    {
        ArgumentNullException.ThrowIfNull(output);
        TimeSpan pause = interval ?? TimeSpan.FromMilliseconds(5);
        // Deleted afterwards, and on Ctrl-C or SIGTERM too (its checkpoint files were left behind).
        using var temporary = new TemporaryDirectory(Path.GetTempPath(), "epvs-cpr-demo-");
        string directory = temporary.Path;
        long requests = 0, duplicates = 0, checkpoints;
        int stop = 0, inconsistencies = 0, checkedUnderLoad = 0;
        Stopwatch clock;
        using (var store = new CprStore(directory, new CprStoreOptions { RetainedCheckpoints = 3 }))
        {
            store.BreakDedupAtomicityForTesting = breakAtomicityForTesting;
            var tasks = new Task[clients];

            // Every client has its session before the clock starts: on two cores, the first clients' busy loops starved
            // the thread still starting the others, and the whole duration could pass before the first checkpoint.
            using var ready = new CountdownEvent(clients);
            using var go = new ManualResetEventSlim();
            for (int c = 0; c < clients; c++)
            {
                long client = c;
                tasks[c] = Task.Factory.StartNew(() =>
                {
                    CprSession session;
                    try
                    {
                        session = store.OpenSession(client);
                    }
                    finally
                    {
                        ready.Signal(); // also when the session failed: the clock must not wait for ever
                    }

                    using CprSession opened = session;
                    go.Wait();
                    (long applied, long dup) = DedupWorkload.RunClient(opened, ref stop);
                    Interlocked.Add(ref requests, applied);
                    Interlocked.Add(ref duplicates, dup);
                }, TaskCreationOptions.LongRunning);
            }
            ready.Wait();
            clock = Stopwatch.StartNew();
            go.Set();

            // The first checkpoint is cut only once requests have been applied (a review: cut at once, it could precede
            // every request, and "checked under load" proved nothing).
            SpinWait.SpinUntil(() => store.KeyCount > 0 || Array.Exists(tasks, t => t.IsCompleted));
            do
            {
                // Each checked as it completes, cut while requests are in flight: what the protocol must get right.
                // (The final one below, taken at rest, would be consistent whatever the protocol did; it used to be
                // the only one checked.) At least one, however short the run.
                CheckpointInfo taken = store.TakeCheckpointAsync().GetAwaiter().GetResult();
                inconsistencies += DedupWorkload.FindInconsistencies(CheckpointFile.Read(taken.Path)).Count;
                checkedUnderLoad++;
                Thread.Sleep(pause);
            }
            while (clock.Elapsed < duration);
            Volatile.Write(ref stop, 1); // release
            if (!Task.WaitAll(tasks, TimeSpan.FromSeconds(30)))
                throw new TimeoutException("A CPR client did not stop within 30 s.");
            store.TakeCheckpointAsync().GetAwaiter().GetResult(); // a final one at rest
            checkpoints = store.CheckpointsCompleted;
        }
        double seconds = clock.Elapsed.TotalSeconds;

        using CprStore recovered = CprStore.Recover(directory, out RecoveryReport report);
        inconsistencies += DedupWorkload.FindInconsistencies(CheckpointFile.Read(report.RecoveredPath!)).Count;
        var result = new Result(requests, duplicates, checkpoints, report.RecoveredVersion ?? 0, inconsistencies, seconds, checkedUnderLoad);
        output.WriteLine($"  {clients} client threads, a checkpoint every {pause.TotalMilliseconds:0} ms for {duration.TotalSeconds:0.#} s, written to a temporary directory ({directory}, deleted afterwards)");
        output.WriteLine($"  {result.Requests:N0} requests ({result.Requests / seconds / 1e6:0.00} M/s) applied; resent requests applied twice: {result.DuplicatesApplied}");
        output.WriteLine($"  {result.Checkpoints:N0} checkpoints taken (REST -> WAIT_FLUSH -> REST), each a real file, fsynced and renamed");
        output.WriteLine($"  recovered checkpoint {result.RecoveredVersion} ({recovered.KeyCount:N0} keys, {report.ClientSequenceNumbers.Count} clients' commit points)");
        output.WriteLine($"  inconsistencies in the {checkedUnderLoad:N0} checkpoints taken under load (each checked as it completed) and the recovered one: {result.Inconsistencies}");
        return result;
    }
}
