using System;
using System.Diagnostics.CodeAnalysis;

namespace Epvs.Samples.ResizableArray;

/// <summary>Throw helpers shared by the variants, so the hot paths stay small.</summary>
internal static class ArrayErrors
{
    [DoesNotReturn]
    public static void IndexOutOfRange(int index, int count) =>
        throw new ArgumentOutOfRangeException(nameof(index), index, $"The index must be between 0 and Count - 1 ({count - 1}).");

    [DoesNotReturn]
    public static void PushInFlight(int index) =>
        throw new ArgumentOutOfRangeException(nameof(index), index, "The push of this index has not reached the array yet; write only indices whose Push has returned.");

    /// <summary>The smallest power-of-two multiple of <paramref name="length"/> that holds index
    /// <paramref name="count"/> - 1, and at least twice <paramref name="length"/>.</summary>
    public static int GrownLength(int length, int count)
    {
        long grown = Math.Max(1, (long)length) * 2;
        while (grown < count)
            grown *= 2;
        if (grown > Array.MaxLength)
            throw new InvalidOperationException($"The array cannot grow beyond {Array.MaxLength} elements.");
        return (int)grown;
    }
}
