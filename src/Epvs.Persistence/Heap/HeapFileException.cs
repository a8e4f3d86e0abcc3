using System;
using System.Collections.Generic;
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

    internal HeapFileException(HeapFileError error, string message, IReadOnlyList<long> damagedBlocks)
        : base(message) => (Error, DamagedBlocks) = (error, damagedBlocks);

    /// <summary>What went wrong.</summary>
    public HeapFileError Error { get; }

    /// <summary>
    /// With <see cref="HeapFileError.Corrupt"/> from a recovery that found damaged blocks: their file offsets, sorted
    /// (open with <see cref="PersistentHeapOptions.SalvageDamagedBlocks"/> or
    /// <see cref="BufferedDurableHeapOptions.SalvageDamagedBlocks"/> to drop them). Empty otherwise.
    /// </summary>
    public IReadOnlyList<long> DamagedBlocks { get; } = Array.Empty<long>();
}
