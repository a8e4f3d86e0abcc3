using System;
using System.Diagnostics;
using System.IO;
using System.Linq;
using System.Threading.Tasks;
using Epvs.Tests;
using Xunit;

namespace Epvs.Benchmarks.Tests.Cli;

/// <summary>
/// A benchmark ended by Ctrl-C (SIGINT) or SIGTERM leaves no heap files behind (hundreds of MiB to GiB each): a signal
/// runs no finally block, so the program must delete them itself.
/// </summary>
public sealed class SignalCleanupTests
{
    private static readonly TimeSpan Bound = TimeSpan.FromSeconds(60);

    [Theory]
    [InlineData(Libc.SIGINT)]
    [InlineData(Libc.SIGTERM)]
    public void Comparison_EndedBySignalWhileItsHeapsAreOpen_LeavesTheDirectoryEmpty(int signal)
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "POSIX signals to a child process: Linux only here.");
        using var dir = new TempDirectory();
        ProcessStartInfo start = PersistenceBenchmarksProgramTests.StartInfo("--quick", "--dir", dir.Path);
        if (signal == Libc.SIGINT)
        {
            InheritedSigInt.RestoreDefault(start);
        }

        using Process program = Process.Start(start)!;
        Task<string> errors = program.StandardError.ReadToEndAsync();
        try
        {
            // "# map heap: ..." is written once both heap files exist and are mapped; preloading follows.
            Task<bool> heapsOpen = Task.Run(() =>
            {
                while (program.StandardOutput.ReadLine() is { } line)
                {
                    if (line.StartsWith("# map heap:", StringComparison.Ordinal))
                    {
                        return true;
                    }
                }

                return false;
            });
            Assert.True(heapsOpen.Wait(Bound), $"the program did not open its heaps within {Bound}");
            if (!heapsOpen.Result)
            {
                // Only now: the error text is complete when the program has ended.
                Assert.Fail("the program ended before opening its heaps: " + errors.Result);
            }

            Assert.True(Directory.EnumerateFiles(dir.Path, "*", SearchOption.AllDirectories).Any(), $"no heap file in {dir.Path} although the program said it opened them");

            Assert.Equal(0, Libc.Kill(program.Id, signal));
            Task<string> rest = program.StandardOutput.ReadToEndAsync();
            Assert.True(program.WaitForExit(Bound), $"the program did not exit within {Bound} of signal {signal}");

            Assert.NotEqual(0, program.ExitCode);
            string[] left = Directory.GetFileSystemEntries(dir.Path, "*", SearchOption.AllDirectories);
            Assert.True(left.Length == 0, $"left behind after signal {signal}: {string.Join(", ", left.Select(Path.GetFileName))}");
        }
        finally
        {
            if (!program.HasExited)
            {
                program.Kill(entireProcessTree: true);
            }
        }
    }
}
