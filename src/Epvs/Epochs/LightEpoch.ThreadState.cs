using System;
using System.Collections.Generic;
using System.Runtime.CompilerServices;
using System.Threading;

namespace Epvs;

public sealed partial class LightEpoch
{
    /// <summary>
    /// What one thread knows about its protection by one <see cref="LightEpoch"/>: how deeply it is nested
    /// and which slot it announced in. Only the owning thread reads or writes a record.
    /// </summary>
    private struct ThreadRecord
    {
        /// <summary>The <see cref="token"/> of the epoch this record belongs to; a stale record (an id reused
        /// after its epoch was disposed) has another token and counts as empty.</summary>
        public long Token;
        /// <summary>The segment array holding this thread's slot: the last one used, kept as a hint while
        /// unprotected so the next outermost Resume usually claims the same, uncontended cache line.</summary>
        public EpochSlot[]? Slots;
        public int Index;
        /// <summary>Nesting depth; 0 when not protected.</summary>
        public int Depth;
    }

    /// <summary>Per-thread records, indexed by <see cref="id"/>. Thread-static access is a few instructions on
    /// .NET 8+, which is what keeps the outermost Resume at one interlocked operation plus a handful of loads.</summary>
    [ThreadStatic] private static ThreadRecord[]? t_records;

    private static long s_nextToken;
    private static readonly Stack<int> s_freeIds = new();
    private static int s_nextId;

    private static int AllocateId()
    {
        lock (s_freeIds)
            return s_freeIds.Count > 0 ? s_freeIds.Pop() : s_nextId++;
    }

    private static void ReleaseId(int id)
    {
        lock (s_freeIds)
            s_freeIds.Push(id);
    }

    /// <summary>This thread's record for this epoch, created (or reset, if stale) on first use.</summary>
    [MethodImpl(MethodImplOptions.NoInlining)]
    private ref ThreadRecord GetOrCreateRecord()
    {
        ThreadRecord[]? records = t_records;
        if (records is null || records.Length <= id)
        {
            var grown = new ThreadRecord[Math.Max(id + 1, Math.Max(4, (records?.Length ?? 0) * 2))];
            records?.CopyTo(grown, 0);
            t_records = records = grown;
        }

        ref ThreadRecord r = ref records[id];
        if (r.Token != token)
            r = new ThreadRecord { Token = token, Index = Environment.CurrentManagedThreadId };
        return ref r;
    }

    /// <summary>This thread's record for this epoch if it has one, else a null reference.</summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    private ref ThreadRecord FindRecord()
    {
        ThreadRecord[]? records = t_records;
        if (records is not null && (uint)id < (uint)records.Length)
        {
            ref ThreadRecord r = ref records[id];
            if (r.Token == token)
                return ref r;
        }
        return ref Unsafe.NullRef<ThreadRecord>();
    }
}
