using System;
using System.CommandLine;
using System.Diagnostics;
using System.IO;
using System.Linq;
using BenchmarkDotNet.Configs;
using BenchmarkDotNet.ConsoleArguments;
using BenchmarkDotNet.Jobs;
using BenchmarkDotNet.Loggers;
using BenchmarkDotNet.Running;
using Epvs.Persistence.Benchmarks;
using Xunit;

namespace Epvs.Benchmarks.Tests.Cli;

/// <summary>
/// The persistence benchmark program's command lines, run as a child process as a user runs it: exit codes 0 done,
/// 1 a benchmark failed, 2 bad command line ("a bad option exits with code 2 and says what is wrong", RESULTS.md).
/// </summary>
public sealed class PersistenceBenchmarksProgramTests
{
    private static readonly TimeSpan ExitTimeout = TimeSpan.FromSeconds(60);

    /// <summary>Runs Epvs.Persistence.Benchmarks with <paramref name="args"/> and waits (bounded) for it to exit.</summary>
    internal static (int Code, string Out, string Err) RunProgram(params string[] args) => Run(StartInfo(args));

    private static (int Code, string Out, string Err) Run(ProcessStartInfo start)
    {
        string[] args = start.ArgumentList.Skip(1).ToArray();
        using Process p = Process.Start(start)!;
        var stdout = p.StandardOutput.ReadToEndAsync();
        var stderr = p.StandardError.ReadToEndAsync();
        if (!p.WaitForExit(ExitTimeout))
        {
            p.Kill(entireProcessTree: true);
            throw new TimeoutException($"Epvs.Persistence.Benchmarks {string.Join(' ', args)} did not exit within {ExitTimeout}");
        }

        return (p.ExitCode, stdout.Result, stderr.Result);
    }

    /// <summary>How to start the program with <paramref name="args"/>, its output redirected, no crash dump.</summary>
    internal static ProcessStartInfo StartInfo(params string[] args)
    {
        string dll = Path.Combine(AppContext.BaseDirectory, "Epvs.Persistence.Benchmarks.dll");
        var start = new ProcessStartInfo("dotnet") { RedirectStandardOutput = true, RedirectStandardError = true };
        start.ArgumentList.Add(dll);
        foreach (string a in args)
        {
            start.ArgumentList.Add(a);
        }

        start.Environment["DOTNET_DbgEnableMiniDump"] = "0";
        return start;
    }

    [Theory]
    [InlineData("bdn", "--bogus")]
    [InlineData("bdn", "--job", "bogusjob")]
    [InlineData("bdn", "--filter", "*NoSuchBenchmark*", "--job", "dry")]
    public void Bdn_BadArguments_ExitTwoWithAMessage(params string[] args)
    {
        (int code, _, string err) = RunProgram(args);

        Assert.Equal(2, code);
        Assert.Contains("error:", err);
    }

    [Theory]
    [InlineData(new string[0], 15)]
    [InlineData(new[] { "--job", "dry" }, 1)] // else the default job's 15 iterations override dry's 1
    [InlineData(new[] { "-j", "short" }, 3)]
    public void BdnConfig_NamedJobReplacesTheDefault_AndEveryJobForcesPmem(string[] args, int iterations)
    {
        IConfig config = PersistenceSuite.CreateConfig(args);
        (bool ok, IConfig parsed, _) = ConfigParser.Parse(args, NullLogger.Instance, config);
        Assert.True(ok);

        Job job = Assert.Single(ImmutableConfigBuilder.Create(ManualConfig.Union(config, parsed)).GetJobs());

        Assert.Equal(iterations, job.Run.IterationCount);
        EnvironmentVariable pmem = Assert.Single(job.Environment.EnvironmentVariables!, v => v.Key == "PMEM_IS_PMEM_FORCE");
        Assert.Equal("1", pmem.Value);
    }

    [Fact]
    public void DurabilityHelp_ListsTheSettingsAndParts_ExitsZero()
    {
        (int code, string output, string err) = RunProgram("durability", "--help");

        Assert.Equal(0, code);
        Assert.Contains("seconds-per-cell", output);
        Assert.Contains("throughput", output);
        Assert.DoesNotContain("Unhandled exception", err);
    }

    [Theory]
    [InlineData("is not a duration", "durability", "abc")] // was an unhandled FormatException (exit 134)
    [InlineData("throughputt", "durability", "0.01", "1000", "throughputt")] // was a header and exit 0
    [InlineData("throughputt", "durability", "--part", "throughputt")]
    [InlineData("out of range", "durability", "1", "2000000")]
    [InlineData("is not a whole number", "durability", "1", "many")]
    [InlineData("set the same thing", "durability", "--part", "sync", "1", "1000", "sync")]
    [InlineData("is not an option", "durability", "--bogus")]
    public void Durability_BadArguments_ExitTwoWithAMessage_NotAnUnhandledException(string expected, params string[] args)
    {
        (int code, _, string err) = RunProgram(args);

        Assert.DoesNotContain("Unhandled exception", err);
        Assert.Equal(2, code);
        Assert.Contains(expected, err);
        Assert.Contains("durability --help", err);
    }

    [Theory]
    [InlineData(1.0, 500_000, "throughput", "1", "500000", "throughput")] // the forms benchmark/RESULTS.md quotes
    [InlineData(1.0, 500_000, "recovery", "1", "500000", "recovery")]
    [InlineData(1.0, 500_000, "sync", "1", "500000", "sync")]
    [InlineData(1.0, 500_000, "advance", "1", "500000", "advance")]
    [InlineData(0.5, 500_000, "all", "0.5")]
    [InlineData(1.0, 500_000, "all")]
    [InlineData(0.25, 1000, "leak", "--seconds", "250ms", "--preload", "1000", "--part", "leak")]
    public void Durability_PositionalAndNamedForms_Parse(double seconds, int preload, string part, params string[] args)
    {
        (double Seconds, int Preload, string Part)? ran = null;
        ParseResult parse = new RootCommand { DurabilityHarness.CreateCommand((s, n, p) => { ran = (s, n, p); return 0; }) }.Parse(["durability", .. args]);

        Assert.Empty(parse.Errors);
        Assert.Equal(0, parse.Invoke());
        Assert.Equal((seconds, preload, part), ran);
    }

    [Fact]
    public void Durability_PositionalForm_RunsThePart_AndLeavesNoFiles()
    {
        using var dir = new TempDirectory();
        ProcessStartInfo start = StartInfo("durability", "0.01", "1000", "advance");
        start.Environment["EPVS_BENCH_DIR"] = dir.Path;

        (int code, string output, string err) = Run(start);

        Assert.True(code == 0, err);
        Assert.Contains("One advance through", output);
        Assert.Empty(Directory.EnumerateFileSystemEntries(dir.Path));
    }
}
