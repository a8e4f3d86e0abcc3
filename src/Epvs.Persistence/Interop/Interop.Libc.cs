using System;
using System.Runtime.InteropServices;

namespace Epvs.Persistence;

internal static partial class Interop
{
    /// <summary>
    /// The C library on Unix (glibc's <c>libc.so.6</c>, macOS's <c>libSystem</c>): memory mapping of the heap file,
    /// ranged <c>msync</c>, which .NET's <c>MemoryMappedViewAccessor.Flush</c> does not offer (it syncs the whole view),
    /// and the <c>pwrite</c>/<c>fdatasync</c> write-back of a private mapping (Linux).
    /// </summary>
    internal static unsafe partial class Libc
    {
        internal const int ProtRead = 0x1;
        internal const int ProtWrite = 0x2;
        internal const int MapShared = 0x1;
        internal const int MapPrivate = 0x2;

        /// <summary><c>EINTR</c> (the same value on Linux, macOS and the BSDs).</summary>
        internal const int Eintr = 4;

        /// <summary><c>ESPIPE</c> and <c>ENOSYS</c>: Linux's values (read only after Linux-only calls).</summary>
        internal const int Espipe = 29;
        internal const int Enosys = 38;

        /// <summary><c>MS_SYNC</c>: 4 on Linux, 0x10 on macOS and the BSDs.</summary>
        internal static int MsSync => OperatingSystem.IsLinux() ? 4 : 0x10;

        static Libc() => NativeLibraryResolver.EnsureRegistered();

        [LibraryImport(NativeLibraryResolver.LibcLibraryName, EntryPoint = "mmap", SetLastError = true)]
        internal static partial void* Mmap(void* address, nuint length, int protection, int flags, int fd, long offset);

        /// <summary><c>MADV_HUGEPAGE</c> (Linux, every architecture): back the range with transparent huge pages where possible.</summary>
        internal const int MadvHugePage = 14;

        /// <summary><c>MADV_POPULATE_WRITE</c> (Linux 5.14; 23 on x86-64 and arm64): fault the range in writable now, breaking copy-on-write in a private mapping.</summary>
        internal const int MadvPopulateWrite = 23;

        /// <summary>A hint; 0 or -1 with errno set.</summary>
        [LibraryImport(NativeLibraryResolver.LibcLibraryName, EntryPoint = "madvise", SetLastError = true)]
        internal static partial int Madvise(void* address, nuint length, int advice);

        [LibraryImport(NativeLibraryResolver.LibcLibraryName, EntryPoint = "munmap", SetLastError = true)]
        internal static partial int Munmap(void* address, nuint length);

        [LibraryImport(NativeLibraryResolver.LibcLibraryName, EntryPoint = "msync", SetLastError = true)]
        internal static partial int Msync(void* address, nuint length, int flags);

        /// <summary>Bytes written, or -1 with errno set.</summary>
        [LibraryImport(NativeLibraryResolver.LibcLibraryName, EntryPoint = "pwrite", SetLastError = true)]
        internal static partial nint Pwrite(int fd, void* buffer, nuint count, long offset);

        [LibraryImport(NativeLibraryResolver.LibcLibraryName, EntryPoint = "fdatasync", SetLastError = true)]
        internal static partial int Fdatasync(int fd);

        /// <summary><c>sync_file_range</c>'s <c>SYNC_FILE_RANGE_WRITE</c>: start the write-out of the range's dirty pages, without waiting.</summary>
        internal const uint SyncFileRangeWrite = 2;

        /// <summary>Linux's <c>sync_file_range</c>: 0, or -1 with errno set. With <see cref="SyncFileRangeWrite"/> alone a hint: it makes nothing durable and does not take the file's write-back error from the next <c>fdatasync</c> (an error it returns is one of the write-out it started).</summary>
        [LibraryImport(NativeLibraryResolver.LibcLibraryName, EntryPoint = "sync_file_range", SetLastError = true)]
        internal static partial int SyncFileRange(int fd, long offset, long count, uint flags);

        /// <summary>Returns 0 or an errno value (it does not set errno).</summary>
        [LibraryImport(NativeLibraryResolver.LibcLibraryName, EntryPoint = "posix_fallocate")]
        internal static partial int PosixFallocate(int fd, long offset, long length);

        /// <summary><c>RLIMIT_FSIZE</c> (1 on Linux, every architecture, and on macOS and the BSDs).</summary>
        private const int RlimitFsize = 1;

        [LibraryImport(NativeLibraryResolver.LibcLibraryName, EntryPoint = "getrlimit", SetLastError = true)]
        private static partial int Getrlimit(int resource, out RLimit limit);

        /// <summary>
        /// The largest file size this process may write or extend a file to (the soft <c>RLIMIT_FSIZE</c>, as set by
        /// <c>ulimit -f</c> or systemd's <c>LimitFSIZE</c>): a <c>pwrite</c>, <c>ftruncate</c> or <c>posix_fallocate</c>
        /// past it raises SIGXFSZ, whose default action kills the process. <see cref="long.MaxValue"/> when unlimited,
        /// unknown, or on Windows.
        /// </summary>
        internal static long FileSizeLimit()
        {
            if (OperatingSystem.IsWindows() || HeapFileTestHooks.IgnoreFileSizeLimit)
            {
                return long.MaxValue;
            }

            // RLIM_INFINITY is all ones on Linux and 2^63 - 1 on macOS: both read as unlimited.
            return Getrlimit(RlimitFsize, out RLimit limit) != 0 || limit.Current >= long.MaxValue ? long.MaxValue : (long)limit.Current;
        }

        /// <summary><c>struct rlimit</c>: two <c>rlim_t</c> (64-bit unsigned on 64-bit Linux and macOS).</summary>
        [StructLayout(LayoutKind.Sequential)]
        private struct RLimit
        {
            internal ulong Current;
            internal ulong Maximum;
        }
    }
}
