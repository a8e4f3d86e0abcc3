namespace Epvs.Samples.ResizableArray;

/// <summary>The outcome of one <see cref="ResizableArrayThroughput.Run"/>.</summary>
/// <param name="Name">The variant's name.</param>
/// <param name="Threads">Worker threads.</param>
/// <param name="Operations">Operations completed by all workers.</param>
/// <param name="Seconds">Wall time of the measured phase.</param>
/// <param name="FinalCount">The array's <see cref="IResizableArray.Count"/> afterwards.</param>
/// <param name="FinalCapacity">The array's capacity afterwards (grows with the pushes).</param>
public sealed record ThroughputResult(string Name, int Threads, long Operations, double Seconds, int FinalCount, int FinalCapacity)
{
    /// <summary>Operations per second, in millions.</summary>
    public double MillionOpsPerSecond => Seconds > 0 ? Operations / Seconds / 1e6 : 0;
}
