using System;
using System.CommandLine;
using System.IO;

namespace Epvs.Samples.OwnershipMap;

/// <summary>The sample's command line: <c>[--duration d] [--clients n] [--shards n]</c> or the positional form.</summary>
public static class Program
{
    /// <summary>Runs the sample on the console.</summary>
    /// <param name="args">The command line.</param>
    /// <returns>0 when no operation was misrouted and no write lost, 1 otherwise, 2 on a bad command line.</returns>
    public static int Main(string[] args) => Run(args, Console.Out, Console.Error);

    /// <summary>Runs the sample with its output and errors going where the caller says (the tests call this).</summary>
    /// <param name="args">The command line.</param>
    /// <param name="output">Help and the run's report.</param>
    /// <param name="error">Errors.</param>
    /// <returns>0 when no operation was misrouted and no write lost, 1 otherwise, 2 on a bad command line.</returns>
    public static int Run(string[] args, TextWriter output, TextWriter error)
    {
        var duration = SampleCli.Duration("--duration", "-d", "How long the clients run while buckets move", TimeSpan.FromSeconds(3), TimeSpan.FromMilliseconds(10), TimeSpan.FromMinutes(10), "seconds");
        var clients = SampleCli.Int("--clients", "-c", "Client threads", 2, 1, 256, "client-threads");
        var shards = SampleCli.Int("--shards", "-s", "Shards (one FASTER.core store each)", 3, 2, 64, "shards");
        var command = new RootCommand("Ownership map (paper §5.1, Fig. 8): sharded FASTER stores, bucket transfers as EPVS version transitions; checks that no operation is misrouted and no write lost.");
        duration.AddTo(command);
        clients.AddTo(command);
        shards.AddTo(command);
        return SampleCli.Invoke(command, args, output, error, parse =>
        {
            TimeSpan seconds = duration.Value(parse);
            output.WriteLine("Ownership map (paper §5.1, Fig. 8): sharded FASTER stores, bucket transfers as EPVS version transitions.");
            output.WriteLine($"  running for {SampleCli.Format(seconds)} ...");
            OwnershipMapDemo.Result result = OwnershipMapDemo.Run(output, seconds, clients.Value(parse), shards.Value(parse));
            return result.Misrouted == 0 && result.LostWrites == 0 && result.Transfers > 0 ? SampleCli.Success : SampleCli.Failed;
        });
    }
}
