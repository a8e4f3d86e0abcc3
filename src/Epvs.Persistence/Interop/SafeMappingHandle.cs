using System;
using System.Runtime.InteropServices;
using System.Threading;

namespace Epvs.Persistence;

/// <summary>
/// Owns a memory mapping made with libc <c>mmap</c> or libpmem <c>pmem_map_file</c> and unmaps it exactly once,
/// even if the owning domain is never disposed.
/// </summary>
internal sealed unsafe class SafeMappingHandle : SafeHandle
{
    private readonly nuint _length;
    private readonly bool _pmem;

    /// <summary>The quarantined mapping's address (Linux), until <see cref="ReleaseQuarantine"/> unmaps it.</summary>
    private nint _quarantined;

    internal SafeMappingHandle(void* address, nuint length, bool pmem)
        : base(IntPtr.Zero, ownsHandle: true)
    {
        SetHandle((IntPtr)address);
        _length = length;
        _pmem = pmem;
    }

    /// <summary>
    /// Replaces the mapping, in place, with private anonymous memory (Linux) and gives up ownership, so it is not
    /// unmapped (nor by the finalizer): threads still using addresses in it neither crash nor write to the file. Used only
    /// when a Dispose could not wait for such threads; <see cref="ReleaseQuarantine"/> unmaps it once they have left.
    /// Where that is not possible the file mapping is kept as it is, never unmapped.
    /// </summary>
    internal void Quarantine()
    {
        if (OperatingSystem.IsLinux() && !IsInvalid)
        {
            const int mapPrivate = 0x02, mapFixed = 0x10, mapAnonymous = 0x20, mapNoReserve = 0x4000;
            if (Interop.Libc.Mmap((void*)handle, _length, Interop.Libc.ProtRead | Interop.Libc.ProtWrite, mapPrivate | mapFixed | mapAnonymous | mapNoReserve, -1, 0) == (void*)handle)
            {
                // A plain store: ReleaseQuarantine runs in a deferred action registered after this, whose epoch bump
                // (a full fence) publishes it; tests read it with Volatile.Read.
                _quarantined = handle;
            }
        }

        SetHandleAsInvalid();
    }

    /// <summary>Whether <see cref="Quarantine"/> left memory that <see cref="ReleaseQuarantine"/> has not unmapped yet.</summary>
    internal bool HoldsQuarantinedMemory => Volatile.Read(ref _quarantined) != 0;

    /// <summary>
    /// Unmaps the anonymous memory that <see cref="Quarantine"/> left (once, at most): only once no thread can use an
    /// address in it any more (the threads that were inside operations when Dispose gave up waiting have left). Until
    /// then it holds the reservation's address space, the heap's maximum size.
    /// </summary>
    internal void ReleaseQuarantine()
    {
        // Interlocked.Exchange: exactly one caller unmaps.
        nint address = Interlocked.Exchange(ref _quarantined, 0);
        if (address != 0)
        {
            _ = Interop.Libc.Munmap((void*)address, _length);
        }
    }

    /// <inheritdoc/>
    public override bool IsInvalid => handle == IntPtr.Zero;

    /// <inheritdoc/>
    protected override bool ReleaseHandle() =>
        _pmem
            ? Interop.Pmem.Unmap((void*)handle, _length) == 0
            : Interop.Libc.Munmap((void*)handle, _length) == 0;
}
