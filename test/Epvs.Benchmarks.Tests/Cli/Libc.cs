using System.Runtime.InteropServices;

namespace Epvs.Benchmarks.Tests.Cli;

/// <summary>The C library's calls the tests make: signals for a child process (Process.Kill sends only SIGKILL).</summary>
internal static partial class Libc
{
    internal const int SIGINT = 2;
    internal const int SIGTERM = 15;

    /// <summary>kill(2): sends <paramref name="signal"/> to process <paramref name="pid"/>; 0 on success.</summary>
    [LibraryImport("libc", EntryPoint = "kill", SetLastError = true)]
    internal static partial int Kill(int pid, int signal);
}
