using System;
using System.IO;

namespace Epvs.Samples.CprCheckpoint;

/// <summary>A checkpoint file that cannot be trusted: wrong magic or format, truncated, or failing its checksum.</summary>
public sealed class CorruptCheckpointException : IOException
{
    /// <summary>Creates the exception.</summary>
    /// <param name="path">The file.</param>
    /// <param name="reason">What is wrong with it.</param>
    public CorruptCheckpointException(string path, string reason)
        : base($"Checkpoint file '{path}' is unusable: {reason}.")
    {
        Path = path;
        Reason = reason;
    }

    /// <summary>The file.</summary>
    public string Path { get; }

    /// <summary>What is wrong with it.</summary>
    public string Reason { get; }
}
