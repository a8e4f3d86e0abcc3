namespace Epvs.Baselines;

/// <summary>How a <see cref="BravoReaderWriterLock"/> picks a reader's slot in its <see cref="VisibleReadersTable"/>.</summary>
public enum BravoHashing
{
    /// <summary>
    /// Hash of the thread and the lock, as in Dice &amp; Kogan 2019 (they hash the thread and the lock's address; a
    /// .NET object moves, so a per-lock id stands in for the address). A thread holding several locks uses several
    /// slots.
    /// </summary>
    ThreadAndLock,

    /// <summary>
    /// Hash of the thread alone, as in the EPVS paper's C# port (§6.2, "BRAVO uses thread identity as a key"): a
    /// thread that nests read locks of two instances on one table collides with itself and takes the slow path.
    /// </summary>
    ThreadOnly,
}
