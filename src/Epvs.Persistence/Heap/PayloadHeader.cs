namespace Epvs.Persistence;

/// <summary>The persistent header of a payload block (DESIGN §4): identity, epoch tag, kind, size and type.</summary>
public readonly struct PayloadHeader
{
    /// <summary>Creates a header value.</summary>
    /// <param name="uid">The payload's logical identity.</param>
    /// <param name="epochTag">The EPVS version the payload belongs to.</param>
    /// <param name="kind">Alloc, update or delete (anti-payload).</param>
    /// <param name="size">The payload's size in bytes.</param>
    /// <param name="typeId">An application-defined type id.</param>
    public PayloadHeader(long uid, long epochTag, PayloadKind kind, int size, int typeId)
    {
        Uid = uid;
        EpochTag = epochTag;
        Kind = kind;
        Size = size;
        TypeId = typeId;
    }

    /// <summary>The payload's logical identity, shared by its update copies and its anti-payload.</summary>
    public long Uid { get; }

    /// <summary>The EPVS version the payload was written in (0 when the heap is used without epochs).</summary>
    public long EpochTag { get; }

    /// <summary>Alloc, update or delete (anti-payload).</summary>
    public PayloadKind Kind { get; }

    /// <summary>The payload's size in bytes (the block may be larger).</summary>
    public int Size { get; }

    /// <summary>An application-defined type id.</summary>
    public int TypeId { get; }

    /// <inheritdoc/>
    public override string ToString() => $"uid={Uid} epoch={EpochTag} kind={Kind} size={Size} type={TypeId}";
}
