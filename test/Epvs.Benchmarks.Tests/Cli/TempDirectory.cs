using System;
using System.IO;

namespace Epvs.Benchmarks.Tests.Cli;

/// <summary>A fresh directory under the system temp directory, deleted on dispose.</summary>
internal sealed class TempDirectory : IDisposable
{
    public TempDirectory()
    {
        Path = System.IO.Path.Combine(System.IO.Path.GetTempPath(), "epvs-cli-" + Guid.NewGuid().ToString("N"));
        Directory.CreateDirectory(Path);
    }

    public string Path { get; }

    public string File(string name) => System.IO.Path.Combine(Path, name);

    public void Dispose() => Directory.Delete(Path, recursive: true);

    /// <summary>Whether <paramref name="path"/> starts with the PNG signature.</summary>
    public static bool IsPng(string path)
    {
        byte[] head = new byte[8];
        using FileStream s = System.IO.File.OpenRead(path);
        return s.Read(head, 0, 8) == 8 && head[0] == 0x89 && head[1] == (byte)'P' && head[2] == (byte)'N' && head[3] == (byte)'G';
    }
}
