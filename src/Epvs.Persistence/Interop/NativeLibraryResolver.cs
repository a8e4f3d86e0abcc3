using System;
using System.Reflection;
using System.Runtime.InteropServices;

namespace Epvs.Persistence;

/// <summary>
/// Binds the logical library names of this assembly's <see cref="LibraryImportAttribute"/> declarations to real
/// libraries. The runtime asks the resolver once per logical name and caches the answer for the life of the
/// process, so the first libpmem that <see cref="PmemLibrary.TryLoad(string?, out string?)"/> loads is the one every
/// later libpmem call uses.
/// </summary>
internal static class NativeLibraryResolver
{
    /// <summary>Logical name of libpmem; never loaded by that name (see <see cref="PmemLibrary"/>).</summary>
    internal const string PmemLibraryName = "epvs-libpmem";

    /// <summary>Logical name of the C library.</summary>
    internal const string LibcLibraryName = "epvs-libc";

    // The static constructor runs exactly once, before any member is touched, and the runtime guarantees that other
    // threads touching the type wait for it: SetDllImportResolver (which throws on a second call) runs once and
    // before any P/Invoke of Interop.Pmem/Interop.Libc, whose static constructors call EnsureRegistered.
    static NativeLibraryResolver() =>
        NativeLibrary.SetDllImportResolver(typeof(NativeLibraryResolver).Assembly, Resolve);

    /// <summary>Runs the static constructor (registering the resolver) if it has not run yet.</summary>
    internal static void EnsureRegistered()
    {
    }

    private static IntPtr Resolve(string libraryName, Assembly assembly, DllImportSearchPath? searchPath)
    {
        if (libraryName == PmemLibraryName)
        {
            IntPtr bound = PmemLibrary.BoundHandle;
            if (bound == IntPtr.Zero)
            {
                PmemLibrary.TryLoad(null, out _);
                bound = PmemLibrary.BoundHandle;
            }

            // Zero makes the runtime try the logical name itself, which fails with DllNotFoundException: the
            // caller asked for libpmem without checking PmemLibrary.TryLoad first.
            return bound;
        }

        if (libraryName == LibcLibraryName)
        {
            string[] candidates = OperatingSystem.IsMacOS()
                ? ["/usr/lib/libSystem.dylib", "libSystem.dylib"]
                : ["libc.so.6", "libc.so", "libc"];
            foreach (string candidate in candidates)
            {
                if (NativeLibrary.TryLoad(candidate, out IntPtr handle))
                {
                    return handle;
                }
            }
        }

        return IntPtr.Zero;
    }
}
