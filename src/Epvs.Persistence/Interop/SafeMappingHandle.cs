using System;
using System.Runtime.InteropServices;

namespace Epvs.Persistence;

/// <summary>
/// Owns a memory mapping made with libc <c>mmap</c> or libpmem <c>pmem_map_file</c> and unmaps it exactly once,
/// even if the owning domain is never disposed.
/// </summary>
internal sealed unsafe class SafeMappingHandle : SafeHandle
{
    private readonly nuint _length;
    private readonly bool _pmem;

    internal SafeMappingHandle(void* address, nuint length, bool pmem)
        : base(IntPtr.Zero, ownsHandle: true)
    {
        SetHandle((IntPtr)address);
        _length = length;
        _pmem = pmem;
    }

    /// <summary>
    /// Replaces the mapping, in place, with private anonymous memory (Linux) and gives up ownership, so it is never
    /// unmapped: threads still using addresses in it neither crash nor write to the file. Used only when a Dispose could
    /// not wait for such threads. Where that is not possible the file mapping is kept as it is, never unmapped.
    /// </summary>
    internal void Quarantine()
    {
        if (OperatingSystem.IsLinux() && !IsInvalid)
        {
            const int mapPrivate = 0x02, mapFixed = 0x10, mapAnonymous = 0x20, mapNoReserve = 0x4000;
            Interop.Libc.Mmap((void*)handle, _length, Interop.Libc.ProtRead | Interop.Libc.ProtWrite, mapPrivate | mapFixed | mapAnonymous | mapNoReserve, -1, 0);
        }

        SetHandleAsInvalid();
    }

    /// <inheritdoc/>
    public override bool IsInvalid => handle == IntPtr.Zero;

    /// <inheritdoc/>
    protected override bool ReleaseHandle() =>
        _pmem
            ? Interop.Pmem.Unmap((void*)handle, _length) == 0
            : Interop.Libc.Munmap((void*)handle, _length) == 0;
}
