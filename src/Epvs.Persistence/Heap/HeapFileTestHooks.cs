namespace Epvs.Persistence;

/// <summary>
/// Test-only switches for failures the tests cannot cause for real on every machine. Process-wide; set them only in a
/// test (or child process) that owns the process.
/// </summary>
internal static class HeapFileTestHooks
{
    /// <summary>When set, <c>HeapFile.Open</c>'s preallocation reports this errno instead of calling posix_fallocate.</summary>
    internal static int? SimulatedFallocateError { get; set; }

    /// <summary>When set, <c>HeapFile.Open</c> skips preallocation (the control for the sparse-file test: the old behaviour).</summary>
    internal static bool SkipPreallocation { get; set; }

    /// <summary>When set, Dispose does not wait for calls inside the mapping and unmaps under them (the control for the in-flight tests: the old behaviour).</summary>
    internal static bool SkipOperationWait { get; set; }

    /// <summary>When set, damaged sealed superblock words and descriptors are trusted, damaged blocks are taken as free and sealed blocks whose check fails as valid (the control for the bit-flip sweeps: the old behaviour).</summary>
    internal static bool IgnoreSeals { get; set; }

    /// <summary>When set, the process's file size limit (RLIMIT_FSIZE) is taken as unlimited (the control for the file-size-limit test: the old behaviour, SIGXFSZ).</summary>
    internal static bool IgnoreFileSizeLimit { get; set; }
}
