using System;

namespace Epvs.Tests;

/// <summary>
/// What the concurrency checkers drive: the real <see cref="EpochProtectedVersionScheme"/>, FASTER.core's, or a
/// deliberately broken control. Each checker is shown to catch its control before its pass on the real scheme counts.
/// </summary>
public interface ISchemeUnderTest : IDisposable
{
    string Name { get; }

    /// <summary>Version observed by Enter; holds until Leave.</summary>
    long Enter();

    long Refresh();

    void Leave();

    long CurrentVersion { get; }

    /// <summary>Non-blocking request: true if this call started a transition to <paramref name="targetVersion"/>.</summary>
    bool TryAdvance(Action<long, long> criticalSection, long targetVersion);

    /// <summary>Runs any pending deferred work the implementation allows without leaving (FASTER's BumpCurrentEpoch).</summary>
    void Poke();
}
