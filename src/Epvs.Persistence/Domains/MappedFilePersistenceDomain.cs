using System;
using System.IO;
using System.IO.MemoryMappedFiles;
using System.Runtime.InteropServices;
using Microsoft.Win32.SafeHandles;

namespace Epvs.Persistence;

/// <summary>
/// A memory-mapped file made durable by the operating system: on Linux by default a private (copy-on-write) mapping
/// whose written ranges are copied into the file with <c>pwrite</c> and made durable with <c>fdatasync</c>, or a shared
/// mapping synchronized with ranged <c>msync(MS_SYNC)</c> (see <see cref="MappedFileWriteBack"/>); <c>FlushViewOfFile</c>
/// plus <c>FlushFileBuffers</c> on Windows. No native dependency beyond the C library.
/// </summary>
/// <remarks>
/// <para>Shared mapping on Unix: <see cref="PersistenceDomain.WriteBack(long, long)"/> is synchronous (msync with MS_SYNC
/// on the pages covering the range) and <see cref="PersistenceDomain.Fence"/> has nothing left to wait for. Private
/// mapping (Linux): the write-back puts the range in the page cache and the fence waits for every range written back so
/// far, by any thread, with one <c>fdatasync</c>. Windows: the write-back queues the dirty pages and the fence flushes
/// the file's buffers to the device.</para>
/// <para>On Unix the mapping reserves address space for the heap's maximum size up front, so growing is extending the
/// file (<c>posix_fallocate</c>, which fails cleanly when the disk is full instead of faulting later) and the base
/// address never moves.</para>
/// <para>A private mapping relies on the kernel's copy loop (<c>copy_from_user</c>) reading each aligned 8-byte word
/// with one load, as the device's reads of a shared page do: a word stored while its page is being written back
/// reaches the file old or new, never mixed, which is what the failure-atomicity of
/// <see cref="PersistenceDomain"/> promises.</para>
/// </remarks>
internal sealed unsafe class MappedFilePersistenceDomain : PersistenceDomain
{
    private readonly SafeFileHandle _file;
    private readonly SafeMappingHandle? _unixMapping;
    private readonly MemoryMappedFile? _windowsMap;
    private readonly MemoryMappedViewAccessor? _windowsView;
    private readonly long _capacity;
    private readonly int _pageSize = Environment.SystemPageSize;
    private readonly bool _private;
    private bool _fileReferenced;
    private long _writeBackCalls;

    private MappedFilePersistenceDomain(byte* pointer, long length, long capacity, bool privateMapping, SafeFileHandle file, SafeMappingHandle? unixMapping, MemoryMappedFile? windowsMap, MemoryMappedViewAccessor? windowsView)
        : base(pointer, length)
    {
        _capacity = capacity;
        _private = privateMapping;
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

    /// <summary>Whether the file is mapped copy-on-write and written back with pwrite (<see cref="MappedFileWriteBack.PrivateMapping"/>).</summary>
    internal bool IsPrivateMapping => _private;

    /// <summary>Calls to msync, pwrite or FlushViewOfFile so far (diagnostic; may undercount under concurrency).</summary>
    internal long WriteBackCalls => _writeBackCalls;

    /// <inheritdoc/>
    // Through pwrite every byte of a run is copied and its pages become dirty: a run takes in what follows it on its
    // last page only (msync writes dirty pages only, so a run there bridges small gaps of clean pages).
    internal override long WriteBackMergeGap => _private ? 0 : base.WriteBackMergeGap;

    /// <summary>Reads the file itself (not the mapping) at <paramref name="offset"/>: what the page cache holds (tests).</summary>
    internal int ReadFile(long offset, Span<byte> buffer) => RandomAccess.Read(_file, buffer, offset);

    /// <summary>
    /// Whether <paramref name="writeBack"/> maps a heap of at most <paramref name="capacity"/> bytes privately on this
    /// system: never off Linux; <see cref="MappedFileWriteBack.Auto"/> when the heap could take at most a quarter of
    /// the memory available to the process.
    /// </summary>
    internal static bool UsesPrivateMapping(MappedFileWriteBack writeBack, long capacity) => writeBack switch
    {
        MappedFileWriteBack.PrivateMapping => OperatingSystem.IsLinux(),
        MappedFileWriteBack.Auto => OperatingSystem.IsLinux() && capacity <= GC.GetGCMemoryInfo().TotalAvailableMemoryBytes / 4,
        _ => false,
    };

    /// <summary>
    /// Maps <paramref name="length"/> bytes of an open, locked file, reserving <paramref name="capacity"/> bytes of
    /// address space on Unix; privately (Linux) when <paramref name="privateMapping"/> is set.
    /// </summary>
    internal static MappedFilePersistenceDomain Map(FileStream stream, long length, long capacity, bool privateMapping)
    {
        if (OperatingSystem.IsWindows())
        {
            MemoryMappedFile map = MemoryMappedFile.CreateFromFile(stream, null, length, MemoryMappedFileAccess.ReadWrite, HandleInheritability.None, leaveOpen: true);
            MemoryMappedViewAccessor view = map.CreateViewAccessor(0, length, MemoryMappedFileAccess.ReadWrite);
            byte* pointer = null;
            view.SafeMemoryMappedViewHandle.AcquirePointer(ref pointer);
            return new MappedFilePersistenceDomain(pointer + view.PointerOffset, length, length, privateMapping: false, stream.SafeFileHandle, null, map, view);
        }

        capacity = Math.Max(capacity, length);
        SafeFileHandle file = stream.SafeFileHandle;
        bool referenced = false;
        file.DangerousAddRef(ref referenced);
        try
        {
            int flags = privateMapping ? Interop.Libc.MapPrivate : Interop.Libc.MapShared;
            void* address = Interop.Libc.Mmap(null, (nuint)capacity, Interop.Libc.ProtRead | Interop.Libc.ProtWrite, flags, (int)file.DangerousGetHandle(), 0);
            if (address == (void*)-1)
            {
                int errno = Marshal.GetLastPInvokeError();
                ThrowHelper.ThrowIO($"mmap of {capacity} bytes failed: {Marshal.GetPInvokeErrorMessage(errno)} (errno {errno}).");
            }

            var domain = new MappedFilePersistenceDomain((byte*)address, length, capacity, privateMapping, file, new SafeMappingHandle(address, (nuint)capacity, pmem: false), null, null);
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

        _writeBackCalls++;
        if (_private)
        {
            CopyToFile(offset, length);
            return;
        }

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
        // Private mapping: the copies are in the page cache; one fdatasync waits for all of them (every thread's: a
        // stronger fence than the contract asks). Shared mapping on Unix: msync(MS_SYNC) already waited. Windows:
        // FlushViewOfFile only queued the pages.
        if (_private)
        {
            if (Interop.Libc.Fdatasync((int)_file.DangerousGetHandle()) != 0)
            {
                ThrowSyncFailed("fdatasync");
            }
        }
        else if (_windowsView is not null && !Interop.Kernel32.FlushFileBuffers(_file))
        {
            ThrowSyncFailed("FlushFileBuffers");
        }
    }

    /// <summary>Copies a range of the private mapping to the same place in the file (into the page cache).</summary>
    private void CopyToFile(long offset, long length)
    {
        int fd = (int)_file.DangerousGetHandle();
        while (length > 0)
        {
            nint written = Interop.Libc.Pwrite(fd, Pointer + offset, (nuint)length, offset);
            if (written <= 0)
            {
                // A signal before anything was copied: try again. Zero bytes for a non-empty range: no progress is
                // possible (a full disk reports ENOSPC instead), so report it rather than spin.
                if (written < 0 && Marshal.GetLastPInvokeError() == Interop.Libc.Eintr)
                {
                    continue;
                }

                ThrowSyncFailed("pwrite");
            }

            offset += written;
            length -= written;
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
