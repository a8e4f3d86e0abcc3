using System;

namespace Epvs.Samples.ResizableArray;

/// <summary>
/// A worker thread's handle on an <see cref="IResizableArray"/>, for long-running threads (the paper's EPVS-pinned
/// variant keeps epoch protection across operations and releases it only at <see cref="Refresh"/>).
/// </summary>
/// <remarks>
/// Thread-affine: open, use and dispose it on one thread. A thread holding a pinned session must call
/// <see cref="Refresh"/> regularly and must dispose the session before it blocks on anything else, or a resize
/// requested by another thread waits for it. Operations have the semantics of <see cref="IResizableArray"/>.
/// </remarks>
public interface IResizableArraySession : IDisposable
{
    /// <inheritdoc cref="IResizableArray.Read"/>
    long Read(int index);

    /// <inheritdoc cref="IResizableArray.Write"/>
    void Write(int index, long value);

    /// <inheritdoc cref="IResizableArray.Push"/>
    int Push(long value);

    /// <summary>
    /// Lets pending transitions (resizes) pass. A pinned session refreshes its epoch protection; other sessions do
    /// nothing. Call it every few dozen operations.
    /// </summary>
    void Refresh();
}
