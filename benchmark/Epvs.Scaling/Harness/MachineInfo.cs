using System;
using System.IO;
using System.Linq;
using System.Runtime.InteropServices;

namespace Epvs.Scaling.Harness;

/// <summary>The machine line every published figure carries.</summary>
public static class MachineInfo
{
    /// <summary>Cores, CPU model (from /proc/cpuinfo where present), OS and runtime.</summary>
    public static string Describe()
    {
        string cpu = "unknown CPU";
        try
        {
            if (File.Exists("/proc/cpuinfo"))
            {
                string? line = File.ReadLines("/proc/cpuinfo").FirstOrDefault(l => l.StartsWith("model name", StringComparison.Ordinal));
                if (line is not null)
                    cpu = line[(line.IndexOf(':') + 1)..].Trim();
            }
        }
        catch (IOException)
        {
        }
        string load = "";
        try
        {
            if (File.Exists("/proc/loadavg"))
                load = ", load average at start " + string.Join(' ', File.ReadAllText("/proc/loadavg").Split(' ').Take(3));
        }
        catch (IOException)
        {
        }
        return $"{Environment.ProcessorCount} logical cores, {cpu}, {RuntimeInformation.OSDescription} ({RuntimeInformation.OSArchitecture}), " +
               $"{RuntimeInformation.FrameworkDescription}, server GC off, tiered compilation off{load}";
    }
}
