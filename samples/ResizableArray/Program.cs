using System;
using System.CommandLine;
using System.IO;

namespace Epvs.Samples.ResizableArray;

/// <summary>The sample's command line: <c>[--duration d] [--threads n] [--push-percent p]</c> or the positional form.</summary>
public static class Program
{
    /// <summary>Runs the sample on the console.</summary>
    /// <param name="args">The command line.</param>
    /// <returns>0 on success, 1 on a failed run, 2 on a bad command line.</returns>
    public static int Main(string[] args) => Run(args, Console.Out, Console.Error);

    /// <summary>Runs the sample with its output and errors going where the caller says (the tests call this).</summary>
    /// <param name="args">The command line.</param>
    /// <param name="output">Help and the run's report.</param>
    /// <param name="error">Errors.</param>
    /// <returns>0 on success, 1 on a failed run, 2 on a bad command line.</returns>
    public static int Run(string[] args, TextWriter output, TextWriter error)
    {
        var duration = SampleCli.Duration("--duration", "-d", "How long each variant runs", TimeSpan.FromSeconds(1), TimeSpan.FromMilliseconds(10), TimeSpan.FromMinutes(10), "seconds-per-variant");
        var threads = SampleCli.Int("--threads", "-t", "Worker threads", Environment.ProcessorCount, 1, 1024, "threads");
        var pushPercent = SampleCli.Int("--push-percent", "-p", "Pushes in the mix, in percent (the rest: half reads, half writes)", 10, 0, 100, "push-percent");
        var command = new RootCommand("Resizable array (paper §3, Figs. 3-6): the same push/read/write mix on every variant, throughput side by side.");
        duration.AddTo(command);
        threads.AddTo(command);
        pushPercent.AddTo(command);
        return SampleCli.Invoke(command, args, output, error, parse =>
        {
            output.WriteLine("Resizable array (paper §3, Figs. 3-6): the same push/read/write mix on every variant.");
            ResizableArrayDemo.Run(output, duration.Value(parse), threads.Value(parse), pushPercent.Value(parse));
            return SampleCli.Success;
        });
    }
}
