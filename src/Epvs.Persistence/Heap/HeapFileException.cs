using System;
using System.IO;

namespace Epvs.Persistence;

/// <summary>A heap file could not be created or opened; the file was left as it was.</summary>
public sealed class HeapFileException : IOException
{
    /// <summary>Creates the exception.</summary>
    /// <param name="error">What went wrong.</param>
    /// <param name="message">What went wrong and what to do, including the path.</param>
    /// <param name="innerException">The underlying failure, if any.</param>
    public HeapFileException(HeapFileError error, string message, Exception? innerException = null)
        : base(message, innerException) => Error = error;

    /// <summary>What went wrong.</summary>
    public HeapFileError Error { get; }
}
