using System;
using System.CommandLine;
using System.IO;

namespace Epvs.Samples.PersistentKv;

/// <summary>
/// The sample's command line: <c>[--duration d]</c> or the positional form; and a hidden
/// <c>writer &lt;heap-path&gt; &lt;seed&gt;</c>, the child process the demo kills.
/// </summary>
public static class Program
{
    /// <summary>Runs the sample on the console.</summary>
    /// <param name="args">The command line.</param>
    /// <returns>0 when the recovered map matches the op log, 1 otherwise, 2 on a bad command line.</returns>
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
    /// <returns>0 when the recovered map matches the op log, 1 otherwise, 2 on a bad command line.</returns>
    public static int Run(string[] args, TextWriter output, TextWriter error)
    {
        var duration = SampleCli.Duration("--duration", "-d", "How long the child writes before it is killed", TimeSpan.FromSeconds(2), TimeSpan.FromMilliseconds(100), TimeSpan.FromMinutes(10), "seconds");
        var command = new RootCommand("PersistentKv: a persistent hash map on the buffered-durable heap, written under load by a child process, killed with SIGKILL, recovered and compared with the op log.");
        duration.AddTo(command);

        var path = new Argument<string>("heap-path");
        var seed = new Argument<int>("seed");
        var writer = new Command(PersistentKvWriter.Role, "The child process the demo kills: create the heap and write until killed.") { path, seed };
        writer.Hidden = true;
        writer.SetAction(parse => PersistentKvWriter.Run(parse.GetValue(path)!, parse.GetValue(seed)));
        command.Add(writer);

        return SampleCli.Invoke(command, args, output, error, parse =>
        {
            output.WriteLine("PersistentKv: a persistent hash map on the buffered-durable heap, written under load, crashed, recovered.");
            PersistentKvDemoResult result = PersistentKvDemo.Run(duration.Value(parse), output);
            return result.MatchesOpLog ? SampleCli.Success : SampleCli.Failed;
        });
    }
}
