using System;
using System.Diagnostics.CodeAnalysis;
using System.Runtime.CompilerServices;
using System.Runtime.InteropServices;
using System.Threading;

namespace Epvs.Persistence;

/// <summary>
/// A byte range that can be made durable: the lowest layer of the persistent heap (DESIGN §4, layer 1).
/// Stores go to <see cref="BaseAddress"/>; <see cref="WriteBack(long, long)"/> starts writing a range back to the
/// durable medium, <see cref="Fence"/> waits until every range this thread wrote back is durable, and
/// <see cref="Persist(long, long)"/> does both.
/// </summary>
/// <remarks>
/// <para>Ordering contract, which every implementation keeps and the simulated one checks: a store is guaranteed
/// durable only after the storing thread wrote back a range containing it and then fenced. Without that, any
/// 8-byte aligned word may or may not be durable at a crash (a cache may evict any dirty line at any time), and an
/// aligned 8-byte store is failure-atomic: after a crash a word holds an old or a new value, never a mix.</para>
/// <para>A write-back and fence are per thread: a fence orders the calling thread's write-backs only.</para>
/// <para>Disposing unmaps the memory. It first waits for the calls of this class in flight (<see cref="WriteBack"/>,
/// <see cref="Fence"/>, <see cref="Persist"/>, <see cref="TryGrow"/>), which complete; later ones throw
/// <see cref="ObjectDisposedException"/>. A call the medium keeps for more than 30 seconds (a failing disk) keeps the
/// mapping, leaked rather than unmapped under it. Spans from <see cref="GetSpan"/> and pointers from
/// <see cref="BaseAddress"/> are the caller's to stop using first.</para>
/// </remarks>
public abstract unsafe class PersistenceDomain : IDisposable
{
    private long _length;
    private int _disposed;
    private readonly object _userGate = new();

    /// <summary>Makes every Dispose return only once the memory is released (or quarantined).</summary>
    private readonly DisposalGate _disposal = new();

    /// <summary>The heap file using the domain (one at a time; see <see cref="Claim"/>), and its Dispose.</summary>
    private object? _user;
    private Action? _closeUser;

    /// <summary>Set under the gate by the public Dispose: no file may claim the domain any more.</summary>
    private bool _closing;

    /// <summary>
    /// The public calls in flight (<see cref="EnterCall"/>): a Dispose, or the release of a quarantine
    /// (<see cref="ReleaseQuarantine"/>), waits for them before it unmaps the memory. The heap file's own calls (the <c>…Owned</c> methods) are not counted:
    /// its Dispose has drained them before it disposes the domain.
    /// </summary>
    private int _publicCalls;

    /// <summary>The first failed write-back or fence (a system call's failure, described): every later write-back and fence of the domain reports it (fail-stop: see <see cref="ThrowIfFailedBefore"/>).</summary>
    private volatile string? _failure;

    /// <summary>See <see cref="_failure"/>; null while nothing failed.</summary>
    private protected string? Failure => _failure;

    /// <summary>What <see cref="_failure"/> holds from the moment a failure is seen until it is described.</summary>
    private const string FailureNotDescribed = "a write-back or fence of the heap file failed";

    /// <summary>
    /// Makes the domain fail-stop for a failure just seen, before anything is allocated to describe it: the kernel
    /// reports a write-back error once (per open file description, or to one call only), so an
    /// <see cref="OutOfMemoryException"/> while its message is built must not leave it unrecorded, and later fences,
    /// the caller's retry among them, returning success over the failed pages.
    /// </summary>
    /// <returns>Whether this is the domain's first failure, whose caller describes it (<see cref="DescribeFailure"/>).</returns>
    private protected bool RecordFailure()
    {
        if (RecordFailureLateForTesting)
        {
            DescribingFailureForTesting?.Invoke();
        }

        // Interlocked.CompareExchange: the first failure's record is never overwritten (two failing threads race here).
        bool first = Interlocked.CompareExchange(ref _failure, FailureNotDescribed, null) is null;
        if (!RecordFailureLateForTesting)
        {
            DescribingFailureForTesting?.Invoke();
        }

        return first;
    }

    /// <summary>Puts <paramref name="failure"/> in place of <see cref="FailureNotDescribed"/>; call it only for the first failure (<see cref="RecordFailure"/> returned true).</summary>
    private protected void DescribeFailure(string failure) => Interlocked.CompareExchange(ref _failure, failure, FailureNotDescribed);

    /// <summary>
    /// Records the failure of system call <paramref name="call"/> (fail-stop, unless <paramref name="failStop"/> is false:
    /// a test's broken control) before its message is allocated, and throws it.
    /// </summary>
    /// <param name="call">The call, as the message names it (<c>fdatasync</c>, <c>pmem_msync</c>).</param>
    /// <param name="errno">Its error number.</param>
    /// <param name="consequence">What the failure means for the caller's range, the message's end.</param>
    /// <param name="failStop">Whether the failure is recorded.</param>
    [DoesNotReturn]
    private protected void ThrowCallFailed(string call, int errno, string consequence, bool failStop = true)
    {
        bool first = failStop && RecordFailure();
        string failure = $"{call} failed: {Marshal.GetPInvokeErrorMessage(errno)} (error {errno})";
        if (first)
        {
            DescribeFailure(failure);
        }

        ThrowHelper.ThrowIO($"{failure}; {consequence}");
    }

    /// <summary>Test hook: runs in <see cref="RecordFailure"/> once the failure is recorded (a test throws <see cref="OutOfMemoryException"/> here, as its description's allocation could).</summary>
    internal Action? DescribingFailureForTesting;

    /// <summary>Broken control for tests: <see cref="DescribingFailureForTesting"/> runs before the failure is recorded (the old order: the description was allocated first).</summary>
    internal bool RecordFailureLateForTesting;

    /// <summary>
    /// After a failed write-back or fence nothing written back since can be trusted durable (the kernel marks the
    /// failed pages clean and reports the error once): every later write-back and fence of this domain throws.
    /// </summary>
    private protected void ThrowIfFailedBefore()
    {
        if (_failure is { } failure)
        {
            ThrowHelper.ThrowIO($"An earlier write-back of this heap file failed ({failure}); nothing written back since can be trusted durable. Reopen the heap to recover up to its durable frontier.");
        }
    }

    /// <summary>Initializes the domain over mapped memory.</summary>
    /// <param name="baseAddress">Start of the mapping.</param>
    /// <param name="length">Bytes usable now.</param>
    private protected PersistenceDomain(byte* baseAddress, long length)
    {
        Pointer = baseAddress;
        _length = length;
    }

    /// <summary>Which kind of domain this is.</summary>
    public abstract PersistenceDomainKind Kind { get; }

    /// <summary>
    /// <see langword="true"/> when write-back uses CPU cache flushes (persistent memory, or libpmem forced with
    /// <c>PMEM_IS_PMEM_FORCE=1</c>), <see langword="false"/> when it goes through the kernel's page cache or a model.
    /// </summary>
    public abstract bool IsPersistentMemory { get; }

    /// <summary>The address of byte 0. Valid until <see cref="Dispose()"/>; never moves, even when the domain grows.</summary>
    public IntPtr BaseAddress => (IntPtr)Pointer;

    /// <summary>The number of bytes currently usable from <see cref="BaseAddress"/>.</summary>
    // Volatile.Read: acquire; pairs with the release in SetLength so a thread that sees the new length also sees
    // the file extension that made those bytes valid.
    public long Length => Volatile.Read(ref _length);

    /// <summary>The largest <see cref="Length"/> that <see cref="TryGrow(long)"/> can reach; equal to <see cref="Length"/> when the domain cannot grow.</summary>
    public virtual long Capacity => Length;

    /// <summary>Whether this domain has been disposed.</summary>
    // Volatile.Read: acquire; pairs with the Interlocked.Exchange in Dispose. The public calls re-check it after counting
    // themselves in (EnterCall), which is what makes a Dispose wait for them.
    public bool IsDisposed => Volatile.Read(ref _disposed) != 0;

    /// <summary>
    /// The largest gap of untouched bytes that <see cref="WriteBackRuns"/> bridges to merge two ranges into one
    /// write-back (a system call through the page cache); 64 KiB, where a write-back over clean pages costs less than
    /// another call.
    /// </summary>
    internal virtual long WriteBackMergeGap => 64 * 1024;

    /// <summary>
    /// Whether a write-back copies every byte of its range to the medium (a private mapping written back with
    /// <c>pwrite</c>), so that writing back a large range costs its size, clean bytes included; false where it costs the
    /// dirty part only (<c>msync</c> of a shared mapping, cache-line flushes).
    /// </summary>
    internal virtual bool WritesBackByCopy => false;

    /// <summary>
    /// Before the allocator stores to every byte of a range and writes the whole range back (formatting segments that
    /// are free, durably): the range's current bytes, in memory and on the medium, are not needed any more. A domain
    /// may use that to make the stores cheaper; by default nothing happens. A hint: a failure of what it does is not
    /// reported (the caller's write-back of the range reports the medium's).
    /// </summary>
    /// <exception cref="ArgumentOutOfRangeException">The range is not inside <see cref="Length"/>.</exception>
    /// <exception cref="ObjectDisposedException">The domain was disposed.</exception>
    internal void PrepareOverwrite(long offset, long length)
    {
        CheckRange(offset, length);
        PrepareOverwriteHookForTesting?.Invoke(offset, length);
        if (!PrepareOverwriteDisabledForTesting)
        {
            PrepareOverwriteCore(offset, length);
        }
    }

    /// <summary>See <see cref="PrepareOverwrite"/> (range already checked); nothing by default.</summary>
    private protected virtual void PrepareOverwriteCore(long offset, long length)
    {
    }

    /// <summary>Test hook: runs in each <see cref="PrepareOverwrite"/> with its range (after the range check).</summary>
    internal Action<long, long>? PrepareOverwriteHookForTesting { get; set; }

    /// <summary>Test hook: <see cref="PrepareOverwrite"/> does nothing (the control for what it saves).</summary>
    internal bool PrepareOverwriteDisabledForTesting { get; set; }

    /// <summary>The mapping, for this assembly's allocator.</summary>
    internal byte* Pointer { get; }

    /// <summary>Returns a span over <paramref name="length"/> bytes at <paramref name="offset"/>.</summary>
    /// <exception cref="ArgumentOutOfRangeException">The range is not inside <see cref="Length"/>.</exception>
    public Span<byte> GetSpan(long offset, int length)
    {
        CheckRange(offset, length);
        return new Span<byte>(Pointer + offset, length);
    }

    /// <summary>Starts writing back the cache lines (or pages) covering the range; durable only after <see cref="Fence"/>.</summary>
    /// <exception cref="ArgumentOutOfRangeException">The range is not inside <see cref="Length"/>.</exception>
    /// <exception cref="ObjectDisposedException">The domain was disposed (a Dispose that begins during the call waits for it).</exception>
    public void WriteBack(long offset, long length)
    {
        EnterCall();
        try
        {
            CheckRange(offset, length);
            InsideCallForTesting?.Invoke();
            WriteBackCore(offset, length);
        }
        finally
        {
            ExitCall();
        }
    }

    /// <summary>Waits until every range the calling thread wrote back is durable.</summary>
    /// <exception cref="ObjectDisposedException">The domain was disposed (a Dispose that begins during the call waits for it).</exception>
    public void Fence()
    {
        EnterCall();
        try
        {
            InsideCallForTesting?.Invoke();
            FenceCore();
        }
        finally
        {
            ExitCall();
        }
    }

    /// <summary>Writes back the range and fences: on return every store to the range made before the call is durable.</summary>
    /// <exception cref="ArgumentOutOfRangeException">The range is not inside <see cref="Length"/>.</exception>
    /// <exception cref="ObjectDisposedException">The domain was disposed (a Dispose that begins during the call waits for it).</exception>
    public void Persist(long offset, long length)
    {
        EnterCall();
        try
        {
            CheckRange(offset, length);
            InsideCallForTesting?.Invoke();
            PersistCore(offset, length);
        }
        finally
        {
            ExitCall();
        }
    }

    /// <summary>
    /// Tries to make at least <paramref name="newLength"/> bytes usable without moving <see cref="BaseAddress"/>.
    /// Existing bytes keep their values; new bytes read as zero.
    /// </summary>
    /// <returns><see langword="true"/> when <see cref="Length"/> is now at least <paramref name="newLength"/>;
    /// <see langword="false"/> when it would exceed <see cref="Capacity"/> or the medium is full.</returns>
    /// <exception cref="ArgumentOutOfRangeException"><paramref name="newLength"/> is negative.</exception>
    /// <exception cref="ObjectDisposedException">The domain was disposed (a Dispose that begins during the call waits for it).</exception>
    public bool TryGrow(long newLength)
    {
        if (newLength < 0)
        {
            // (It used to report success: "at least -1 bytes usable".)
            ThrowHelper.ThrowArgumentOutOfRange(nameof(newLength), $"A length must not be negative; {newLength} is.");
        }

        EnterCall();
        try
        {
            return TryGrowOwned(newLength);
        }
        finally
        {
            ExitCall();
        }
    }

    /// <summary><see cref="WriteBack"/> for the heap file that claimed the domain (its own gate keeps Dispose off it): not counted.</summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    internal void WriteBackOwned(long offset, long length)
    {
        CheckRange(offset, length);
        WriteBackCore(offset, length);
    }

    /// <summary><see cref="Fence"/> for the heap file that claimed the domain: not counted.</summary>
    internal void FenceOwned()
    {
        if (IsDisposed)
        {
            ThrowHelper.ThrowObjectDisposed(this);
        }

        FenceCore();
    }

    /// <summary><see cref="Persist"/> for the heap file that claimed the domain: not counted.</summary>
    internal void PersistOwned(long offset, long length)
    {
        CheckRange(offset, length);
        PersistCore(offset, length);
    }

    /// <summary><see cref="TryGrow"/> for the heap file that claimed the domain: not counted.</summary>
    internal bool TryGrowOwned(long newLength)
    {
        if (IsDisposed)
        {
            ThrowHelper.ThrowObjectDisposed(this);
        }

        if (newLength <= Length)
        {
            return true;
        }

        if (newLength > Capacity || !TryGrowCore(newLength))
        {
            return false;
        }

        SetLength(newLength);
        return true;
    }

    /// <summary>
    /// Closes the domain without unmapping: the memory stays addressable (on Linux as private anonymous memory, detached
    /// from the file) for threads that may still be using it. See <see cref="HeapFile.Dispose()"/>.
    /// </summary>
    internal void Quarantine()
    {
        // Interlocked.Exchange: full fence; exactly one caller runs the release (or this instead of it).
        if (Interlocked.Exchange(ref _disposed, 1) == 0)
        {
            _disposal.Begin();
            try
            {
                // No wait for the public calls in flight here: the memory stays addressable (see ReleaseQuarantine, which
                // waits for them), and a domain whose calls reach a file waits for those itself (QuarantineCore).
                QuarantineCore();
            }
            finally
            {
                _disposal.Complete();
            }
        }
    }

    /// <summary>Detaches the memory from the medium without freeing it; by default keeps it as it is.</summary>
    private protected virtual void QuarantineCore()
    {
    }

    /// <summary>
    /// Frees the memory <see cref="Quarantine"/> detached, once no thread can use it any more (its owner knows when: the
    /// threads left inside operations have left). Nothing where the quarantine kept the memory as it is.
    /// </summary>
    internal void ReleaseQuarantine()
    {
        // The public calls that entered before the quarantine may still be using the memory: one stuck for longer than
        // PublicCallWait keeps it (held for the life of the process, as a call stuck in a Dispose keeps the mapping).
        if (WaitForPublicCalls())
        {
            ReleaseQuarantineCore();
        }
    }

    /// <summary>See <see cref="ReleaseQuarantine"/>, once no public call is in flight.</summary>
    private protected virtual void ReleaseQuarantineCore()
    {
    }

    /// <summary>Whether a quarantine left memory that <see cref="ReleaseQuarantine"/> has not freed yet (tests).</summary>
    internal virtual bool HoldsQuarantinedMemory => false;

    /// <summary>
    /// Claims the domain for the heap file <paramref name="user"/>: one heap file at a time. The public
    /// <see cref="Dispose()"/> then closes the file first with <paramref name="closeUser"/> (which refuses while a heap
    /// uses the file, and waits for the file's calls in flight), so the mapping is never unmapped under its calls.
    /// </summary>
    /// <exception cref="InvalidOperationException">Another heap file uses the domain.</exception>
    /// <exception cref="ObjectDisposedException">The domain was disposed.</exception>
    internal void Claim(object user, Action? closeUser)
    {
        using (InterruptShield.Hold(_userGate))
        {
            if (_closing || IsDisposed)
            {
                ThrowHelper.ThrowObjectDisposed(this);
            }

            if (_user is not null)
            {
                ThrowHelper.ThrowInvalidOperation("This persistence domain is already used by a HeapFile: one heap file at a time (two would format and allocate over each other). Dispose that HeapFile first.");
            }

            _user = user;
            _closeUser = closeUser;
        }
    }

    /// <summary>Passes the claim of <paramref name="claim"/> (taken before formatting or validating) to the heap file <paramref name="user"/>.</summary>
    internal void TransferClaim(object claim, object user, Action closeUser)
    {
        using (InterruptShield.Hold(_userGate))
        {
            if (!ReferenceEquals(_user, claim))
            {
                ThrowHelper.ThrowInvalidOperation("Internal error: the domain's claim changed hands while a heap file was opening on it.");
            }

            _user = user;
            _closeUser = closeUser;
        }
    }

    /// <summary>Gives up the claim of <paramref name="user"/> (the heap file closed, its calls drained).</summary>
    internal void Release(object user)
    {
        using (InterruptShield.Hold(_userGate))
        {
            if (ReferenceEquals(_user, user))
            {
                _user = null;
                _closeUser = null;
            }
        }
    }

    /// <summary>
    /// Unmaps the memory. Stores not persisted before are durable only as the kind of domain allows. A
    /// <see cref="HeapFile"/> on the domain is disposed first (it waits for its calls in flight). Returns only once the
    /// memory is released: a call while another Dispose runs waits for it (interruptibly:
    /// <see cref="ThreadInterruptedException"/>, and the other one carries on); a call after that does nothing.
    /// </summary>
    /// <exception cref="InvalidOperationException">A heap still uses the heap file on this domain (dispose the heap
    /// first), or the file's calls did not drain; nothing is unmapped. Or: called on the thread of a Dispose of this
    /// domain that is still running (from a callback inside it), which cannot complete before this call returns.</exception>
    /// <exception cref="ThreadInterruptedException">The call waited for another Dispose and was interrupted.</exception>
    public void Dispose()
    {
        Action? closeUser;
        using (InterruptShield.Hold(_userGate))
        {
            closeUser = IsDisposed ? null : _closeUser;
        }

        // Outside the gate: the file's Dispose releases its claim (under the gate) when its calls have drained, and
        // throws, leaving everything as it was, while a heap uses it.
        closeUser?.Invoke();
        using (InterruptShield.Hold(_userGate))
        {
            if (_user is not null && !IsDisposed)
            {
                ThrowHelper.ThrowInvalidOperation("This persistence domain is still in use: its heap file's calls did not return within its Dispose's wait (or a heap file is being created on it), so the domain stays mapped under them.");
            }

            _closing = true;
        }

        // Interlocked.Exchange: full fence; exactly one caller runs the release. Any other returns once it is done (it
        // used to return at once, with the memory still mapped).
        if (Interlocked.Exchange(ref _disposed, 1) != 0)
        {
            _disposal.WaitForCompletion(GetType().Name);
            return;
        }

        _disposal.Begin();
        using InterruptShield.Scope shield = InterruptShield.Enter(); // as in HeapFile.Dispose
        try
        {
            DisposingHookForTesting?.Invoke();

            // A public call stuck in the kernel for longer than PublicCallWait (a failing disk) keeps the mapping (and the
            // descriptor): unmapping under it would end the process. Leaked for its life; the domain is disposed all
            // the same (every later call throws).
            if (WaitForPublicCalls())
            {
                Dispose(true);
            }

            GC.SuppressFinalize(this);
        }
        finally
        {
            _disposal.Complete();
        }
    }

    /// <summary>The test hooks of the Dispose that waits for another one.</summary>
    internal DisposalGate DisposalForTesting => _disposal;

    /// <summary>Broken control for tests: Dispose and <see cref="ReleaseQuarantine"/> do not wait for the public calls in flight.</summary>
    internal static bool SkipCallDrainForTesting { get; set; }

    /// <summary>Test hook: a Dispose (or a quarantine's release) found public calls in flight and is about to wait for them.</summary>
    internal Action? WaitingForCallsForTesting { get; set; }

    /// <summary>Test hook: a public write-back, fence or persist has entered (counted, its range and the disposed flag
    /// checked) and is about to touch the memory.</summary>
    internal Action? InsideCallForTesting { get; set; }

    /// <summary>Counts a public call in; throws if the domain is disposed (then nothing was counted).</summary>
    private void EnterCall()
    {
        // Interlocked.Increment: full fence, store-load ordered against Dispose's exchange-then-read of the count
        // (a Dekker pair): either Dispose sees this call counted and waits, or the call sees the flag and backs out.
        Interlocked.Increment(ref _publicCalls);
        if (IsDisposed)
        {
            Interlocked.Decrement(ref _publicCalls);
            ThrowHelper.ThrowObjectDisposed(this);
        }
    }

    private void ExitCall() => Interlocked.Decrement(ref _publicCalls);

    /// <summary>
    /// How long a Dispose (or a quarantine's release) waits for the public calls in flight before it gives up and leaves
    /// the memory to them: each is one write-back, fence or extension, which returns unless the medium hangs it.
    /// </summary>
    private protected virtual TimeSpan PublicCallWait => TimeSpan.FromSeconds(30);

    /// <summary>
    /// After the disposed flag is set: waits until the public calls that entered before it have returned, for at most
    /// <see cref="PublicCallWait"/>; false if some are still in flight. Uninterruptible: an interrupt is requested again
    /// afterwards.
    /// </summary>
    private bool WaitForPublicCalls()
    {
        if (SkipCallDrainForTesting || Volatile.Read(ref _publicCalls) == 0)
        {
            return true;
        }

        WaitingForCallsForTesting?.Invoke();
        using InterruptShield.Scope shield = InterruptShield.Enter();
        long deadline = Environment.TickCount64 + (long)PublicCallWait.TotalMilliseconds;
        var spinner = new SpinWait();
        while (Volatile.Read(ref _publicCalls) != 0)
        {
            if (Environment.TickCount64 > deadline)
            {
                return false;
            }

            InterruptShield.SpinOnce(ref spinner);
        }

        return true;
    }

    /// <summary>Test hook: runs on the Dispose that releases the memory, before it does.</summary>
    internal Action? DisposingHookForTesting { get; set; }

    /// <summary>Releases the mapping.</summary>
    /// <param name="disposing"><see langword="true"/> from <see cref="Dispose()"/>, <see langword="false"/> from a finalizer.</param>
    protected abstract void Dispose(bool disposing);

    /// <summary>Writes back the range (already checked).</summary>
    private protected abstract void WriteBackCore(long offset, long length);

    /// <summary>Fences the calling thread's write-backs.</summary>
    private protected abstract void FenceCore();

    /// <summary>Writes back and fences the range (already checked).</summary>
    private protected virtual void PersistCore(long offset, long length)
    {
        WriteBackCore(offset, length);
        FenceCore();
    }

    /// <summary>Extends the medium to <paramref name="newLength"/> (at most <see cref="Capacity"/>).</summary>
    private protected virtual bool TryGrowCore(long newLength) => false;

    private void SetLength(long newLength) =>
        // Volatile.Write: release; the extension done by TryGrowCore happens-before a reader that sees the new length.
        Volatile.Write(ref _length, newLength);

    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    private protected void CheckRange(long offset, long length)
    {
        if ((ulong)offset > (ulong)Length || (ulong)length > (ulong)(Length - offset))
        {
            ThrowHelper.ThrowRangeOutsideDomain(offset, length, Length);
        }

        if (IsDisposed)
        {
            ThrowHelper.ThrowObjectDisposed(this);
        }
    }
}
