using System;

namespace Epvs.Samples.ResizableArray;

/// <summary>
/// The resizable array of the paper's §2.1: a growable array of 64-bit values shared by many threads, with
/// <see cref="Count"/>, <see cref="Read"/>, <see cref="Write"/> and <see cref="Push"/>. Every variant the paper
/// measures (simple EPVS, two-phase EPVS, EPVS-pinned, a reader–writer latch, a latch-free mock) implements this
/// interface, so one harness can drive them all.
/// </summary>
/// <remarks>
/// <para><b>Driving it from a benchmark harness.</b> Create the array with
/// <see cref="ResizableArrayFactory.Create"/> (or a variant's constructor) and an initial capacity, then let each
/// worker thread call <see cref="OpenSession"/> once, run its operations on the session, call
/// <see cref="IResizableArraySession.Refresh"/> every few dozen operations, and dispose the session on the same
/// thread before it blocks on anything (a barrier, a join). For every variant except EPVS-pinned a session simply
/// forwards to the array and <see cref="IResizableArraySession.Refresh"/> does nothing; for EPVS-pinned the session
/// holds epoch protection between operations, which is what makes that variant fast and why it must refresh.</para>
/// <para><b>Contract.</b> All members are thread-safe. Indices are those returned by <see cref="Push"/>: an index may
/// be read or written once its <see cref="Push"/> has returned (on any thread that has seen the index). A
/// <see cref="Read"/> of an index whose push is still in flight returns 0 or the pushed value; a
/// <see cref="Write"/> to such an index is not supported (it may be lost, or throw). No push is lost, no write to a
/// published index is lost, and a read returns a value that was pushed to or written to that very index.</para>
/// <para>Values are <see cref="long"/> so that the element is one atomic word (the paper's 8-byte references).</para>
/// </remarks>
public interface IResizableArray : IDisposable
{
    /// <summary>A short name for tables and plots, such as "simple-EPVS".</summary>
    string Name { get; }

    /// <summary>
    /// The number of slots handed out by <see cref="Push"/>, including pushes still in flight (the paper's
    /// <c>Count()</c>). Never decreases.
    /// </summary>
    int Count { get; }

    /// <summary>The length of the backing array right now; informational (it changes as the array grows).</summary>
    int Capacity { get; }

    /// <summary>Reads the value at <paramref name="index"/>.</summary>
    /// <param name="index">0 ≤ index &lt; <see cref="Count"/>.</param>
    /// <returns>The latest value pushed to or written to the index (0 while its push is in flight).</returns>
    /// <exception cref="ArgumentOutOfRangeException"><paramref name="index"/> is negative or not below
    /// <see cref="Count"/>.</exception>
    long Read(int index);

    /// <summary>Writes <paramref name="value"/> at <paramref name="index"/>, whose push has returned.</summary>
    /// <param name="index">An index returned by <see cref="Push"/>.</param>
    /// <param name="value">The value.</param>
    /// <exception cref="ArgumentOutOfRangeException"><paramref name="index"/> is negative, not below
    /// <see cref="Count"/>, or its push has not reached the backing array yet.</exception>
    void Write(int index, long value);

    /// <summary>Appends <paramref name="value"/>, growing the array if it is full.</summary>
    /// <param name="value">The value.</param>
    /// <returns>The index the value was stored at; readable by every thread once this returns.</returns>
    /// <exception cref="InvalidOperationException">The array cannot grow (only the latch-free mock, past its
    /// preallocated capacity).</exception>
    int Push(long value);

    /// <summary>
    /// Opens a per-thread session for a worker that performs many operations. Use it on the opening thread only and
    /// dispose it on that thread.
    /// </summary>
    /// <returns>The session.</returns>
    IResizableArraySession OpenSession();
}
