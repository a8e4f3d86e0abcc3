using System;
using System.Diagnostics.CodeAnalysis;
using System.Runtime.CompilerServices;

namespace Epvs;

/// <summary>
/// Cold-path throws, kept out of line so the hot paths that call them stay small enough to inline.
/// </summary>
internal static class ThrowHelper
{
    [DoesNotReturn, MethodImpl(MethodImplOptions.NoInlining)]
    public static void ThrowArgumentNull(string paramName) => throw new ArgumentNullException(paramName);

    [DoesNotReturn, MethodImpl(MethodImplOptions.NoInlining)]
    public static void ThrowArgumentOutOfRange(string paramName, string message) =>
        throw new ArgumentOutOfRangeException(paramName, message);

    [DoesNotReturn, MethodImpl(MethodImplOptions.NoInlining)]
    public static void ThrowObjectDisposed(string typeName) =>
        throw new ObjectDisposedException(typeName, $"This {typeName} has been disposed; create a new instance instead of reusing it.");

    [DoesNotReturn, MethodImpl(MethodImplOptions.NoInlining)]
    public static void ThrowEpochDisposed(string objectName) =>
        throw new ObjectDisposedException(
            objectName,
            "The LightEpoch under this EpochProtectedVersionScheme has been disposed, so no transition can run on it (no " +
            "region can be protected to exclude it). Create a new epoch and scheme instead of reusing them.");

    [DoesNotReturn, MethodImpl(MethodImplOptions.NoInlining)]
    public static void ThrowInvalidOperation(string message) => throw new InvalidOperationException(message);

    [DoesNotReturn, MethodImpl(MethodImplOptions.NoInlining)]
    public static void ThrowNotProtected(string operation) =>
        throw new InvalidOperationException(
            $"{operation} was called on a thread that is not protected by this epoch. Call it only between Resume()/Enter() " +
            "and the matching Suspend()/Leave(), on the same thread: protection belongs to a thread, so do not await or " +
            "switch threads inside a protected region.");
}
