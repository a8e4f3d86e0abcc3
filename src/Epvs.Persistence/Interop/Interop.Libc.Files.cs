using System.Runtime.InteropServices;

namespace Epvs.Persistence;

internal static partial class Interop
{
    // The C library's file calls for creating a heap file atomically on Linux (see HeapFile.Create): an unnamed
    // file (O_TMPFILE) formatted in full, then given its name with linkat, which never replaces an existing
    // file; and the errno values the heap file tells apart. The open flags are Linux's for the architecture:
    // O_DIRECTORY differs between x86 and Arm.
    internal static unsafe partial class Libc
    {
        internal const int ReadWrite = 0x2;
        internal const int ReadOnly = 0x0;
        internal const int CloseOnExec = 0x80000;

        /// <summary><c>O_DIRECTORY</c>: 0200000 on x86, x86-64, RISC-V, LoongArch and s390x, 040000 on Arm, Arm64 (where
        /// 0200000 is <c>O_DIRECT</c>) and 64-bit PowerPC.</summary>
        internal static int Directory => RuntimeInformation.ProcessArchitecture is Architecture.Arm or Architecture.Arm64 or Architecture.Armv6 or Architecture.Ppc64le ? 0x4000 : 0x10000;

        /// <summary><c>O_TMPFILE</c>: <c>__O_TMPFILE</c> (020000000 on x86 and Arm alike) with <c>O_DIRECTORY</c>.</summary>
        internal static int TmpFile => 0x400000 | Directory;

        internal const int LockExclusive = 2;
        internal const int LockNonBlocking = 4;
        internal const int LockUnlock = 8;
        internal const int AtCurrentDirectory = -100;
        internal const int AtSymlinkFollow = 0x400;

        internal const int Eperm = 1;
        internal const int Enomem = 12;
        internal const int Eacces = 13;
        internal const int Eexist = 17;
        internal const int Einval = 22;
        internal const int Enfile = 23;
        internal const int Emfile = 24;
        internal const int Efbig = 27;
        internal const int Enospc = 28;
        internal const int Erofs = 30;
        internal const int Enotsup = 95;
        internal const int Edquot = 122;

        /// <summary>Whether <paramref name="errno"/> says the file system (or the user's quota, or the file size) has no room.</summary>
        internal static bool IsOutOfSpace(int errno) => errno is Enospc or Efbig or Edquot;

        /// <summary>A file descriptor, or -1 with errno set.</summary>
        [LibraryImport(NativeLibraryResolver.LibcLibraryName, EntryPoint = "open", SetLastError = true, StringMarshalling = StringMarshalling.Utf8)]
        internal static partial int Open(string path, int flags, int mode);

        [LibraryImport(NativeLibraryResolver.LibcLibraryName, EntryPoint = "close", SetLastError = true)]
        internal static partial int Close(int fd);

        /// <summary><c>access(2)</c>'s <c>W_OK</c>.</summary>
        internal const int WriteOk = 2;

        /// <summary>0 if the calling process may access <paramref name="path"/> as <paramref name="mode"/> asks, or -1 with errno set (<c>EROFS</c> on a read-only file system).</summary>
        [LibraryImport(NativeLibraryResolver.LibcLibraryName, EntryPoint = "access", SetLastError = true, StringMarshalling = StringMarshalling.Utf8)]
        internal static partial int Access(string path, int mode);

        [LibraryImport(NativeLibraryResolver.LibcLibraryName, EntryPoint = "flock", SetLastError = true)]
        internal static partial int Flock(int fd, int operation);

        [LibraryImport(NativeLibraryResolver.LibcLibraryName, EntryPoint = "fchmod", SetLastError = true)]
        internal static partial int Fchmod(int fd, int mode);

        [LibraryImport(NativeLibraryResolver.LibcLibraryName, EntryPoint = "fsync", SetLastError = true)]
        internal static partial int Fsync(int fd);

        /// <summary><c>statx</c>'s flag: the path is empty, the file is the descriptor itself.</summary>
        internal const int AtEmptyPath = 0x1000;

        /// <summary><c>statx</c>'s mask bit for the link count (<c>stx_nlink</c>, a 32-bit field at byte 16 of the result).</summary>
        internal const uint StatxNlink = 0x4;

        /// <summary>The size of <c>struct statx</c> (the same on every architecture).</summary>
        internal const int StatxSize = 256;

        [LibraryImport(NativeLibraryResolver.LibcLibraryName, EntryPoint = "statx", SetLastError = true, StringMarshalling = StringMarshalling.Utf8)]
        internal static partial int Statx(int directory, string path, int flags, uint mask, byte* result);

        [LibraryImport(NativeLibraryResolver.LibcLibraryName, EntryPoint = "linkat", SetLastError = true, StringMarshalling = StringMarshalling.Utf8)]
        internal static partial int Linkat(int oldDirectory, string oldPath, int newDirectory, string newPath, int flags);

        /// <summary>Room for <c>struct statfs</c> (120 bytes on 64-bit Linux, less on 32-bit).</summary>
        private const int StatfsSize = 256;

        [LibraryImport(NativeLibraryResolver.LibcLibraryName, EntryPoint = "fstatfs", SetLastError = true)]
        private static partial int Fstatfs(int fd, byte* result);

        /// <summary>
        /// The type of the file system that holds <paramref name="fd"/>'s file (<c>statfs</c>'s <c>f_type</c>, a magic
        /// number such as <c>0xEF53</c> for ext4), or null where <c>fstatfs</c> fails.
        /// </summary>
        /// <remarks><c>f_type</c> is the first field of <c>struct statfs</c>: a word of the architecture on Linux (4 bytes on
        /// 32-bit, 8 on 64-bit), 4 bytes on s390x. Every magic number fits in 32 bits, so the first 4 bytes hold it on a
        /// little-endian machine and on s390x; on a big-endian machine with an 8-byte field they read 0, which names no file
        /// system (the caller then takes the file system as unknown).</remarks>
        internal static uint? FileSystemType(int fd)
        {
            byte* result = stackalloc byte[StatfsSize];
            return Fstatfs(fd, result) == 0 ? *(uint*)result : null;
        }
    }
}
