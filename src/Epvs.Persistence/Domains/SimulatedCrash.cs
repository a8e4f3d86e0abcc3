using System;

namespace Epvs.Persistence;

/// <summary>A durable image captured by <see cref="SimulatedPersistenceDomain"/> at an armed crash point.</summary>
public sealed class SimulatedCrash
{
    internal SimulatedCrash(long point, int seed, byte[] image)
    {
        Point = point;
        Seed = seed;
        Image = image;
    }

    /// <summary>The crash point: the image is the state just before the write-back or fence with this index took effect.</summary>
    public long Point { get; }

    /// <summary>The seed that chose which unfenced write-backs and dirty words reached the image.</summary>
    public int Seed { get; }

    /// <summary>What the medium holds after the crash; open it with <see cref="SimulatedPersistenceDomain.FromImage(ReadOnlySpan{byte}, long)"/>.</summary>
    public byte[] Image { get; }
}
