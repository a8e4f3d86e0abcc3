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
/// <remarks>
/// The <c>pmem_msync</c> path is fail-stop and serialized, like the mapped-file domain's msync (see
/// <see cref="MappedFilePersistenceDomain"/>): Linux reports a page's failed write-back once per open file, to whichever
/// msync checks first, and marks the page clean, so after one failure a later msync of that page succeeds without
/// writing it. Every write-back and fence after a failed msync therefore throws.
/// </remarks>
internal sealed unsafe class PmemPersistenceDomain : PersistenceDomain
{
    private readonly SafeMappingHandle _mapping;
    private readonly bool _isPmem;
    private long _flushCalls;
    private long _drainCalls;
    private long _persistCalls;
    private long _msyncCalls;

    /// <summary>Serializes pmem_msync calls, so that no call returns success over pages whose failure another call took (see the remarks).</summary>
    private readonly object _syncGate = new();

    /// <summary>Test hook: replaces the pmem_msync call; a simulated kernel whose result (0, or -1 with errno set) is the call's.</summary>
    internal Func<int>? MsyncCallForTesting;

    /// <summary>Broken control for tests: a failed pmem_msync is reported once and then forgotten (not fail-stop).</summary>
    internal bool NoFailStopForTesting;

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

    /// <summary>Maps the whole existing file with <c>pmem_map_file</c>, or says why libpmem refused it. The caller has loaded libpmem (<see cref="PmemLibrary.TryLoad(string?, out string?)"/>).</summary>
    /// <param name="path">The path libpmem opens (the heap file's locked descriptor, through /proc/self/fd).</param>
    /// <param name="failure">Why <c>pmem_map_file</c> failed (libpmem's message), when it returns null.</param>
    internal static PmemPersistenceDomain? TryMap(string path, out string? failure)
    {
        if (HeapFileTestHooks.SimulatedPmemMapFailure)
        {
            failure = "pmem_map_file failed: simulated (HeapFileTestHooks).";
            return null;
        }

        void* address = Interop.Pmem.MapFile(path, 0, 0, 0, out nuint mappedLength, out int mapIsPmem);
        if (address == null)
        {
            failure = $"pmem_map_file failed: {Interop.Pmem.LastErrorMessage()}.";
            return null;
        }

        failure = null;
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

    /// <inheritdoc/>
    private protected override void ReleaseQuarantineCore() => _mapping.ReleaseQuarantine();

    /// <inheritdoc/>
    internal override bool HoldsQuarantinedMemory => _mapping.HoldsQuarantinedMemory;

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
        else
        {
            // The msyncs already waited; a fence after a failed one must not pass as if they had all succeeded.
            ThrowIfFailedBefore();
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

        ThrowIfFailedBefore();
        using (InterruptShield.Hold(_syncGate))
        {
            _msyncCalls++;
            // Under the gate: the call that takes the kernel's report of a failed page records it before any other
            // call can return.
            ThrowIfFailedBefore();
            if ((MsyncCallForTesting?.Invoke() ?? Interop.Pmem.Msync(Pointer + offset, (nuint)length)) != 0)
            {
                ThrowCallFailed("pmem_msync", Marshal.GetLastPInvokeError(), "the range may not be durable.", failStop: !NoFailStopForTesting);
            }
        }
    }
}
