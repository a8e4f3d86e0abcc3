namespace Epvs;

/// <summary>One protected thread in an <see cref="EpochTableSnapshot"/>.</summary>
public readonly struct EpochSlotInfo
{
    /// <summary>Creates the entry.</summary>
    /// <param name="slotIndex">Position of the slot in the table.</param>
    /// <param name="epoch">The epoch the thread announced.</param>
    /// <param name="managedThreadId">The managed thread id of the thread that claimed the slot.</param>
    public EpochSlotInfo(int slotIndex, long epoch, int managedThreadId)
    {
        SlotIndex = slotIndex;
        Epoch = epoch;
        ManagedThreadId = managedThreadId;
    }

    /// <summary>Position of the slot in the table.</summary>
    public int SlotIndex { get; }

    /// <summary>The epoch the thread announced; it holds back every action registered at this epoch or later.</summary>
    public long Epoch { get; }

    /// <summary>The managed thread id (<see cref="System.Environment.CurrentManagedThreadId"/>) of the owner.</summary>
    public int ManagedThreadId { get; }

    /// <inheritdoc/>
    public override string ToString() => $"slot {SlotIndex}: thread {ManagedThreadId} at epoch {Epoch}";
}
