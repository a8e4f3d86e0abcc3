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

    /// <summary>
    /// The epoch the thread announced; it holds back every action registered at this epoch or later. For a thread
    /// stepped aside (<see cref="IsSteppedAside"/>): <see cref="long.MaxValue"/> − 1, above every epoch (it holds nothing back).
    /// </summary>
    public long Epoch { get; }

    /// <summary>
    /// Whether the thread has stepped aside inside an <see cref="EpochProtectedVersionScheme.Refresh"/> while a transition
    /// waits for other threads: it holds nothing back, but keeps its slot (so <see cref="LightEpoch.Dispose"/> counts it)
    /// and takes its region up again when the transition is done.
    /// </summary>
    public bool IsSteppedAside => Epoch == EpochSlotTable.ParkedMarker;

    /// <summary>The managed thread id (<see cref="System.Environment.CurrentManagedThreadId"/>) of the owner.</summary>
    public int ManagedThreadId { get; }

    /// <inheritdoc/>
    public override string ToString() => IsSteppedAside
        ? $"slot {SlotIndex}: thread {ManagedThreadId} stepped aside in Refresh (waiting for a transition; holds nothing back)"
        : $"slot {SlotIndex}: thread {ManagedThreadId} at epoch {Epoch}";
}
