using System;
using System.Diagnostics.CodeAnalysis;
using System.IO;

namespace Epvs.Persistence;

/// <summary>Throw helpers, so that hot methods stay small and inlinable.</summary>
internal static class ThrowHelper
{
    [DoesNotReturn]
    internal static void ThrowObjectDisposed(object instance) => throw new ObjectDisposedException(instance.GetType().Name);

    [DoesNotReturn]
    internal static void ThrowRangeOutsideDomain(long offset, long length, long domainLength) =>
        throw new ArgumentOutOfRangeException(nameof(offset), $"The range [{offset}, {offset}+{length}) is not inside the domain's {domainLength} bytes.");

    [DoesNotReturn]
    internal static void ThrowArgumentOutOfRange(string paramName, string message) => throw new ArgumentOutOfRangeException(paramName, message);

    [DoesNotReturn]
    internal static void ThrowInvalidOperation(string message) => throw new InvalidOperationException(message);

    [DoesNotReturn]
    internal static void ThrowInvalidOperation(string message, Exception inner) => throw new InvalidOperationException(message, inner);

    [DoesNotReturn]
    internal static void ThrowIO(string message) => throw new IOException(message);

    [DoesNotReturn]
    internal static void ThrowHeapFile(HeapFileError error, string message, Exception? inner = null) =>
        throw new HeapFileException(error, message, inner);

    [DoesNotReturn]
    internal static void ThrowHeapFull(int size, string why, string reserve) =>
        throw new InsufficientMemoryException($"The persistent heap has no free block for a {size}-byte payload and cannot grow further: {why}.{reserve}");

    /// <summary>A copy method's array that .NET cannot make (its entries, described by <paramref name="entry"/>, are a value
    /// type of 64 KiB or more): said as such, not as the runtime's <see cref="TypeLoadException"/>.</summary>
    [DoesNotReturn]
    internal static void ThrowTooLargeForArrays(string method, string entry, TypeLoadException e) =>
        throw new NotSupportedException($"{method} copies into an array, and .NET cannot make arrays of value types of 64 KiB or more (with the array entry's own fields); each entry here holds {entry}. The structure itself holds such values: read them one at a time.", e);

    [DoesNotReturn]
    internal static void ThrowInvalidPayloadRef(PayloadRef reference, string why) =>
        throw new InvalidOperationException($"{reference} is not an allocated block of this heap: {why}. A PayloadRef is valid from Allocate until Free.");
}
