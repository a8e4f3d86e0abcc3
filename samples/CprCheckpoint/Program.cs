using System;
using System.CommandLine;
using System.IO;
using System.Threading;
using System.Threading.Tasks;

namespace Epvs.Samples.CprCheckpoint;

/// <summary>
/// The sample's command line: <c>[--duration d] [--clients n]</c> or the positional form; and a hidden
/// <c>crash-child &lt;directory&gt; &lt;stall-at-version&gt;</c> for the killed-process test, which checkpoints back to
/// back, printing <c>checkpoint-complete &lt;v&gt;</c> for each, until checkpoint <c>stall-at-version</c>, whose flush
/// prints <c>checkpointing &lt;v&gt;</c> half-way and then hangs until killed.
/// </summary>
public static class Program
{
    /// <summary>Runs the sample on the console.</summary>
    /// <param name="args">The command line.</param>
    /// <returns>0 when every checkpoint was consistent and no request applied twice, 1 otherwise, 2 on a bad command line.</returns>
    public static int Main(string[] args)
    {
        // Ctrl-C or SIGTERM deletes the run's temporary files too (see TemporaryDirectory).
        TemporaryDirectory.DeleteAllOnTermination();
        return Run(args, Console.Out, Console.Error);
    }

    /// <summary>Runs the sample with its output and errors going where the caller says (the tests call this).</summary>
    /// <param name="args">The command line.</param>
    /// <param name="output">Help and the run's report.</param>
    /// <param name="error">Errors.</param>
    /// <returns>0 when every checkpoint was consistent and no request applied twice, 1 otherwise, 2 on a bad command line.</returns>
    public static int Run(string[] args, TextWriter output, TextWriter error)
    {
        var duration = SampleCli.Duration("--duration", "-d", "How long the clients run while checkpoints are taken", TimeSpan.FromSeconds(3), TimeSpan.FromMilliseconds(10), TimeSpan.FromMinutes(10), "seconds");
        var clients = SampleCli.Int("--clients", "-c", "Client threads", 2, 1, 256, "client-threads");
        var command = new RootCommand("CPR checkpointing (paper §5.2, Figs. 9-10): de-duplicated requests, checkpoints as an EPVS state machine; checks every checkpoint is a consistent cut.");
        duration.AddTo(command);
        clients.AddTo(command);

        var directory = new Argument<string>("directory");
        var stallAt = new Argument<long>("stall-at-version");
        var crashChild = new Command("crash-child", "For the killed-process test: checkpoint until <stall-at-version>, then hang mid-flush.") { directory, stallAt };
        crashChild.Hidden = true;
        crashChild.SetAction(parse => CrashChild(parse.GetValue(directory)!, parse.GetValue(stallAt), output));
        command.Add(crashChild);

        return SampleCli.Invoke(command, args, output, error, parse =>
        {
            TimeSpan seconds = duration.Value(parse);
            output.WriteLine("CPR checkpointing (paper §5.2, Figs. 9-10): de-duplicated requests, checkpoints as an EPVS state machine.");
            output.WriteLine($"  running for {SampleCli.Format(seconds)} ...");
            CprCheckpointDemo.Result result = CprCheckpointDemo.Run(output, seconds, clients.Value(parse));
            return result.Inconsistencies == 0 && result.DuplicatesApplied == 0 && result.CheckedUnderLoad > 0 ? SampleCli.Success : SampleCli.Failed;
        });
    }

    private static int CrashChild(string directory, long stallAt, TextWriter output)
    {
        using var store = new CprStore(directory, new CprStoreOptions { RetainedCheckpoints = 0 });
        using var hang = new ManualResetEventSlim(false);
        store.FlushHalfWrittenHook = version =>
        {
            if (version < stallAt)
            {
                return;
            }

            output.WriteLine($"checkpointing {version}");
            output.Flush();
            hang.Wait(); // never set: the parent kills us here, mid-checkpoint
        };
        int stop = 0;
        var clientTasks = new Task[2];
        for (int c = 0; c < clientTasks.Length; c++)
        {
            long client = c;
            clientTasks[c] = Task.Factory.StartNew(
                () =>
                {
                    using CprSession session = store.OpenSession(client);
                    DedupWorkload.RunClient(session, ref stop);
                },
                TaskCreationOptions.LongRunning);
        }

        while (true)
        {
            CheckpointInfo info = store.TakeCheckpointAsync().GetAwaiter().GetResult();
            output.WriteLine($"checkpoint-complete {info.Version}");
            output.Flush();
            Thread.Sleep(2); // pacing only: the parent waits on the printed lines, not on time
        }
    }
}
