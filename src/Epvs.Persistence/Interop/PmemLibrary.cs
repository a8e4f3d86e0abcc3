using System;
using System.Runtime.InteropServices;
using System.Threading;

namespace Epvs.Persistence;

/// <summary>
/// Loads libpmem on demand under a caller-chosen name (<see cref="HeapFileOptions.PmemLibraryName"/>), so that a
/// missing library is an ordinary, testable outcome instead of a <see cref="DllNotFoundException"/> at the first call.
/// </summary>
internal static class PmemLibrary
{
    /// <summary>The soname of PMDK's libpmem on Linux (Debian package <c>libpmem1</c>).</summary>
    internal const string DefaultName = "libpmem.so.1";

    private static readonly string[] s_requiredExports =
    [
        "pmem_map_file", "pmem_unmap", "pmem_is_pmem", "pmem_flush", "pmem_drain", "pmem_persist", "pmem_msync", "pmem_errormsg",
    ];

    private static readonly object s_gate = new();
    private static IntPtr s_boundHandle;

    /// <summary>The handle the <c>LibraryImport</c> stubs are bound to, or zero before the first successful load.</summary>
    // Volatile.Read: acquire; pairs with the Volatile.Write in TryLoad so a reader that sees the handle also sees the
    // library fully loaded.
    internal static IntPtr BoundHandle => Volatile.Read(ref s_boundHandle);

    /// <summary>
    /// Loads libpmem by <paramref name="name"/> (<see cref="DefaultName"/> when null) and checks that it exports every
    /// function this package calls. The first library loaded this way is the one all libpmem calls of the process use.
    /// </summary>
    /// <returns><see langword="true"/> when the library loaded and exports what we need; otherwise <paramref name="failure"/> says why.</returns>
    internal static bool TryLoad(string? name, out string? failure)
    {
        name ??= DefaultName;
        if (!NativeLibrary.TryLoad(name, typeof(PmemLibrary).Assembly, null, out IntPtr handle))
        {
            failure = $"libpmem could not be loaded as '{name}' (on Debian/Ubuntu: apt-get install libpmem1).";
            return false;
        }

        foreach (string export in s_requiredExports)
        {
            if (!NativeLibrary.TryGetExport(handle, export, out _))
            {
                // Unloaded again (it stayed mapped for the process's life, one reference per name tried).
                NativeLibrary.Free(handle);
                failure = $"'{name}' loaded but does not export '{export}'; it is not PMDK's libpmem.";
                return false;
            }
        }

        lock (s_gate)
        {
            if (s_boundHandle == IntPtr.Zero)
            {
                // Volatile.Write: release; pairs with BoundHandle's acquire read in the resolver.
                Volatile.Write(ref s_boundHandle, handle);
            }
            else
            {
                // The first library loaded is the one used: this load's reference is given back (the same library loaded
                // again only drops its count by one).
                NativeLibrary.Free(handle);
            }
        }

        NativeLibraryResolver.EnsureRegistered();
        failure = null;
        return true;
    }
}
