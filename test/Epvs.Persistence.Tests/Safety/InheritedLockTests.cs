using System;
using System.Diagnostics;
using System.Runtime.InteropServices;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// The file lock (flock) belongs to the open file description, which a child process forked while the heap is open
/// shares until it execs — every spawn, for an instant — or for its whole life. Dispose closed its descriptor only, so
/// the child's copy kept the lock and an immediate reopen failed with AlreadyOpen (seen as a rare failure of the test
/// suite, whose child-process tests spawn while other tests reopen). Dispose now releases the lock itself (LOCK_UN), for
/// every copy. Here a child holds a copy of the locked descriptor for as long as the test needs; the control
/// (<see cref="HeapFileTestHooks.KeepLockUntilCloseForTesting"/>) releases the lock only by closing.
/// </summary>
[Collection(nameof(InheritedLockTests))]
public sealed class InheritedLockTests
{
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void AChildHoldingACopyOfTheLockedDescriptor_DoesNotKeepTheFileLockedAfterDispose(bool control)
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "flock and fork semantics of Linux");
        using var dir = new TempDirectory();
        string path = dir.File("locked.heap");
        var options = new HeapFileOptions { Size = 1L << 20, Domain = PersistenceDomainKind.MappedFile };
        PersistentHeap heap = PersistentHeap.Create(path, options);
        Process? child = null;
        HeapFileTestHooks.KeepLockUntilCloseForTesting = control;
        try
        {
            // A copy of the locked descriptor without close-on-exec: the child below inherits it and keeps it open.
            int copy = Dup((int)heap.File.LockedHandleForTesting!.DangerousGetHandle());
            Assert.True(copy >= 0, $"dup failed: errno {Marshal.GetLastPInvokeError()}");
            try
            {
                child = Process.Start(new ProcessStartInfo("sleep", "60") { UseShellExecute = false });
            }
            finally
            {
                Close(copy);
            }

            heap.Dispose();
            Exception? reopen = Record.Exception(() => PersistentHeap.Open(path, options).Dispose());
            if (control)
            {
                Assert.Equal(HeapFileError.AlreadyOpen, Assert.IsType<HeapFileException>(reopen).Error);
                return;
            }

            Assert.Null(reopen);
        }
        finally
        {
            HeapFileTestHooks.KeepLockUntilCloseForTesting = false;
            child?.Kill();
            child?.WaitForExit();
            child?.Dispose();
            heap.Dispose();
        }
    }

    [DllImport("libc", EntryPoint = "dup", SetLastError = true)]
    private static extern int Dup(int fd);

    [DllImport("libc", EntryPoint = "close", SetLastError = true)]
    private static extern int Close(int fd);
}
