using System.Runtime.InteropServices;
using Microsoft.Win32.SafeHandles;

namespace Epvs.Persistence;

internal static partial class Interop
{
    /// <summary>Windows: write back a range of a mapped view and flush the file's buffers to the device.</summary>
    internal static unsafe partial class Kernel32
    {
        private const string LibraryName = "kernel32.dll";

        [LibraryImport(LibraryName, EntryPoint = "FlushViewOfFile", SetLastError = true)]
        [return: MarshalAs(UnmanagedType.Bool)]
        internal static partial bool FlushViewOfFile(void* baseAddress, nuint numberOfBytesToFlush);

        [LibraryImport(LibraryName, EntryPoint = "FlushFileBuffers", SetLastError = true)]
        [return: MarshalAs(UnmanagedType.Bool)]
        internal static partial bool FlushFileBuffers(SafeFileHandle file);
    }
}
