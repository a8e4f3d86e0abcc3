using System;

namespace Epvs.Persistence.Tests;

/// <summary>Deterministic payload contents derived from a block's uid (and a salt), so any overlap or tear is visible.</summary>
internal static class Stamp
{
    internal static void Write(Span<byte> payload, long uid, long salt = 0)
    {
        for (int i = 0; i < payload.Length; i++)
        {
            payload[i] = Byte(uid, salt, i);
        }
    }

    internal static bool Matches(ReadOnlySpan<byte> payload, long uid, long salt = 0)
    {
        for (int i = 0; i < payload.Length; i++)
        {
            if (payload[i] != Byte(uid, salt, i))
            {
                return false;
            }
        }

        return true;
    }

    private static byte Byte(long uid, long salt, int i) => (byte)((uid * 131) + (salt * 17) + (i * 7) + (i >> 8));
}
