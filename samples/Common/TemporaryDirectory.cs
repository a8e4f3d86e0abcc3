using System;
using System.Collections.Generic;
using System.IO;
using System.Runtime.InteropServices;
using System.Threading;

namespace Epvs.Samples;

/// <summary>
/// A fresh directory for a sample's or a benchmark's files (heap files of up to GiB), deleted on <see cref="Dispose"/>,
/// and, in a program that called <see cref="DeleteAllOnTermination"/> from its Main, also when the process is ended by
/// SIGINT (Ctrl-C) or SIGTERM, or by an unhandled exception: none of these runs <c>finally</c> blocks. Unlinking a file
/// that is still mapped and open is fine on Linux (its space is freed when the process is gone). The process then
/// terminates as it would have (the signal's default handling is not cancelled).
/// </summary>
/// <remarks>The signal hook is the program's choice, not the constructor's: a demo run inside a host of its own (a test
/// runner, which may cancel Ctrl-C to stop its tests gracefully) must not have its live directories deleted, nor every
/// later directory refused, by a signal the host handles.</remarks>
public sealed class TemporaryDirectory : IDisposable
{
    private static readonly Lock Gate = new();
    private static readonly HashSet<TemporaryDirectory> Live = new();
    private static readonly List<PosixSignalRegistration> Registrations = new();
    private static bool terminating;
    private int disposed;

    /// <summary>Creates <c><paramref name="parent"/>/<paramref name="prefix"/>GUID</c> and registers it for deletion.</summary>
    /// <param name="parent">An existing directory (the benchmark's --dir, EPVS_BENCH_DIR or the temp directory).</param>
    /// <param name="prefix">The start of the directory's name, saying which program made it (<c>epvs-compare-</c>).</param>
    /// <exception cref="OperationCanceledException">The process is terminating: a signal already deleted the others.</exception>
    public TemporaryDirectory(string parent, string prefix)
    {
        ArgumentNullException.ThrowIfNull(parent);
        ArgumentNullException.ThrowIfNull(prefix);
        Path = System.IO.Path.Combine(parent, prefix + Guid.NewGuid().ToString("N"));
        lock (Gate)
        {
            // Created under the lock: a signal's deletion sees either no directory (and this constructor then throws)
            // or a registered one, never one created after it ran.
            if (terminating)
            {
                throw new OperationCanceledException("The process is terminating.");
            }

            Directory.CreateDirectory(Path);
            Live.Add(this);
        }
    }

    /// <summary>The directory's full path.</summary>
    public string Path { get; }

    /// <summary>The path of <paramref name="name"/> in this directory.</summary>
    /// <param name="name">A file name.</param>
    /// <returns><c><see cref="Path"/>/<paramref name="name"/></c>.</returns>
    public string File(string name) => System.IO.Path.Combine(Path, name);

    /// <summary>Deletes the directory and what it holds; a second call does nothing. A failure is written to stderr, not thrown.</summary>
    public void Dispose()
    {
        // Interlocked.Exchange: atomicity only; whoever disposes first deletes.
        if (Interlocked.Exchange(ref disposed, 1) != 0)
        {
            return;
        }

        lock (Gate)
        {
            Live.Remove(this);
        }

        Delete(Path);
    }

    /// <summary>
    /// Call once from the program's Main: from then on SIGINT, SIGTERM and an unhandled exception delete every live
    /// directory before the process ends. A second call does nothing.
    /// </summary>
    public static void DeleteAllOnTermination()
    {
        lock (Gate)
        {
            if (Registrations.Count > 0)
            {
                return;
            }

            // The handlers run on a thread of their own while the program's threads keep running; the process
            // terminates after they return (context.Cancel stays false).
            Registrations.Add(PosixSignalRegistration.Create(PosixSignal.SIGINT, _ => DeleteAll()));
            Registrations.Add(PosixSignalRegistration.Create(PosixSignal.SIGTERM, _ => DeleteAll()));
            AppDomain.CurrentDomain.UnhandledException += (_, _) => DeleteAll();
        }
    }

    private static void DeleteAll()
    {
        lock (Gate)
        {
            terminating = true;
            foreach (TemporaryDirectory directory in Live)
            {
                Delete(directory.Path);
            }

            Live.Clear();
        }
    }

    private static void Delete(string path)
    {
        // The program's threads may still be creating files in it (a signal does not stop them). Renamed first, so that
        // they then miss it (DirectoryNotFound) instead of refilling the tree under the delete; then deleted, retrying
        // the few times a recursive delete meets a directory that is no longer empty.
        string tombstone = path + ".deleting";
        try
        {
            Directory.Move(path, tombstone);
            path = tombstone;
        }
        catch (Exception e) when (e is IOException or UnauthorizedAccessException)
        {
            // Gone already, or not movable: deleted where it is.
        }

        for (int attempt = 1; ; attempt++)
        {
            try
            {
                if (Directory.Exists(path))
                {
                    Directory.Delete(path, recursive: true);
                }

                return;
            }
            catch (Exception e) when (e is IOException or UnauthorizedAccessException)
            {
                if (attempt == 5)
                {
                    Console.Error.WriteLine($"warning: could not delete {path}: {e.Message}");
                    return;
                }
            }
        }
    }
}
