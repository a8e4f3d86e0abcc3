using System;

namespace Epvs.Persistence;

/// <summary>
/// A handle to a payload block: the block's offset from the start of the heap file. Offsets, not pointers, are what
/// persistent data stores, so a heap stays valid wherever it is mapped. <see langword="default"/> is the null reference.
/// </summary>
public readonly struct PayloadRef : IEquatable<PayloadRef>
{
    /// <summary>Creates a reference from an offset previously read from <see cref="Offset"/> (for example from a root or another payload).</summary>
    /// <param name="offset">The block's offset; 0 for null.</param>
    public PayloadRef(long offset) => Offset = offset;

    /// <summary>The null reference.</summary>
    public static PayloadRef Null => default;

    /// <summary>The offset of the block's header from the start of the heap file; 0 for null.</summary>
    public long Offset { get; }

    /// <summary>Whether this is the null reference.</summary>
    public bool IsNull => Offset == 0;

    /// <summary>Compares two references by offset.</summary>
    public static bool operator ==(PayloadRef left, PayloadRef right) => left.Offset == right.Offset;

    /// <summary>Compares two references by offset.</summary>
    public static bool operator !=(PayloadRef left, PayloadRef right) => left.Offset != right.Offset;

    /// <inheritdoc/>
    public bool Equals(PayloadRef other) => Offset == other.Offset;

    /// <inheritdoc/>
    public override bool Equals(object? obj) => obj is PayloadRef other && Equals(other);

    /// <inheritdoc/>
    public override int GetHashCode() => Offset.GetHashCode();

    /// <inheritdoc/>
    public override string ToString() => IsNull ? "PayloadRef(null)" : $"PayloadRef(0x{Offset:X})";
}
