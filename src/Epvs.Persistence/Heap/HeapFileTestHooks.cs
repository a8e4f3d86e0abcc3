using System;

namespace Epvs.Persistence;

/// <summary>
/// Test-only switches for failures the tests cannot cause for real on every machine. Process-wide; set them only in a
/// test (or child process) that owns the process.
/// </summary>
internal static class HeapFileTestHooks
{
    /// <summary>When set, <c>HeapFile.Open</c>'s preallocation reports this errno instead of calling posix_fallocate.</summary>
    internal static int? SimulatedFallocateError { get; set; }

    /// <summary>When set, mapping a heap file (the MappedFile domain on Unix) fails with this errno instead of calling mmap.</summary>
    internal static int? SimulatedMmapError { get; set; }

    /// <summary>When set, <c>pmem_map_file</c> is taken to have failed (libpmem loaded, the mapping refused) without being called.</summary>
    internal static bool SimulatedPmemMapFailure { get; set; }

    /// <summary>When set, the fsync of a new heap file's directory (Linux) reports this errno instead of being called (0: succeeds).</summary>
    internal static int? SimulatedDirectorySyncError { get; set; }

    /// <summary>Removing the file of a failed creation fails (as on a file system that turned read-only meanwhile).</summary>
    internal static bool SimulatedRemovalFailure { get; set; }

    /// <summary>When set, <c>HeapFile.Open</c> skips preallocation (the control for the sparse-file test: the old behaviour).</summary>
    internal static bool SkipPreallocation { get; set; }

    /// <summary>Broken control: <c>HeapFile.Open</c> reserves the heap's part of the file only, not all the domain maps (the old behaviour: the libpmem domain then grew into an unreserved tail).</summary>
    internal static bool ReserveHeapPartOnlyForTesting { get; set; }

    /// <summary>Broken control: an open takes no lock of its own beyond <see cref="System.IO.FileShare.None"/>'s (as before), so the runtime's DisableFileLocking switch leaves the file unlocked.</summary>
    internal static bool IgnoreLockConflictsForTesting { get; set; }

    /// <summary>Broken control: Dispose releases the file's lock only by closing its descriptor (as before), not with LOCK_UN.</summary>
    internal static bool KeepLockUntilCloseForTesting { get; set; }

    /// <summary>When set, Dispose does not wait for calls inside the mapping and unmaps under them (the control for the in-flight tests: the old behaviour).</summary>
    internal static bool SkipOperationWait { get; set; }

    /// <summary>When set, damaged sealed superblock words and descriptors are trusted, damaged blocks are taken as free and sealed blocks whose check fails as valid (the control for the bit-flip sweeps: the old behaviour).</summary>
    internal static bool IgnoreSeals { get; set; }

    /// <summary>When set, the process's file size limit (RLIMIT_FSIZE) is taken as unlimited (the control for the file-size-limit test: the old behaviour, SIGXFSZ).</summary>
    internal static bool IgnoreFileSizeLimit { get; set; }

    /// <summary>The broken control of <see cref="HeapFile.RemoveIfDisposedForFailedCreate"/>: the path is removed after the lock is released (the old order: an opener could open it in between and lose it).</summary>
    internal static bool RemoveFailedCreateAfterUnlockForTesting { get; set; }

    /// <summary>When set, <c>HeapFile.Create</c> creates the file in place, under its name, before formatting it (the control for the interrupted-creation test: the old behaviour).</summary>
    internal static bool CreateInPlace { get; set; }

    /// <summary>Runs in <c>HeapFile.Create</c> once the unnamed file is formatted and persisted, before it is given its name.</summary>
    internal static Action<string>? BeforeNamingCreatedFile { get; set; }

    /// <summary>Runs in <c>HeapFile.Create</c> when it creates the file in place (not Linux, or <see cref="CreateInPlace"/>), once the file exists, before it is formatted.</summary>
    internal static Action<string>? BeforeFormattingInPlace { get; set; }
}
