using System;
using System.Diagnostics;
using System.Runtime.CompilerServices;
using System.Threading;

namespace Epvs.Baselines;

/// <summary>
/// BRAVO, a biased reader–writer lock (Dice &amp; Kogan 2019, "BRAVO — Biased Locking for Reader-Writer Locks",
/// USENIX ATC), written from the paper as the EPVS paper's evaluation does (§6): a wrapper around an underlying
/// reader–writer lock (here <see cref="ReaderWriterLockSlim"/>) that lets readers skip it while the lock is
/// read-biased.
/// </summary>
/// <remarks>
/// <para><b>Readers.</b> While the bias flag <c>RBias</c> is set, a reader installs this lock in its hashed slot of
/// the global <see cref="VisibleReadersTable"/> with a CAS (a full fence), then re-reads the flag: still set means the
/// fast path is taken and the reader touched no shared line but its slot. A taken slot or a cleared flag sends the
/// reader to the underlying lock (the slow path), which re-enables the bias once the inhibit window has passed.</para>
/// <para><b>Writers.</b> A writer acquires the underlying lock for writing, which stops new slow-path readers. If the
/// lock is biased it revokes the bias: it clears <c>RBias</c> with an interlocked exchange — a full fence, so the
/// cleared flag is globally visible before the writer reads any slot, which pairs with the reader's fence between
/// its CAS and its re-read of the flag (either the reader sees the flag cleared and backs out, or the writer sees the
/// reader's slot) — then scans the whole table and waits until no slot holds this lock. Revocation is slow (a table
/// scan), so the bias stays off for an inhibit window of <see cref="InhibitMultiplier"/> times the revocation's
/// duration (the paper's N = 9), bounding the slowdown revocations can cause.</para>
/// <para>Thread-affine like <see cref="ReaderWriterLockSlim"/>: exit on the thread that entered, passing the token
/// that <see cref="EnterReadLock"/> returned. Not re-entrant on one instance.</para>
/// </remarks>
public sealed class BravoReaderWriterLock : IDisposable
{
    /// <summary>The paper's N: after a revocation that took t, the bias stays off for N·t.</summary>
    public const int InhibitMultiplier = 9;

    /// <summary>Token returned by <see cref="EnterReadLock"/> when the reader took the underlying lock.</summary>
    public const int SlowPathToken = -1;

    private static int s_nextId;

    private readonly ReaderWriterLockSlim underlying = new(LockRecursionPolicy.NoRecursion);
    private readonly object?[] slots;
    private readonly VisibleReadersTable table;
    private readonly BravoHashing hashing;
    private readonly int id;

    /// <summary>1 while readers may take the fast path. Written by exchange (writer) or release store (reader
    /// re-enabling it under the read lock); read with acquire.</summary>
    private int readBias = 1;

    /// <summary>Stopwatch timestamp before which slow-path readers must not re-enable the bias. Written by writers
    /// only, under the write lock; read by slow-path readers under the read lock (the lock orders them).</summary>
    private long inhibitUntil;

    /// <summary>Creates a lock on <paramref name="table"/> (the process-wide <see cref="VisibleReadersTable.Shared"/>
    /// by default).</summary>
    /// <param name="table">The visible-readers table to publish fast-path readers in.</param>
    /// <param name="hashing">How a reader's slot is chosen.</param>
    public BravoReaderWriterLock(VisibleReadersTable? table = null, BravoHashing hashing = BravoHashing.ThreadAndLock)
    {
        this.table = table ?? VisibleReadersTable.Shared;
        slots = this.table.Slots;
        this.hashing = hashing;
        id = Interlocked.Increment(ref s_nextId);
    }

    /// <summary>Whether readers may currently take the fast path (informational; it changes at any time).</summary>
    public bool IsReadBiased => Volatile.Read(ref readBias) != 0;

    /// <summary>Test hook for the control: a writer that does not wait for fast-path readers (broken on purpose).</summary>
    internal bool SkipRevocationScanForTesting { get; set; }

    /// <summary>
    /// Acquires the lock for reading.
    /// </summary>
    /// <returns>A token to pass to <see cref="ExitReadLock"/>: the slot of a fast-path reader, or
    /// <see cref="SlowPathToken"/>.</returns>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    public int EnterReadLock()
    {
        if (Volatile.Read(ref readBias) != 0)
        {
            int slot = table.SlotFor(Environment.CurrentManagedThreadId, hashing == BravoHashing.ThreadAndLock ? id : 0);
            // Full fence: our slot is visible before we re-read the bias (pairs with the writer's exchange on readBias
            // followed by its scan).
            if (Interlocked.CompareExchange(ref slots[slot], this, null) is null)
            {
                if (Volatile.Read(ref readBias) != 0)
                    return slot;
                // A writer revoked the bias between our two reads: back out, it may be waiting for this slot.
                Volatile.Write(ref slots[slot], null);
            }
        }
        return EnterReadSlow();
    }

    [MethodImpl(MethodImplOptions.NoInlining)]
    private int EnterReadSlow()
    {
        underlying.EnterReadLock();
        // No writer holds the lock now, so re-enabling the bias is safe; the next writer revokes it again.
        if (Volatile.Read(ref readBias) == 0 && Stopwatch.GetTimestamp() >= inhibitUntil)
            Volatile.Write(ref readBias, 1); // release
        return SlowPathToken;
    }

    /// <summary>Releases a read lock acquired by <see cref="EnterReadLock"/> on this thread.</summary>
    /// <param name="token">The value <see cref="EnterReadLock"/> returned.</param>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    public void ExitReadLock(int token)
    {
        if (token >= 0)
            Volatile.Write(ref slots[token], null); // release: the read section happens-before a writer sees the slot free
        else
            underlying.ExitReadLock();
    }

    /// <summary>Acquires the lock for writing: waits for slow-path readers (the underlying lock) and, if the lock
    /// was read-biased, revokes the bias and waits for fast-path readers.</summary>
    public void EnterWriteLock()
    {
        underlying.EnterWriteLock();
        if (Volatile.Read(ref readBias) == 0)
            return;

        // Full fence: the cleared bias is visible before any slot is read below (see the class remarks).
        Interlocked.Exchange(ref readBias, 0);
        long start = Stopwatch.GetTimestamp();
        if (!SkipRevocationScanForTesting)
        {
            var spinner = new SpinWait();
            for (int i = 0; i < slots.Length; i++)
            {
                while (ReferenceEquals(Volatile.Read(ref slots[i]), this)) // acquire: pairs with the reader's release
                    spinner.SpinOnce(sleep1Threshold: -1);
            }
        }
        long now = Stopwatch.GetTimestamp();
        inhibitUntil = now + (now - start) * InhibitMultiplier;
    }

    /// <summary>Releases the write lock.</summary>
    public void ExitWriteLock() => underlying.ExitWriteLock();

    /// <summary>Disposes the underlying lock. No thread may hold or wait for the lock.</summary>
    public void Dispose() => underlying.Dispose();
}
