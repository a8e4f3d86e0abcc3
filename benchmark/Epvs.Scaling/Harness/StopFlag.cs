using System.Threading;

namespace Epvs.Scaling.Harness;

/// <summary>Tells workers to stop; read once per small batch of operations.</summary>
public sealed class StopFlag
{
    private int value;

    /// <summary>Whether the workers should stop (acquire; pairs with <see cref="Set"/>).</summary>
    public bool IsSet => Volatile.Read(ref value) != 0;

    /// <summary>Asks the workers to stop (release).</summary>
    public void Set() => Volatile.Write(ref value, 1);
}
