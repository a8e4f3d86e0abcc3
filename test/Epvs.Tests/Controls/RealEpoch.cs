using System;

namespace Epvs.Tests;

public sealed class RealEpoch : IEpochUnderTest
{
    public RealEpoch(int initialTableSize = 16) => Epoch = new LightEpoch(initialTableSize);

    public LightEpoch Epoch { get; }

    public string Name => "Epvs.LightEpoch";

    public void Resume() => Epoch.Resume();

    public void Suspend() => Epoch.Suspend();

    public void Bump(Action action) => Epoch.BumpCurrentEpoch(action);

    public void Dispose() => Epoch.Dispose();
}
