using System;
using System.IO;
using Epvs.Persistence;

namespace Epvs.Samples.PersistentKv;

/// <summary>What the sample prints about where its bytes go and what recovery did, in words.</summary>
internal static class DomainDescription
{
    /// <summary>
    /// The domain actually used and whether the mapping is real persistent memory. libpmem's <c>pmem_is_pmem</c>
    /// answers yes on any file when <c>PMEM_IS_PMEM_FORCE=1</c> (which the demo sets, to exercise the cache-flush
    /// path), so a yes under that variable says how bytes are written back, not what the file is on.
    /// </summary>
    /// <param name="file">The heap file.</param>
    /// <param name="path">The heap file's path, to tell a direct-access (DAX) mount from an ordinary file system.</param>
    internal static string Describe(HeapFile file, string path)
    {
        ArgumentNullException.ThrowIfNull(file);
        PersistenceDomain domain = file.Domain;
        bool forced = Environment.GetEnvironmentVariable("PMEM_IS_PMEM_FORCE") == "1";
        return (domain.Kind, domain.IsPersistentMemory) switch
        {
            (PersistenceDomainKind.Pmem, true) when forced && !IsOnDaxMount(path) =>
                "libpmem domain on an ordinary file, not persistent memory: PMEM_IS_PMEM_FORCE=1 makes libpmem write back with CPU cache flushes instead of msync (durable across a killed process, not across a power failure)",
            (PersistenceDomainKind.Pmem, true) =>
                "libpmem domain on real persistent memory (a direct-access mapping): write-back by CPU cache flushes",
            (PersistenceDomainKind.Pmem, false) =>
                "libpmem domain on an ordinary file, not persistent memory: write-back by pmem_msync",
            (PersistenceDomainKind.MappedFile, _) when file.MappedFileWriteBack == MappedFileWriteBack.PrivateMapping =>
                "memory-mapped file domain (not persistent memory): a private mapping written back with pwrite and fdatasync",
            (PersistenceDomainKind.MappedFile, _) =>
                "memory-mapped file domain (not persistent memory): a shared mapping written back with msync",
            (PersistenceDomainKind.Simulated, _) =>
                "simulated domain (an in-memory model of persistent memory)",
            _ => $"{domain.Kind} domain",
        };
    }

    /// <summary>
    /// Whether <paramref name="path"/> lies on a file system mounted with <c>dax</c> (Linux; the longest matching mount
    /// point in /proc/self/mounts wins). False when that cannot be read.
    /// </summary>
    private static bool IsOnDaxMount(string path)
    {
        const string Mounts = "/proc/self/mounts";
        if (!OperatingSystem.IsLinux() || !File.Exists(Mounts))
        {
            return false;
        }

        string full = Path.GetFullPath(path);
        string best = string.Empty;
        bool dax = false;
        foreach (string line in File.ReadLines(Mounts))
        {
            // device mount-point type options dump pass; spaces in the mount point are written as \040.
            string[] fields = line.Split(' ');
            if (fields.Length < 4)
            {
                continue;
            }

            string mountPoint = fields[1].Replace("\\040", " ", StringComparison.Ordinal);
            bool under = full == mountPoint || full.StartsWith(mountPoint.TrimEnd('/') + "/", StringComparison.Ordinal);
            if (under && mountPoint.Length >= best.Length)
            {
                best = mountPoint;
                dax = Array.Exists(fields[3].Split(','), o => o == "dax" || (o.StartsWith("dax=", StringComparison.Ordinal) && o != "dax=never"));
            }
        }

        return dax;
    }

    /// <summary>The recovery report in sentences rather than <c>key=value</c> pairs.</summary>
    internal static string[] Describe(DurableRecoveryReport report)
    {
        ArgumentNullException.ThrowIfNull(report);
        string how = report.WasCleanShutdown
            ? report.FastReopen ? "after a clean shutdown: fast reopen from the saved allocator state" : $"after a clean shutdown, but the saved state was not used ({report.FastReopenRejection}): full scan"
            : "after a crash (no clean shutdown): full scan of the heap";
        return
        [
            $"reopened {how}, {report.Duration.TotalMilliseconds:0.0} ms on {report.Parallelism} thread(s)",
            $"at the crash the epoch clock stood at version {report.PersistedClock} and the durable frontier at {report.PersistedFrontier}: recovery kept every payload of version {report.RecoveredVersion} or older",
            $"blocks: {report.ScannedPayloads:N0} found, {report.Live:N0} live; freed {report.DroppedBeyondFrontier:N0} newer than the cut, {report.Superseded:N0} older or deleted copies, {report.Cancelled:N0} deletions",
        ];
    }
}
