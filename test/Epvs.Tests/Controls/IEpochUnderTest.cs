using System;

namespace Epvs.Tests;

/// <summary>What the epoch-level checkers drive: the real <see cref="LightEpoch"/> or a broken control.</summary>
public interface IEpochUnderTest : IDisposable
{
    string Name { get; }

    void Resume();

    void Suspend();

    /// <summary>Registers <paramref name="action"/> to run once every thread protected now has left.</summary>
    void Bump(Action action);
}
