using System;
using System.Diagnostics;
using System.IO;
using Xunit;

namespace Epvs.Samples.Tests;

/// <summary>
/// A probe's finding: every completed PersistentKv run (and so every Tour) left three files of the SIGKILLed writer
/// child's .NET runtime in the temp directory (clr-debug-pipe-PID-*-in/-out, dotnet-diagnostic-PID-*-socket): the
/// runtime removes them at a normal exit only. The child starts with DOTNET_EnableDiagnostics=0, which makes none.
/// </summary>
public sealed class PersistentKvJunkFilesTests
{
    [Fact]
    public async System.Threading.Tasks.Task CompletedRun_LeavesNothingInTheTempDirectory()
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "the child's diagnostic IPC files are a Unix runtime feature");
        string dll = Path.Combine(AppContext.BaseDirectory, "Epvs.Samples.PersistentKv.dll");
        string host = Environment.GetEnvironmentVariable("DOTNET_HOST_PATH") is { Length: > 0 } h ? h : "dotnet";
        string temp = Path.Combine(Path.GetTempPath(), "epvs-kv-junk-" + Guid.NewGuid().ToString("N"));
        Directory.CreateDirectory(temp);
        var start = new ProcessStartInfo(host) { RedirectStandardOutput = true, RedirectStandardError = true, UseShellExecute = false };
        start.ArgumentList.Add("exec");
        start.ArgumentList.Add(dll);
        start.ArgumentList.Add("--duration");
        start.ArgumentList.Add("200ms");
        start.Environment["TMPDIR"] = temp;
        start.Environment.Remove("DOTNET_EnableDiagnostics");
        try
        {
            using Process sample = Process.Start(start)!;
            System.Threading.Tasks.Task<string> stdout = sample.StandardOutput.ReadToEndAsync();
            System.Threading.Tasks.Task<string> stderr = sample.StandardError.ReadToEndAsync();
            if (!sample.WaitForExit(TimeSpan.FromSeconds(90)))
            {
                sample.Kill(entireProcessTree: true);
                Assert.Fail("the sample did not finish within 90 s");
            }

            sample.WaitForExit();
            string o = await stdout, e = await stderr;
            Assert.True(sample.ExitCode == 0, $"exit {sample.ExitCode}\n{o}\n{e}");
            string[] left = Directory.GetFileSystemEntries(temp);
            Assert.True(left.Length == 0, "the run left files in TMPDIR: " + string.Join(", ", Array.ConvertAll(left, Path.GetFileName)));
        }
        finally
        {
            try
            {
                Directory.Delete(temp, recursive: true);
            }
            catch (IOException)
            {
            }
        }
    }
}
