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

    /// <inheritdoc/>
    public override bool IsInvalid => handle == IntPtr.Zero;

    /// <inheritdoc/>
    protected override bool ReleaseHandle() =>
        _pmem
            ? Interop.Pmem.Unmap((void*)handle, _length) == 0
            : Interop.Libc.Munmap((void*)handle, _length) == 0;
}
