using System;
using System.IO;

namespace Epvs.Persistence;

/// <summary>
/// Which built-in structure wrote a payload. The structures store <c>(kind &lt;&lt; 24) | typeId</c> as the payload's
/// type id, so a structure opened over another kind's payloads of the same type id (a queue over a map's data, whose
/// payload sizes may well match) is refused at open instead of misreading them.
/// </summary>
internal static class StructureKind
{
    internal const int HashMap = 1;
    internal const int ByteMap = 2;
    internal const int Queue = 3;
    internal const int TypeIdLimit = 1 << 24;

    /// <summary>The stored type id of structure <paramref name="kind"/> with the user's <paramref name="typeId"/>.</summary>
    internal static int Encode(int kind, int typeId)
    {
        if ((uint)typeId >= TypeIdLimit)
        {
            ThrowHelper.ThrowArgumentOutOfRange(nameof(typeId), $"A structure's type id must be in [0, {TypeIdLimit}); {typeId} is not (the high bits record the structure's kind).");
        }

        return (kind << 24) | typeId;
    }

    /// <summary>The stored type id for a structure of <paramref name="kind"/> opening on <paramref name="heap"/>, after <see cref="CheckNoOtherKind"/>.</summary>
    internal static int Claim(BufferedDurableHeap heap, int kind, int typeId)
    {
        int stored = Encode(kind, typeId);
        CheckNoOtherKind(heap, kind, typeId);
        return stored;
    }

    /// <summary>Refuses to open structure <paramref name="kind"/> when the heap holds another kind's payloads of the same type id.</summary>
    internal static void CheckNoOtherKind(BufferedDurableHeap heap, int kind, int typeId)
    {
        foreach (int other in new[] { HashMap, ByteMap, Queue })
        {
            if (other != kind && heap.HasRecoveredPayloads(Encode(other, typeId)))
            {
                throw new InvalidDataException($"Type id {typeId} on this heap holds the payloads of a {Name(other)}, not of a {Name(kind)}: open it as a {Name(other)}, or give this structure a type id of its own.");
            }
        }
    }

    private static string Name(int kind) => kind switch
    {
        HashMap => "PersistentHashMap",
        ByteMap => "PersistentByteMap",
        _ => "PersistentQueue",
    };
}
