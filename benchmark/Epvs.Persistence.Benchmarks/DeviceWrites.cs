using System;
using System.Globalization;
using System.IO;

namespace Epvs.Persistence.Benchmarks;

/// <summary>
/// The bytes written to the block device that holds a directory, from the kernel's own counters (Linux:
/// <c>/proc/self/mountinfo</c> names the device of the mount, <c>/sys/dev/block/MAJ:MIN/stat</c> counts the sectors
/// written to it). What the disk received, page writes and the file system's own included, unlike the bytes the process
/// copied with system calls. System-wide: every writer of the device counts, so measure with nothing else running.
/// </summary>
internal sealed class DeviceWrites
{
    private readonly string _statPath;

    private DeviceWrites(string device, string statPath)
    {
        Device = device;
        _statPath = statPath;
    }

    /// <summary>The device's major:minor numbers.</summary>
    internal string Device { get; }

    /// <summary>The counter of the device that holds <paramref name="directory"/>, or null where there is none to read: not Linux, or a file system without a block device (tmpfs, say).</summary>
    internal static DeviceWrites? For(string directory)
    {
        if (!OperatingSystem.IsLinux())
        {
            return null;
        }

        try
        {
            string path = Path.GetFullPath(directory);
            string? best = null, device = null;
            foreach (string line in File.ReadLines("/proc/self/mountinfo"))
            {
                // "36 35 98:0 /root /mount/point options ... - fstype source options": the device is the third field,
                // the mount point the fifth (spaces in it escaped as \040).
                string[] fields = line.Split(' ');
                if (fields.Length < 5)
                {
                    continue;
                }

                string mount = fields[4].Replace("\\040", " ", StringComparison.Ordinal);
                bool covers = mount == "/" || path == mount || path.StartsWith(mount + "/", StringComparison.Ordinal);
                if (covers && (best is null || mount.Length >= best.Length))
                {
                    best = mount;
                    device = fields[2];
                }
            }

            string stat = $"/sys/dev/block/{device}/stat";
            return device is not null && File.Exists(stat) ? new DeviceWrites(device, stat) : null;
        }
        catch (Exception e) when (e is IOException or UnauthorizedAccessException)
        {
            return null;
        }
    }

    /// <summary>The bytes written to the device since it started counting, or -1 where the counter could not be read.</summary>
    internal long BytesWritten()
    {
        try
        {
            // Fields of /sys/dev/block/*/stat: reads, merged, sectors read, ticks, writes, merged, sectors written, ...
            // (sectors of 512 bytes, whatever the device's own sector size).
            string[] fields = File.ReadAllText(_statPath).Split(' ', StringSplitOptions.RemoveEmptyEntries);
            return fields.Length > 6 ? long.Parse(fields[6], CultureInfo.InvariantCulture) * 512 : -1;
        }
        catch (Exception e) when (e is IOException or UnauthorizedAccessException or FormatException or OverflowException)
        {
            return -1;
        }
    }
}
