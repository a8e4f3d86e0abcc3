namespace Epvs.Persistence;

/// <summary>A payload that survived recovery: the newest durable copy of its uid, within the durable frontier.</summary>
public readonly struct RecoveredPayload
{
    /// <summary>Creates a value.</summary>
    /// <param name="block">The block.</param>
    /// <param name="header">Its header.</param>
    public RecoveredPayload(PayloadRef block, PayloadHeader header)
    {
        Block = block;
        Header = header;
    }

    /// <summary>The block holding the payload.</summary>
    public PayloadRef Block { get; }

    /// <summary>The block's header (uid, epoch tag, kind, size, type id).</summary>
    public PayloadHeader Header { get; }
}
