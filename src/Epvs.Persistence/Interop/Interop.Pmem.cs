using System;
using System.Runtime.InteropServices;

namespace Epvs.Persistence;

internal static partial class Interop
{
    /// <summary>
    /// libpmem (PMDK, Debian package <c>libpmem1</c>). The library name is the logical name
    /// <see cref="NativeLibraryResolver.PmemLibraryName"/>; <see cref="NativeLibraryResolver"/> binds it to the
    /// handle loaded by <see cref="PmemLibrary.TryLoad(string?, out string?)"/>, which is what makes the library name injectable.
    /// </summary>
    internal static unsafe partial class Pmem
    {
        internal const int FileCreate = 1;

        // Every entry point below is only reached after PmemLibrary.TryLoad succeeded, which registered the
        // resolver; the static constructor makes that hold even for a direct call.
        static Pmem() => NativeLibraryResolver.EnsureRegistered();

        [LibraryImport(NativeLibraryResolver.PmemLibraryName, EntryPoint = "pmem_map_file", StringMarshalling = StringMarshalling.Utf8, SetLastError = true)]
        internal static partial void* MapFile(string path, nuint length, int flags, uint mode, out nuint mappedLength, out int isPmem);

        [LibraryImport(NativeLibraryResolver.PmemLibraryName, EntryPoint = "pmem_unmap", SetLastError = true)]
        internal static partial int Unmap(void* address, nuint length);

        [LibraryImport(NativeLibraryResolver.PmemLibraryName, EntryPoint = "pmem_is_pmem")]
        internal static partial int IsPmem(void* address, nuint length);

        [LibraryImport(NativeLibraryResolver.PmemLibraryName, EntryPoint = "pmem_flush")]
        internal static partial void Flush(void* address, nuint length);

        [LibraryImport(NativeLibraryResolver.PmemLibraryName, EntryPoint = "pmem_drain")]
        internal static partial void Drain();

        [LibraryImport(NativeLibraryResolver.PmemLibraryName, EntryPoint = "pmem_persist")]
        internal static partial void Persist(void* address, nuint length);

        [LibraryImport(NativeLibraryResolver.PmemLibraryName, EntryPoint = "pmem_msync", SetLastError = true)]
        internal static partial int Msync(void* address, nuint length);

        [LibraryImport(NativeLibraryResolver.PmemLibraryName, EntryPoint = "pmem_errormsg")]
        internal static partial byte* ErrorMessage();

        /// <summary>The last libpmem error message of this thread, or an empty string.</summary>
        internal static string LastErrorMessage()
        {
            byte* message = ErrorMessage();
            return message == null ? string.Empty : Marshal.PtrToStringUTF8((IntPtr)message) ?? string.Empty;
        }
    }
}
