using System;
using System.Diagnostics;
using System.IO;
using System.Runtime.InteropServices;
using System.Text.RegularExpressions;
using System.Threading;
using Epvs.Tests;
using Xunit;

namespace Epvs.Samples.Tests;

/// <summary>
/// The PersistentKv sample stopped by SIGINT sent to it alone (Ctrl-C in a terminal sends it to the whole group; an
/// IDE's stop, <c>kill -INT</c> or a parent's timeout to the sample only) must not leave its writer child running. The
/// writer, which "writes until killed", was orphaned and kept writing at most of a core for ever (a probe's finding);
/// it now exits when its standard input, which the sample holds open, ends. Its 64 MiB heap file was left behind too.
/// </summary>
public sealed class PersistentKvInterruptTests
{
    [DllImport("libc", SetLastError = true)]
    private static extern int kill(int pid, int sig);

    [Fact]
    public async System.Threading.Tasks.Task SampleInterrupted_NeitherItsWriterChildNorItsFilesOutliveIt()
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "POSIX signals");
        string dll = Path.Combine(AppContext.BaseDirectory, "Epvs.Samples.PersistentKv.dll");
        string host = Environment.GetEnvironmentVariable("DOTNET_HOST_PATH") is { Length: > 0 } h ? h : "dotnet";
        var start = new ProcessStartInfo(host) { RedirectStandardOutput = true, RedirectStandardError = true, RedirectStandardInput = true, UseShellExecute = false };
        start.ArgumentList.Add("exec");
        start.ArgumentList.Add(dll);
        start.ArgumentList.Add("--duration");
        start.ArgumentList.Add("30s");

        // The sample's temporary directory goes here (Path.GetTempPath reads TMPDIR), to see that SIGINT deletes it too.
        string temp = Path.Combine(Path.GetTempPath(), "epvs-kv-interrupt-" + Guid.NewGuid().ToString("N"));
        Directory.CreateDirectory(temp);
        start.Environment["TMPDIR"] = temp;
        InheritedSigInt.RestoreDefault(start);
        using Process sample = Process.Start(start)!;
        int childPid = -1;
        bool childGone = false;
        try
        {
            sample.ErrorDataReceived += (_, _) => { }; // drained, so a chatty stderr never blocks the sample
            sample.BeginErrorReadLine();
            var deadline = Stopwatch.StartNew();
            while (deadline.Elapsed < TimeSpan.FromSeconds(60))
            {
                // Bounded: a sample that hangs without output fails the test instead of hanging it.
                string? line;
                try
                {
                    line = await sample.StandardOutput.ReadLineAsync().WaitAsync(TimeSpan.FromSeconds(60));
                }
                catch (TimeoutException)
                {
                    break;
                }

                if (line is null)
                    break;
                Match m = Regex.Match(line, @"writer child \(pid (\d+)\)");
                if (m.Success)
                {
                    childPid = int.Parse(m.Groups[1].Value);
                    break;
                }
            }
            Assert.True(childPid > 0, "the sample never reported its writer child");

            Assert.Equal(0, kill(sample.Id, 2)); // SIGINT to the sample only
            Assert.True(sample.WaitForExit(TimeSpan.FromSeconds(10)), "the sample did not stop on SIGINT");

            var wait = Stopwatch.StartNew();
            while (wait.Elapsed < TimeSpan.FromSeconds(10) && !childGone)
            {
                try
                {
                    using Process child = Process.GetProcessById(childPid);
                    childGone = child.HasExited || child.WaitForExit(TimeSpan.FromMilliseconds(200));
                }
                catch (ArgumentException)
                {
                    childGone = true; // no such process
                }
            }
            Assert.True(childGone, $"the writer child (pid {childPid}) still runs 10 s after the sample was interrupted");
            Assert.True(Directory.GetFileSystemEntries(temp).Length == 0, "the sample left its files behind: " + string.Join(", ", Directory.GetFileSystemEntries(temp)));
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

            if (childPid > 0 && !childGone)
                kill(childPid, 9); // only a child seen alive: a gone child's pid may belong to another process by now
            if (!sample.HasExited)
                sample.Kill();
        }
    }
}
