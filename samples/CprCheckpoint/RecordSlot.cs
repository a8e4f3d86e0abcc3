namespace Epvs.Samples.CprCheckpoint;

/// <summary>A key's entry in the index: the newest record, swapped by CAS.</summary>
internal sealed class RecordSlot
{
    public Record? Head;
}
