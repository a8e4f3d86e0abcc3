using System;
using System.IO;

namespace Epvs.Persistence;

/// <summary>
/// Which built-in structure wrote a payload, and with what key size. The structures store
/// <c>((kind | keyCode &lt;&lt; 2) &lt;&lt; 24) | typeId</c> as the payload's type id, so a structure opened over another
/// kind's payloads of the same type id (a queue over a map's data, whose payload sizes may well match), or over a map
/// written with another key size whose key and value sizes add up to the same payload size, is refused at open
/// instead of misreading them.
/// </summary>
internal static class StructureKind
{
    internal const int HashMap = 1;
    internal const int ByteMap = 2;
    internal const int Queue = 3;
    internal const int TypeIdLimit = 1 << 24;

    /// <summary>Key sizes up to this are recorded exactly; larger ones all record this value.</summary>
    private const int MaxKeyCode = 31;

    /// <summary>The stored type id of structure <paramref name="kind"/> with the user's <paramref name="typeId"/> and key size.</summary>
    internal static int Encode(int kind, int typeId, int keySize)
    {
        if ((uint)typeId >= TypeIdLimit)
        {
            ThrowHelper.ThrowArgumentOutOfRange(nameof(typeId), $"A structure's type id must be in [0, {TypeIdLimit}); {typeId} is not (the high bits record the structure's kind and key size).");
        }

        // At most 7 bits above the user's 24: the stored id stays a positive int.
        return ((kind | (Math.Min(keySize, MaxKeyCode) << 2)) << 24) | typeId;
    }

    /// <summary>
    /// The stored type id for a structure of <paramref name="kind"/> with keys of <paramref name="keySize"/> bytes (0
    /// for a queue) opening on <paramref name="heap"/>: refused if the heap holds payloads of this type id written by
    /// another kind of structure or with another key size.
    /// </summary>
    /// <exception cref="InvalidDataException">The type id's payloads on the heap are another structure's, or were written with another key size.</exception>
    /// <exception cref="InvalidOperationException">A structure with this type id was already opened on the heap (of any kind or key size).</exception>
    internal static int Claim(BufferedDurableHeap heap, int kind, int typeId, int keySize)
    {
        int stored = Encode(kind, typeId, keySize);
        foreach (int other in new[] { HashMap, ByteMap, Queue })
        {
            for (int code = 0; code <= MaxKeyCode; code++)
            {
                int candidate = Encode(other, typeId, code);
                if (candidate == stored || !heap.HasRecoveredPayloads(candidate))
                {
                    continue;
                }

                if (other != kind)
                {
                    throw new InvalidDataException($"Type id {typeId} on this heap holds the payloads of a {Name(other)}, not of a {Name(kind)}: open it as a {Name(other)}, or give this structure a type id of its own.");
                }

                throw new InvalidDataException($"Type id {typeId} on this heap holds a {Name(kind)} written with keys of {KeySize(code)}, but this one's keys are {KeySize(Math.Min(keySize, MaxKeyCode))}: open it with the key type it was written with (payloads of the same size would otherwise be misread).");
            }
        }

        heap.ReserveStructureTypeId(typeId);
        return stored;
    }

    private static string KeySize(int code) => code == MaxKeyCode ? $"{MaxKeyCode} bytes or more" : code == 1 ? "1 byte" : $"{code} bytes";

    private static string Name(int kind) => kind switch
    {
        HashMap => "PersistentHashMap",
        ByteMap => "PersistentByteMap",
        _ => "PersistentQueue",
    };
}
