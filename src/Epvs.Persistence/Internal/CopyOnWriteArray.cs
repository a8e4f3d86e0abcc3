using System;
using System.Collections.Generic;
using System.Threading;

namespace Epvs.Persistence;

/// <summary>
/// Registries read without a lock (the thread caches of a heap, the thread buffers of a buffered heap): a writer, under
/// the registry's own lock, publishes a changed copy.
/// </summary>
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

    /// <summary>
    /// Publishes a copy of <paramref name="array"/> without the items <paramref name="match"/> picks, if it picks any.
    /// Call under the lock that serializes the array's writers.
    /// </summary>
    /// <returns>The items removed, in their order; null when none was.</returns>
    internal static List<T>? RemoveAll<T>(ref T[] array, Predicate<T> match)
    {
        List<T>? removed = null;
        List<T>? kept = null;
        for (int i = 0; i < array.Length; i++)
        {
            T item = array[i];
            if (match(item))
            {
                if (removed is null)
                {
                    removed = new List<T>();
                    kept = new List<T>(array.Length);
                    kept.AddRange(array.AsSpan(0, i));
                }

                removed.Add(item);
            }
            else
            {
                kept?.Add(item);
            }
        }

        if (kept is not null)
        {
            // Volatile.Write: release; as in Append (the kept items were initialized when first published).
            Volatile.Write(ref array, kept.ToArray());
        }

        return removed;
    }
}
