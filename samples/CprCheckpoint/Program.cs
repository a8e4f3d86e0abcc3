using System;
using System.Globalization;
using System.Threading;
using System.Threading.Tasks;
using Epvs.Samples.CprCheckpoint;

// Usage:
//   dotnet run -c Release --project samples/CprCheckpoint [seconds] [client-threads]
//   dotnet Epvs.Samples.CprCheckpoint.dll crash-child <directory> <stall-at-version>
//     (for the killed-process test: checkpoints back to back, printing "checkpoint-complete <v>" for each, until
//      checkpoint <stall-at-version>, whose flush prints "checkpointing <v>" half-way and then hangs until killed)
if (args.Length > 0 && args[0] == "crash-child")
    return CrashChild(args[1], long.Parse(args[2], CultureInfo.InvariantCulture));

double seconds = args.Length > 0 ? double.Parse(args[0], CultureInfo.InvariantCulture) : 3.0;
int clients = args.Length > 1 ? int.Parse(args[1], CultureInfo.InvariantCulture) : 2;
Console.WriteLine("CPR checkpointing (paper §5.2, Figs. 9-10): de-duplicated requests, checkpoints as an EPVS state machine.");
CprCheckpointDemo.Result result = CprCheckpointDemo.Run(Console.Out, TimeSpan.FromSeconds(seconds), clients);
return result.Inconsistencies == 0 && result.DuplicatesApplied == 0 ? 0 : 1;

static int CrashChild(string directory, long stallAt)
{
    using var store = new CprStore(directory, new CprStoreOptions { RetainedCheckpoints = 0 });
    using var hang = new ManualResetEventSlim(false);
    store.FlushHalfWrittenHook = version =>
    {
        if (version < stallAt)
            return;
        Console.Out.WriteLine($"checkpointing {version}");
        Console.Out.Flush();
        hang.Wait(); // never set: the parent kills us here, mid-checkpoint
    };
    int stop = 0;
    var clientTasks = new Task[2];
    for (int c = 0; c < clientTasks.Length; c++)
    {
        long client = c;
        clientTasks[c] = Task.Factory.StartNew(() =>
        {
            using CprSession session = store.OpenSession(client);
            DedupWorkload.RunClient(session, ref stop);
        }, TaskCreationOptions.LongRunning);
    }
    while (true)
    {
        CheckpointInfo info = store.TakeCheckpointAsync().GetAwaiter().GetResult();
        Console.Out.WriteLine($"checkpoint-complete {info.Version}");
        Console.Out.Flush();
        Thread.Sleep(2);
    }
}
