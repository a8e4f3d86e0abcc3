using System;
using System.IO;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// A small tmpfs mounted for one test (a file system to fill, or a read-only one), unmounted on Dispose. The test is
/// skipped where mount(8) is not allowed (not root).
/// </summary>
internal sealed class SmallTmpfs : IDisposable
{
    private SmallTmpfs(string path) => Path = path;

    /// <summary>The mount point.</summary>
    internal string Path { get; }

    /// <summary>Mounts a tmpfs with <paramref name="options"/> (for example <c>size=1m</c> or <c>ro,size=1m</c>) in <paramref name="dir"/>, or skips the test.</summary>
    internal static SmallTmpfs MountOrSkip(TempDirectory dir, string options)
    {
        string path = System.IO.Path.Combine(dir.Path, "tmpfs");
        Directory.CreateDirectory(path);
        Assert.SkipUnless(HeapSafetyTests.Run("mount", "-t", "tmpfs", "-o", options, "tmpfs", path), $"needs root and mount(8) for a tmpfs ({options})");
        return new SmallTmpfs(path);
    }

    /// <summary>A path in the file system.</summary>
    internal string File(string name) => System.IO.Path.Combine(Path, name);

    /// <summary>Fills the file system: dd stops (and fails) when no block is left.</summary>
    internal void Fill() => HeapSafetyTests.Run("dd", "if=/dev/zero", "of=" + File("filler"), "bs=4k");

    public void Dispose() => HeapSafetyTests.Run("umount", Path);
}
