namespace Epvs.Samples.CprCheckpoint;

/// <summary>The de-duplication entry of one client: the highest sequence number applied. Written by the client's
/// session inside protected regions; read by checkpoints in their critical section.</summary>
internal sealed class ClientState
{
    public ClientState(long clientId, long lastSequenceNumber)
    {
        ClientId = clientId;
        LastSequenceNumber = lastSequenceNumber;
    }

    public long ClientId { get; }

    public long LastSequenceNumber;

    /// <summary>Whether a session is open for the client (one at a time).</summary>
    public int InUse;
}
