using System;
using System.Runtime.CompilerServices;

namespace Epvs;

/// <summary>
/// The state of an <see cref="EpochProtectedVersionScheme"/>: one 64-bit word holding an 8-bit phase (whose top
/// bit marks the intermediate state of a transition in progress) and a 56-bit version.
/// </summary>
public readonly struct VersionSchemeState : IEquatable<VersionSchemeState>
{
    /// <summary>The phase of a scheme at rest (no state machine in a special phase).</summary>
    public const byte Rest = 0;

    /// <summary>FASTER.core's name for <see cref="Rest"/>.</summary>
    [System.Obsolete("FASTER.core's name; use VersionSchemeState.Rest.")]
    public const byte REST = Rest;

    /// <summary>The largest representable version.</summary>
    public const long MaxVersion = (1L << VersionBits) - 1;

    internal const byte IntermediateBit = 0x80;
    private const int VersionBits = 56;
    internal const long IntermediateMask = (long)IntermediateBit << VersionBits;

    internal readonly long Word;

    internal VersionSchemeState(long word) => Word = word;

    /// <summary>The phase: <see cref="Rest"/> or a state machine's own phase; values of 128 and above are the
    /// intermediate form of a phase.</summary>
    public byte Phase
    {
        [MethodImpl(MethodImplOptions.AggressiveInlining)]
        get => (byte)((ulong)Word >> VersionBits);
    }

    /// <summary>The version.</summary>
    public long Version
    {
        [MethodImpl(MethodImplOptions.AggressiveInlining)]
        get => Word & MaxVersion;
    }

    /// <summary>Whether a transition out of this state is in progress (its critical section pending or running).</summary>
    public bool IsIntermediate
    {
        [MethodImpl(MethodImplOptions.AggressiveInlining)]
        get => (Word & IntermediateMask) != 0;
    }

    /// <summary>Makes a state from a phase and a version.</summary>
    /// <param name="phase">The phase; 0 (<see cref="Rest"/>) to 127 for states a machine may enter.</param>
    /// <param name="version">The version, 0 to <see cref="MaxVersion"/>.</param>
    /// <exception cref="ArgumentOutOfRangeException"><paramref name="version"/> is negative or above
    /// <see cref="MaxVersion"/>.</exception>
    public static VersionSchemeState Make(byte phase, long version)
    {
        if ((ulong)version > MaxVersion)
            ThrowHelper.ThrowArgumentOutOfRange(nameof(version), $"A version must be between 0 and {MaxVersion}.");
        return new VersionSchemeState(((long)phase << VersionBits) | version);
    }

    /// <summary>The intermediate form of <paramref name="state"/>.</summary>
    internal static VersionSchemeState MakeIntermediate(VersionSchemeState state) => new(state.Word | IntermediateMask);

    /// <summary>The state a transition started from, given its intermediate form.</summary>
    internal VersionSchemeState WithoutIntermediate() => new(Word & ~IntermediateMask);

    /// <inheritdoc/>
    public bool Equals(VersionSchemeState other) => Word == other.Word;

    /// <inheritdoc/>
    public override bool Equals(object? obj) => obj is VersionSchemeState other && Equals(other);

    /// <inheritdoc/>
    public override int GetHashCode() => Word.GetHashCode();

    /// <summary>Whether two states are equal.</summary>
    public static bool operator ==(VersionSchemeState left, VersionSchemeState right) => left.Word == right.Word;

    /// <summary>Whether two states differ.</summary>
    public static bool operator !=(VersionSchemeState left, VersionSchemeState right) => left.Word != right.Word;

    /// <inheritdoc/>
    public override string ToString() => IsIntermediate
        ? $"[{Phase & ~IntermediateBit}*,{Version}]"
        : $"[{Phase},{Version}]";
}
