using System;
using System.Globalization;

namespace Epvs.Samples.PersistentKv;

/// <summary>One logged operation: a write (value number n) or delete (n = -1) of a key, in a version, by a writer thread.</summary>
internal readonly record struct KvOp(int Thread, long Version, long Key, int N)
{
    internal string Format() => string.Create(CultureInfo.InvariantCulture, $"op {Thread} {Version} {Key} {N} .");

    internal static bool TryParse(string line, out KvOp op)
    {
        string[] f = line.Split(' ');
        if (f.Length == 6 && f[0] == "op" && f[5] == ".")
        {
            op = new KvOp(int.Parse(f[1], CultureInfo.InvariantCulture), long.Parse(f[2], CultureInfo.InvariantCulture), long.Parse(f[3], CultureInfo.InvariantCulture), int.Parse(f[4], CultureInfo.InvariantCulture));
            return true;
        }

        op = default;
        return false;
    }

    /// <summary>The value of a key's n-th write: 64 to 255 bytes derived from key and n, so any mix-up is visible.</summary>
    internal static byte[] ValueFor(long key, int n)
    {
        var value = new byte[64 + (int)(((key * 7) + (n * 13)) % 192)];
        for (int i = 0; i < value.Length; i++)
        {
            value[i] = (byte)((key * 131) + (n * 17) + (i * 7));
        }

        return value;
    }
}
