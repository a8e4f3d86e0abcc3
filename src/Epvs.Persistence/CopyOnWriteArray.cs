using System.Threading;

namespace Epvs.Persistence;

/// <summary>Registries read without a lock: a writer (under the registry's own lock) publishes a grown copy.</summary>
internal static class CopyOnWriteArray
{
    /// <summary>Publishes a copy of <paramref name="array"/> with <paramref name="item"/> appended. Call under the lock that serializes the array's writers.</summary>
    internal static void Append<T>(ref T[] array, T item)
    {
        var grown = new T[array.Length + 1];
        array.CopyTo(grown, 0);
        grown[^1] = item;
        // Volatile.Write: release; a reader's acquire read of the array sees the initialized item.
        Volatile.Write(ref array, grown);
    }
}
