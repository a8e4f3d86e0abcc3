using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Globalization;
using System.IO;
using System.Linq;
using Xunit;

namespace Epvs.Tests;

/// <summary>
/// Children that a test stops with SIGINT must start with SIGINT at its default disposition. A process started with
/// SIGINT ignored (a background job of a non-interactive shell, <c>nohup</c>, some CI runners) passes that on to its
/// children, and the .NET runtime keeps an inherited SIG_IGN: the child would never see the test's SIGINT. Linux only.
/// </summary>
internal static class InheritedSigInt
{
    /// <summary>Whether this process ignores SIGINT (bit 2 − 1 of the SigIgn mask in <c>/proc/self/status</c>).</summary>
    public static bool Ignored
    {
        get
        {
            string line = File.ReadLines("/proc/self/status").First(l => l.StartsWith("SigIgn:", StringComparison.Ordinal));
            ulong mask = ulong.Parse(line.AsSpan("SigIgn:".Length).Trim(), NumberStyles.HexNumber, CultureInfo.InvariantCulture);
            return (mask & (1UL << (2 - 1))) != 0;
        }
    }

    /// <summary>
    /// When this process ignores SIGINT, makes <paramref name="start"/> run its program through
    /// <c>env --default-signal=INT</c> (GNU coreutils 8.31 or later), which resets SIGINT and then executes the program
    /// in its own process (same pid). Skips the test when this process ignores SIGINT and <c>env</c> cannot reset it.
    /// </summary>
    public static void RestoreDefault(ProcessStartInfo start)
    {
        if (!Ignored)
        {
            return;
        }

        Assert.SkipUnless(EnvCanReset(), "this process ignores SIGINT (started in the background?), so its children would too, and env --default-signal is not available to reset it");
        string program = start.FileName;
        List<string> args = start.ArgumentList.ToList();
        start.FileName = "env";
        start.ArgumentList.Clear();
        start.ArgumentList.Add("--default-signal=INT");
        start.ArgumentList.Add(program);
        foreach (string a in args)
        {
            start.ArgumentList.Add(a);
        }
    }

    private static bool EnvCanReset()
    {
        try
        {
            using Process? env = Process.Start(new ProcessStartInfo("env", ["--default-signal=INT", "true"]) { UseShellExecute = false, RedirectStandardError = true });
            if (env is null)
            {
                return false;
            }

            env.StandardError.ReadToEnd();
            return env.WaitForExit(TimeSpan.FromSeconds(30)) && env.ExitCode == 0;
        }
        catch (System.ComponentModel.Win32Exception)
        {
            return false; // no env on the PATH
        }
    }
}
