using System;
using System.IO;

namespace Epvs.Persistence.Tests;

/// <summary>A fresh directory under the system temp directory, deleted on dispose.</summary>
internal sealed class TempDirectory : IDisposable
{
    internal TempDirectory()
    {
        Path = System.IO.Path.Combine(System.IO.Path.GetTempPath(), "epvs-persistence-tests", Guid.NewGuid().ToString("N"));
        Directory.CreateDirectory(Path);
    }

    internal string Path { get; }

    internal string File(string name) => System.IO.Path.Combine(Path, name);

    public void Dispose()
    {
        try
        {
            foreach (string file in Directory.EnumerateFiles(Path))
            {
                System.IO.File.SetAttributes(file, FileAttributes.Normal);
                if (!OperatingSystem.IsWindows())
                {
                    System.IO.File.SetUnixFileMode(file, UnixFileMode.UserRead | UnixFileMode.UserWrite);
                }
            }

            Directory.Delete(Path, recursive: true);
        }
        catch (IOException)
        {
            // Best effort: a leftover temp directory must not fail a test.
        }
    }
}
