using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.IO;
using System.Runtime.InteropServices;
using System.Text;

namespace Epvs.Persistence.Tests;

/// <summary>
/// The test assembly's entry point (GenerateProgramFile is off). The test runner never calls it; the libpmem tests
/// start this assembly as a child process to run <see cref="PmemChild"/> with PMEM_IS_PMEM_FORCE in its environment.
/// </summary>
/// <remarks>
/// Why a child process: libpmem reads PMEM_IS_PMEM_FORCE with getenv, from the native environment, once. On Unix
/// .NET's Environment.SetEnvironmentVariable changes only the runtime's managed copy, and a libc setenv in the test
/// process would race with other threads' getenv and would be too late if another test had already made libpmem read
/// the variable. A fresh process started with ProcessStartInfo.Environment has the variable in its native environment
/// before libpmem is loaded, whatever else runs.
/// </remarks>
public static class TestProgram
{
    /// <summary>Dispatches child-process roles.</summary>
    public static int Main(string[] args)
    {
        if (args.Length >= 2 && args[0] == PmemChild.Role)
        {
            return PmemChild.Run(args[1]);
        }

        if (args.Length >= 3 && args[0] == DurableChild.Role)
        {
            return DurableChild.Run(args[1], int.Parse(args[2], System.Globalization.CultureInfo.InvariantCulture), args.Length >= 4 ? args[3] : "pmem");
        }

        if (args.Length >= 3 && args[0] == SafetyChild.Role)
        {
            return SafetyChild.Run(args[1], args[2], args.Length >= 4 && args[3] == "control");
        }

        if (args.Length >= 3 && args[0] == BitFlipSweep.Role)
        {
            return BitFlipSweep.Run(args[1], args[2], args.Length >= 4 && args[3] == "control");
        }

        Console.Error.WriteLine("This is the Epvs.Persistence test assembly; run it with 'dotnet test'.");
        return 2;
    }

    /// <summary>Runs this assembly as a child with <paramref name="environment"/> added; returns exit code and output (bounded wait).</summary>
    internal static (int ExitCode, string Output) RunChild(IReadOnlyDictionary<string, string> environment, params string[] args)
    {
        string assembly = typeof(TestProgram).Assembly.Location;
        var start = new ProcessStartInfo(DotnetHost())
        {
            RedirectStandardOutput = true,
            RedirectStandardError = true,
            UseShellExecute = false,
        };
        start.ArgumentList.Add("exec");
        start.ArgumentList.Add(assembly);
        foreach (string arg in args)
        {
            start.ArgumentList.Add(arg);
        }

        foreach ((string key, string value) in environment)
        {
            start.Environment[key] = value;
        }

        using Process process = Process.Start(start)!;
        var output = new StringBuilder();
        process.OutputDataReceived += (_, e) => { lock (output) { output.AppendLine(e.Data); } };
        process.ErrorDataReceived += (_, e) => { lock (output) { output.AppendLine(e.Data); } };
        process.BeginOutputReadLine();
        process.BeginErrorReadLine();
        if (!process.WaitForExit(TimeSpan.FromSeconds(120)))
        {
            process.Kill(entireProcessTree: true);
            throw new TimeoutException("The child process did not exit within 120 s.");
        }

        process.WaitForExit();
        lock (output)
        {
            return (process.ExitCode, output.ToString());
        }
    }

    /// <summary>Starts this assembly as a child with <paramref name="environment"/> added and its output lines going to <paramref name="onLine"/>; the caller kills or waits.</summary>
    internal static Process StartChild(IReadOnlyDictionary<string, string> environment, Action<string> onLine, params string[] args)
    {
        var start = new ProcessStartInfo(DotnetHost())
        {
            RedirectStandardOutput = true,
            RedirectStandardError = true,
            UseShellExecute = false,
        };
        start.ArgumentList.Add("exec");
        start.ArgumentList.Add(typeof(TestProgram).Assembly.Location);
        foreach (string arg in args)
        {
            start.ArgumentList.Add(arg);
        }

        foreach ((string key, string value) in environment)
        {
            start.Environment[key] = value;
        }

        Process process = Process.Start(start)!;
        process.OutputDataReceived += (_, e) => { if (e.Data is not null) { onLine(e.Data); } };
        process.ErrorDataReceived += (_, e) => { if (e.Data is not null) { onLine("stderr: " + e.Data); } };
        process.BeginOutputReadLine();
        process.BeginErrorReadLine();
        return process;
    }

    private static string DotnetHost()
    {
        string? fromSdk = Environment.GetEnvironmentVariable("DOTNET_HOST_PATH");
        if (!string.IsNullOrEmpty(fromSdk) && File.Exists(fromSdk))
        {
            return fromSdk;
        }

        // <root>/shared/Microsoft.NETCore.App/<version>/ → <root>/dotnet
        string runtime = RuntimeEnvironment.GetRuntimeDirectory();
        string root = Path.GetFullPath(Path.Combine(runtime, "..", "..", ".."));
        string host = Path.Combine(root, OperatingSystem.IsWindows() ? "dotnet.exe" : "dotnet");
        return File.Exists(host) ? host : "dotnet";
    }
}
