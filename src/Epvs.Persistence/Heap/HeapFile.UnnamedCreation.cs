using System;
using System.IO;
using System.Runtime.InteropServices;
using Microsoft.Win32.SafeHandles;

namespace Epvs.Persistence;

// Creating a heap file atomically on Linux: formatted unnamed, then named.
public sealed unsafe partial class HeapFile
{
    /// <summary>
    /// Creates the heap file unnamed (<c>O_TMPFILE</c> in <paramref name="directory"/>), formats and persists it in full,
    /// and only then gives it its name (<c>linkat</c>, which never replaces a file that appeared meanwhile), and makes the
    /// name durable. A crash before the name leaves nothing behind (the kernel frees an unnamed file with its last
    /// descriptor): creating the file in place, a crash between creating and formatting it left a file that
    /// <see cref="Open(string, HeapFileOptions?)"/> refuses as not a heap file and <see cref="Create(string, HeapFileOptions?)"/>
    /// refuses as existing, until deleted by hand. Returns null where that is not possible (not Linux, a file system
    /// without unnamed files, no <c>/proc</c>): the caller creates the file in place.
    /// </summary>
    private static HeapFile? CreateUnnamedThenLink(string fullPath, string directory, long heapSize, long capacity, long maxSegments, long dataStart, HeapFileOptions options)
    {
        if (!OperatingSystem.IsLinux() || HeapFileTestHooks.CreateInPlace)
        {
            return null;
        }

        int fd = Interop.Libc.Open(directory, Interop.Libc.TmpFile | Interop.Libc.ReadWrite | Interop.Libc.CloseOnExec, CreationMode);
        if (fd < 0)
        {
            int errno = Marshal.GetLastPInvokeError();
            if (errno is Interop.Libc.Eacces or Interop.Libc.Eperm or Interop.Libc.Erofs)
            {
                ThrowHelper.ThrowHeapFile(HeapFileError.ReadOnly, errno == Interop.Libc.Erofs ? $"Cannot create heap file '{fullPath}': the file system is read-only." : $"Cannot create heap file '{fullPath}': the directory is not writable.");
            }

            // No unnamed files here (EOPNOTSUPP, EISDIR, EINVAL), or a failure creating in place reports as usual.
            return null;
        }

        var handle = new SafeFileHandle(fd, ownsHandle: true);

        // Kernels before 6.1 did not apply the umask to O_TMPFILE files on file systems without POSIX ACLs (the file was
        // 0666, writable by anyone): set the mode a named creation gets. (Not on later kernels: in a directory with a
        // default ACL, the mode a creation gets comes from the ACL, which a chmod would override.)
        if (Environment.OSVersion.Version < new Version(6, 1))
        {
            _ = Interop.Libc.Fchmod(fd, CreationMode & ~ProcessUmask());
        }
        string link = $"/proc/self/fd/{fd}";
        FileStream? stream = null;
        PersistenceDomain? domain = null;
        bool named = false;
        try
        {
            // The exclusive lock every open of a heap file takes (as FileShare.None does): it comes with the name. Nobody
            // else can hold it on a file without a name; a file system without locks fails it, which FileShare.None ignores too.
            _ = Interop.Libc.Flock(fd, Interop.Libc.LockExclusive | Interop.Libc.LockNonBlocking);

            // Reserve the blocks, so a full disk fails here, cleanly, instead of as SIGBUS on a later store through the mapping.
            int reserved = Interop.Libc.PosixFallocate(fd, 0, heapSize);
            if (Interop.Libc.IsOutOfSpace(reserved))
            {
                ThrowHelper.ThrowHeapFile(HeapFileError.InsufficientSpace, $"Cannot create heap file '{fullPath}' of {heapSize} bytes: the file system has no room for it ({Marshal.GetPInvokeErrorMessage(reserved)}).");
            }

            stream = new FileStream(handle, FileAccess.ReadWrite, bufferSize: 0);
            stream.SetLength(heapSize);
            domain = MapDomain(stream, fullPath, link, heapSize, capacity, options);
            Format(domain, heapSize, maxSegments, dataStart);
            HeapFileTestHooks.BeforeNamingCreatedFile?.Invoke(fullPath);

            if (Interop.Libc.Linkat(Interop.Libc.AtCurrentDirectory, link, Interop.Libc.AtCurrentDirectory, fullPath, Interop.Libc.AtSymlinkFollow) != 0)
            {
                int errno = Marshal.GetLastPInvokeError();
                if (errno == Interop.Libc.Eexist)
                {
                    ThrowHelper.ThrowHeapFile(HeapFileError.AlreadyExists, $"Cannot create heap file '{fullPath}': the path already exists (it appeared while the file was being created). An existing file is never reformatted; delete it or open it with HeapFile.Open.");
                }

                // No /proc, or a file system that cannot link: created in place instead.
                domain.Dispose();
                stream.Dispose();
                return null;
            }

            named = true;
            SyncDirectory(directory, fullPath);
            return new HeapFile(domain, stream, ownsDomain: true, fullPath, wasClean: true);
        }
        catch (Exception e)
        {
            Exception? removal = null;
            try
            {
                if (named)
                {
                    // A new, empty heap under its name that might not be durable: removed, as a failed creation in place is.
                    removal = TryDelete(fullPath);
                }
            }
            finally
            {
                // Whatever the removal did: a removal that threw used to leave the mapping, the descriptor and the lock
                // held for the life of the process.
                domain?.Dispose();
                if (stream is not null)
                {
                    stream.Dispose();
                }
                else
                {
                    handle.Dispose();
                }
            }

            ThrowIfNotRemoved(fullPath, e, removal);
            throw;
        }
    }

    /// <summary>Deletes a file a failed creation made; the failure to, if any (the file is then left behind).</summary>
    private static Exception? TryDelete(string fullPath)
    {
        try
        {
            if (HeapFileTestHooks.SimulatedRemovalFailure)
            {
                throw new IOException("simulated: the file system refused the removal");
            }

            File.Delete(fullPath);
            return null;
        }
        catch (Exception e) when (e is IOException or UnauthorizedAccessException)
        {
            return e;
        }
    }

    /// <summary>After a failed creation whose file could not be removed: says so (the creation's own error is the inner exception).</summary>
    private static void ThrowIfNotRemoved(string fullPath, Exception failure, Exception? removal)
    {
        if (removal is not null)
        {
            throw new IOException($"{failure.Message.Replace("; the new file is removed.", ".", StringComparison.Ordinal)} Removing the new file failed too ({removal.Message}): delete '{fullPath}' before creating the heap again.", failure);
        }
    }

    /// <summary>0666, less the umask: the mode FileStream creates files with.</summary>
    private const int CreationMode = 0x1B6;

    /// <summary>The process's file mode creation mask, from <c>/proc/self/status</c> (reading it with <c>umask</c> would
    /// change it for a moment, under other threads' creations); 022 when it cannot be read.</summary>
    private static int ProcessUmask()
    {
        try
        {
            foreach (string line in File.ReadLines("/proc/self/status"))
            {
                if (line.StartsWith("Umask:", StringComparison.Ordinal))
                {
                    return Convert.ToInt32(line.Substring("Umask:".Length).Trim(), 8);
                }
            }
        }
        catch (Exception e) when (e is IOException or UnauthorizedAccessException or FormatException)
        {
            // Below.
        }

        return 0x12; // 022
    }

    /// <summary>
    /// Makes the new name <paramref name="fullPath"/> in <paramref name="directory"/> durable (Linux), so that a crash
    /// right after Create returns cannot lose the file: throws if the directory's fsync fails (the caller removes the
    /// file). A file system that cannot sync a directory (EINVAL, ENOTSUP) needs no sync, and a directory this process
    /// may not open for reading (EACCES, EPERM) is left to the file system; any other failure to open it throws.
    /// </summary>
    private static void SyncDirectory(string directory, string fullPath)
    {
        int error = HeapFileTestHooks.SimulatedDirectorySyncError ?? 0;
        if (HeapFileTestHooks.SimulatedDirectorySyncError is null)
        {
            int fd = Interop.Libc.Open(directory, Interop.Libc.ReadOnly | Interop.Libc.Directory | Interop.Libc.CloseOnExec, 0);
            if (fd < 0)
            {
                // Only a directory this process may not read is left to the file system. Any other failure (no descriptor
                // left, no memory) throws: skipped silently, the Create succeeded without its name's fsync (a probe,
                // with one descriptor left).
                int openError = Marshal.GetLastPInvokeError();
                if (openError is Interop.Libc.Eacces or Interop.Libc.Eperm)
                {
                    return;
                }

                ThrowHelper.ThrowIO($"Cannot create heap file '{fullPath}': its directory could not be opened for the fsync that makes the new name durable ({Marshal.GetPInvokeErrorMessage(openError)}, errno {openError}; out of file descriptors?), so its name might not survive a crash; the new file is removed.");
            }

            if (Interop.Libc.Fsync(fd) != 0)
            {
                error = Marshal.GetLastPInvokeError();
            }

            _ = Interop.Libc.Close(fd);
        }

        if (error is not (0 or Interop.Libc.Einval or Interop.Libc.Enotsup))
        {
            ThrowHelper.ThrowIO($"Cannot create heap file '{fullPath}': the fsync of its directory failed ({Marshal.GetPInvokeErrorMessage(error)}, errno {error}), so its name might not survive a crash; the new file is removed.");
        }
    }
}
