using System;
using System.Threading;

namespace Epvs.Persistence.Tests;

/// <summary>A key Equal by <see cref="Value"/> only (the tag is other bytes of an Equal key); its GetHashCode and Equals
/// throw at the N-th call on this thread (<see cref="HashThrowAt"/>, <see cref="EqualsThrowAt"/>) or with a
/// per-thread probability (<see cref="ThrowPerMille"/>).</summary>
internal readonly struct ProbeKey : IEquatable<ProbeKey>
{
    [ThreadStatic] internal static int HashThrowAt;
    [ThreadStatic] internal static int EqualsThrowAt;
    [ThreadStatic] internal static int ThrowPerMille;
    [ThreadStatic] private static Random? _random;

    internal readonly long Value;
    internal readonly long Tag;

    internal ProbeKey(long value, long tag = 0)
    {
        Value = value;
        Tag = tag;
    }

    private static void MaybeThrow(ref int at, string what)
    {
        if (at > 0 && --at == 0)
        {
            throw new ProbeKeyException(what);
        }

        if (ThrowPerMille > 0 && (_random ??= new Random(Environment.CurrentManagedThreadId * 7919)).Next(1000) < ThrowPerMille)
        {
            throw new ProbeKeyException(what);
        }
    }

    public bool Equals(ProbeKey other)
    {
        MaybeThrow(ref EqualsThrowAt, "Equals");
        return Value == other.Value;
    }

    public override bool Equals(object? obj) => obj is ProbeKey k && Equals(k);

    public override int GetHashCode()
    {
        MaybeThrow(ref HashThrowAt, "GetHashCode");
        // Few buckets: Equals is called on collisions too.
        return (int)(Value % 61);
    }

    public override string ToString() => $"{Value}/{Tag}";
}

internal sealed class ProbeKeyException : Exception
{
    public ProbeKeyException(string what) : base("probe key " + what) { }
}

/// <summary>A key with padding: a byte then a long (7 padding bytes); Equal by its fields.</summary>
internal readonly record struct PaddedKey(byte Small, long Large);
