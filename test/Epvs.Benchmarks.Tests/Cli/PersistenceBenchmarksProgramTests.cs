using System;
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
    internal static (int Code, string Out, string Err) RunProgram(params string[] args)
    {
        using Process p = Process.Start(StartInfo(args))!;
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
}
