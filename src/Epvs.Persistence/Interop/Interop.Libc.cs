using System;
using System.Runtime.InteropServices;

namespace Epvs.Persistence;

internal static partial class Interop
{
    /// <summary>
    /// The C library on Unix (glibc's <c>libc.so.6</c>, macOS's <c>libSystem</c>): memory mapping of the heap file
    /// and ranged <c>msync</c>, which .NET's <c>MemoryMappedViewAccessor.Flush</c> does not offer (it syncs the whole view).
    /// </summary>
    internal static unsafe partial class Libc
    {
        internal const int ProtRead = 0x1;
        internal const int ProtWrite = 0x2;
        internal const int MapShared = 0x1;

        /// <summary><c>MS_SYNC</c>: 4 on Linux, 0x10 on macOS and the BSDs.</summary>
        internal static int MsSync => OperatingSystem.IsLinux() ? 4 : 0x10;

        static Libc() => NativeLibraryResolver.EnsureRegistered();

        [LibraryImport(NativeLibraryResolver.LibcLibraryName, EntryPoint = "mmap", SetLastError = true)]
        internal static partial void* Mmap(void* address, nuint length, int protection, int flags, int fd, long offset);

        [LibraryImport(NativeLibraryResolver.LibcLibraryName, EntryPoint = "munmap", SetLastError = true)]
        internal static partial int Munmap(void* address, nuint length);

        [LibraryImport(NativeLibraryResolver.LibcLibraryName, EntryPoint = "msync", SetLastError = true)]
        internal static partial int Msync(void* address, nuint length, int flags);

        /// <summary>Returns 0 or an errno value (it does not set errno).</summary>
        [LibraryImport(NativeLibraryResolver.LibcLibraryName, EntryPoint = "posix_fallocate")]
        internal static partial int PosixFallocate(int fd, long offset, long length);
    }
}
