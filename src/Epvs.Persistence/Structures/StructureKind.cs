using System;
using System.Buffers.Binary;
using System.IO;

namespace Epvs.Persistence;

/// <summary>
/// Which built-in structure wrote a payload, and with what key size. The structures store
/// <c>((kind | keyCode &lt;&lt; 2) &lt;&lt; 24) | typeId</c> as the payload's type id, so a structure opened over another
/// kind's payloads of the same type id (a queue over a map's data, whose payload sizes may well match), or over a map
/// written with another key size whose key and value sizes add up to the same payload size, is refused at open
/// instead of misreading them. The code holds key sizes up to 30 bytes; a structure with larger keys also keeps a
/// <em>key-size record</em>, a 4-byte payload of its own (see <see cref="RecordId"/>), written when the structure is
/// first opened and checked at every later open (the code alone read a map of 40-byte keys as one of 32-byte keys);
/// payloads without their record (a salvage dropped it) are refused (file format 8: every such structure has one).
/// </summary>
internal static class StructureKind
{
    internal const int HashMap = 1;
    internal const int ByteMap = 2;
    internal const int Queue = 3;
    internal const int TypeIdLimit = 1 << 24;

    /// <summary>
    /// The largest key type a map takes, in bytes (4 KiB). The maps pass keys by value through their calls, several frames
    /// deep, and keep them in .NET dictionaries (a byte map's index, a salvage's resolution of duplicates): keys of 60 KiB
    /// overflowed a 1 MiB thread stack in <c>SetMany</c> (the process died), and .NET refuses dictionary entries of 64 KiB.
    /// </summary>
    internal const int MaxKeySize = 4 * 1024;

    /// <summary>Refuses a map's key type larger than <see cref="MaxKeySize"/>, before the map reads or writes anything.</summary>
    /// <exception cref="NotSupportedException">The key type is larger.</exception>
    internal static void RefuseHugeKeys(Type keyType, int keySize)
    {
        if (keySize > MaxKeySize)
        {
            throw new NotSupportedException($"A map's key type may take at most {MaxKeySize} bytes; {keyType.Name} takes {keySize}. The maps pass keys by value (on the thread's stack) and keep them in .NET dictionaries: use a smaller key (a hash or an id of the large one), with the large data in the value.");
        }
    }

    /// <summary>Key sizes below this are recorded exactly in the code; this value stands for every larger one, whose exact size the key-size record holds.</summary>
    private const int MaxKeyCode = 31;

    /// <summary>
    /// The type id of the key-size record of the structure stored as <paramref name="stored"/>: the stored id with the
    /// sign bit set, which no structure's payloads carry (their stored ids are positive).
    /// </summary>
    internal static int RecordId(int stored) => stored | int.MinValue;

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
    internal static int Claim(BufferedDurableHeap heap, in DurableOperation op, int kind, int typeId, int keySize)
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

        if (keySize < MaxKeyCode || (heap.Faults & DurabilityFaults.SkipKeySizeRecord) != 0)
        {
            heap.ReserveStructureTypeId(typeId);
            return stored;
        }

        // Checked before the type id is taken, so that a refused open leaves the heap as it was.
        RecoveredPayload[] records = heap.PeekRecoveredPayloads(RecordId(stored));
        foreach (RecoveredPayload record in records)
        {
            int recorded = RecordedKeySize(heap, record);
            if (recorded != keySize)
            {
                throw new InvalidDataException($"Type id {typeId} on this heap holds a {Name(kind)} written with keys of {recorded} bytes, but this one's keys are {keySize} bytes: open it with the key type it was written with (payloads of the same size would otherwise be misread).");
            }
        }

        if (records.Length == 0 && heap.HasRecoveredPayloads(stored))
        {
            // Every structure with such keys wrote its record (format 8) in the version it was first opened in, before
            // any payload of its own: payloads without it mean the record was lost (a damaged block a salvage dropped,
            // say). Opened with whatever key type the caller names, they would be misread, and the record written
            // now would lock that misreading in.
            throw new InvalidDataException($"Type id {typeId} on this heap holds a {Name(kind)} whose key-size record is missing (damaged and dropped by a salvage, or lost with a stale page): the key size its payloads were written with ({MaxKeyCode} bytes or more) cannot be checked against this one's {keySize} bytes, and a wrong one would misread every entry. Restore the file from a copy, or read the payloads raw (BufferedDurableHeap.TakeRecoveredPayloads).");
        }

        heap.ReserveStructureTypeId(typeId);
        if (records.Length == 0 && heap.MayWriteIn(op.Version))
        {
            // First open: the key size is recorded in this open's version, before any payload of the structure, so no
            // payload of it can be durable without the record.
            PayloadRef record;
            try
            {
                record = op.AllocateTyped(sizeof(int), RecordId(stored));
            }
            catch when ((heap.Faults & DurabilityFaults.KeepTypeIdOfAFailedOpen) == 0)
            {
                // Nothing was written or taken (a full heap, say): the open leaves the heap as it was, and can be retried.
                // The type id stayed reserved before, so every retry in the heap's session was refused as a second open.
                heap.ReleaseStructureTypeId(typeId);
                throw;
            }

            BinaryPrimitives.WriteInt32LittleEndian(op.GetPayload(record), keySize);
        }

        // The records checked above (none on a first open), taken once the open can no longer fail here: this type id's
        // structure owns them.
        heap.TakeRecoveredPayloads(RecordId(stored));
        return stored;
    }

    /// <summary>The key size a recovered key-size record holds (a record of another size is refused as not a structure's).</summary>
    private static int RecordedKeySize(BufferedDurableHeap heap, RecoveredPayload record)
    {
        Span<byte> bytes = heap.PayloadUnchecked(record.Block.Offset);
        if (bytes.Length != sizeof(int))
        {
            throw new InvalidDataException($"The key-size record at file offset {record.Block.Offset} holds {bytes.Length} bytes, not 4: the heap is not as a structure left it.");
        }

        return BinaryPrimitives.ReadInt32LittleEndian(bytes);
    }

    private static string KeySize(int code) => code == MaxKeyCode ? $"{MaxKeyCode} bytes or more" : code == 1 ? "1 byte" : $"{code} bytes";

    private static string Name(int kind) => kind switch
    {
        HashMap => "PersistentHashMap",
        ByteMap => "PersistentByteMap",
        _ => "PersistentQueue",
    };
}
