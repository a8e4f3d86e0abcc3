using System;
using System.IO;
using System.IO.MemoryMappedFiles;
using System.Runtime.InteropServices;
using Microsoft.Win32.SafeHandles;

namespace Epvs.Persistence;

/// <summary>
/// A memory-mapped file made durable by the operating system's page-cache synchronization: ranged <c>msync(MS_SYNC)</c>
/// through libc on Unix, <c>FlushViewOfFile</c> plus <c>FlushFileBuffers</c> on Windows. No native dependency beyond
/// the C library.
/// </summary>
/// <remarks>
/// On Unix <see cref="PersistenceDomain.WriteBack(long, long)"/> is synchronous (msync with MS_SYNC on the pages
/// covering the range) and <see cref="PersistenceDomain.Fence"/> has nothing left to wait for. On Windows the write-back
/// queues the dirty pages and the fence flushes the file's buffers to the device. On Unix the mapping reserves
/// address space for the heap's maximum size up front, so growing is extending the file (<c>posix_fallocate</c>, which
/// fails cleanly when the disk is full instead of faulting later) and the base address never moves.
/// </remarks>
internal sealed unsafe class MappedFilePersistenceDomain : PersistenceDomain
{
    private readonly SafeFileHandle _file;
    private readonly SafeMappingHandle? _unixMapping;
    private readonly MemoryMappedFile? _windowsMap;
    private readonly MemoryMappedViewAccessor? _windowsView;
    private readonly long _capacity;
    private readonly int _pageSize = Environment.SystemPageSize;
    private bool _fileReferenced;
    private long _msyncCalls;

    private MappedFilePersistenceDomain(byte* pointer, long length, long capacity, SafeFileHandle file, SafeMappingHandle? unixMapping, MemoryMappedFile? windowsMap, MemoryMappedViewAccessor? windowsView)
        : base(pointer, length)
    {
        _capacity = capacity;
        _file = file;
        _unixMapping = unixMapping;
        _windowsMap = windowsMap;
        _windowsView = windowsView;
    }

    /// <inheritdoc/>
    public override PersistenceDomainKind Kind => PersistenceDomainKind.MappedFile;

    /// <inheritdoc/>
    public override bool IsPersistentMemory => false;

    /// <inheritdoc/>
    public override long Capacity => _capacity;

    /// <summary>Calls to msync/FlushViewOfFile so far (diagnostic; may undercount under concurrency).</summary>
    internal long MsyncCalls => _msyncCalls;

    /// <summary>Maps <paramref name="length"/> bytes of an open, locked file, reserving <paramref name="capacity"/> bytes of address space on Unix.</summary>
    internal static MappedFilePersistenceDomain Map(FileStream stream, long length, long capacity)
    {
        if (OperatingSystem.IsWindows())
        {
            MemoryMappedFile map = MemoryMappedFile.CreateFromFile(stream, null, length, MemoryMappedFileAccess.ReadWrite, HandleInheritability.None, leaveOpen: true);
            MemoryMappedViewAccessor view = map.CreateViewAccessor(0, length, MemoryMappedFileAccess.ReadWrite);
            byte* pointer = null;
            view.SafeMemoryMappedViewHandle.AcquirePointer(ref pointer);
            return new MappedFilePersistenceDomain(pointer + view.PointerOffset, length, length, stream.SafeFileHandle, null, map, view);
        }

        capacity = Math.Max(capacity, length);
        SafeFileHandle file = stream.SafeFileHandle;
        bool referenced = false;
        file.DangerousAddRef(ref referenced);
        try
        {
            void* address = Interop.Libc.Mmap(null, (nuint)capacity, Interop.Libc.ProtRead | Interop.Libc.ProtWrite, Interop.Libc.MapShared, (int)file.DangerousGetHandle(), 0);
            if (address == (void*)-1)
            {
                int errno = Marshal.GetLastPInvokeError();
                ThrowHelper.ThrowIO($"mmap of {capacity} bytes failed: {Marshal.GetPInvokeErrorMessage(errno)} (errno {errno}).");
            }

            var domain = new MappedFilePersistenceDomain((byte*)address, length, capacity, file, new SafeMappingHandle(address, (nuint)capacity, pmem: false), null, null);
            domain._fileReferenced = true;
            referenced = false;
            return domain;
        }
        finally
        {
            if (referenced)
            {
                file.DangerousRelease();
            }
        }
    }

    /// <inheritdoc/>
    protected override void Dispose(bool disposing)
    {
        if (!disposing)
        {
            return;
        }

        if (_windowsView is not null)
        {
            _windowsView.SafeMemoryMappedViewHandle.ReleasePointer();
            _windowsView.Dispose();
            _windowsMap!.Dispose();
        }

        _unixMapping?.Dispose();
        if (_fileReferenced)
        {
            _file.DangerousRelease();
        }
    }

    private protected override void QuarantineCore()
    {
        // Windows: the view is kept (never unmapped); Unix: replaced by anonymous memory.
        _unixMapping?.Quarantine();
        if (_fileReferenced)
        {
            _file.DangerousRelease();
        }
    }

    private protected override void WriteBackCore(long offset, long length)
    {
        if (length == 0)
        {
            return;
        }

        _msyncCalls++;
        if (_windowsView is not null)
        {
            if (!Interop.Kernel32.FlushViewOfFile(Pointer + offset, (nuint)length))
            {
                ThrowSyncFailed("FlushViewOfFile");
            }

            return;
        }

        // msync wants a page-aligned start address.
        long start = offset & ~(long)(_pageSize - 1);
        if (Interop.Libc.Msync(Pointer + start, (nuint)(offset + length - start), Interop.Libc.MsSync) != 0)
        {
            ThrowSyncFailed("msync");
        }
    }

    private protected override void FenceCore()
    {
        // Unix: msync(MS_SYNC) already waited. Windows: FlushViewOfFile only queued the pages.
        if (_windowsView is not null && !Interop.Kernel32.FlushFileBuffers(_file))
        {
            ThrowSyncFailed("FlushFileBuffers");
        }
    }

    private protected override bool TryGrowCore(long newLength)
    {
        if (_windowsView is not null)
        {
            return false;
        }

        int error = Interop.Libc.PosixFallocate((int)_file.DangerousGetHandle(), Length, newLength - Length);
        return error == 0;
    }

    private static void ThrowSyncFailed(string call)
    {
        int errno = Marshal.GetLastPInvokeError();
        ThrowHelper.ThrowIO($"{call} failed: {Marshal.GetPInvokeErrorMessage(errno)} (error {errno}); the written-back range may not be durable.");
    }
}
