using System;
using System.IO;
using System.Runtime.InteropServices;

namespace Epvs.Persistence;

/// <summary>
/// A file mapped by PMDK's libpmem. On persistent memory (<c>pmem_is_pmem</c> true, or forced with
/// <c>PMEM_IS_PMEM_FORCE=1</c>) a write-back is <c>pmem_flush</c> (CLWB/CLFLUSHOPT on the lines), a fence is
/// <c>pmem_drain</c> and a persist is <c>pmem_persist</c>. On any other mapping PMDK documents that those calls do not
/// make data durable and that <c>pmem_msync</c> must be used instead; this domain does exactly that.
/// </summary>
internal sealed unsafe class PmemPersistenceDomain : PersistenceDomain
{
    private readonly SafeMappingHandle _mapping;
    private readonly bool _isPmem;
    private long _flushCalls;
    private long _drainCalls;
    private long _persistCalls;
    private long _msyncCalls;

    private PmemPersistenceDomain(byte* pointer, long length, SafeMappingHandle mapping, bool isPmem)
        : base(pointer, length)
    {
        _mapping = mapping;
        _isPmem = isPmem;
    }

    /// <inheritdoc/>
    public override PersistenceDomainKind Kind => PersistenceDomainKind.Pmem;

    /// <inheritdoc/>
    public override bool IsPersistentMemory => _isPmem;

    /// <summary>Diagnostic call counts (may undercount under concurrency): which libpmem path the domain took.</summary>
    internal (long Flush, long Drain, long Persist, long Msync) CallCounts => (_flushCalls, _drainCalls, _persistCalls, _msyncCalls);

    /// <summary>Maps the whole existing file with <c>pmem_map_file</c>. The caller has loaded libpmem (<see cref="PmemLibrary.TryLoad(string?, out string?)"/>).</summary>
    internal static PmemPersistenceDomain Map(string path)
    {
        void* address = Interop.Pmem.MapFile(path, 0, 0, 0, out nuint mappedLength, out int mapIsPmem);
        if (address == null)
        {
            ThrowHelper.ThrowIO($"pmem_map_file('{path}') failed: {Interop.Pmem.LastErrorMessage()}");
        }

        var mapping = new SafeMappingHandle(address, mappedLength, pmem: true);

        // pmem_map_file reports the same answer through its out parameter; ask pmem_is_pmem explicitly since that is
        // the call PMDK documents as the test for "may I use the flush path on this range".
        bool isPmem = mapIsPmem != 0 && Interop.Pmem.IsPmem(address, mappedLength) != 0;
        return new PmemPersistenceDomain((byte*)address, (long)mappedLength, mapping, isPmem);
    }

    /// <inheritdoc/>
    protected override void Dispose(bool disposing)
    {
        if (disposing)
        {
            _mapping.Dispose();
        }
    }

    private protected override void QuarantineCore() => _mapping.Quarantine();

    private protected override void WriteBackCore(long offset, long length)
    {
        if (_isPmem)
        {
            _flushCalls++;
            Interop.Pmem.Flush(Pointer + offset, (nuint)length);
        }
        else
        {
            Msync(offset, length);
        }
    }

    private protected override void FenceCore()
    {
        if (_isPmem)
        {
            _drainCalls++;
            Interop.Pmem.Drain();
        }
    }

    private protected override void PersistCore(long offset, long length)
    {
        if (_isPmem)
        {
            _persistCalls++;
            Interop.Pmem.Persist(Pointer + offset, (nuint)length);
        }
        else
        {
            Msync(offset, length);
        }
    }

    private void Msync(long offset, long length)
    {
        if (length == 0)
        {
            return;
        }

        _msyncCalls++;
        if (Interop.Pmem.Msync(Pointer + offset, (nuint)length) != 0)
        {
            int errno = Marshal.GetLastPInvokeError();
            ThrowHelper.ThrowIO($"pmem_msync failed: {Interop.Pmem.LastErrorMessage()} (errno {errno}); the range may not be durable.");
        }
    }
}
