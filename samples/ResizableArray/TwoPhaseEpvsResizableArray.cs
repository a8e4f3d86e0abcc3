using System;
using System.Threading;

namespace Epvs.Samples.ResizableArray;

/// <summary>
/// The paper's two-phase EPVS resizable array (§3.2, Figs. 4–6): growth is a REST → COPYING → REST state machine.
/// The critical section into COPYING only allocates the new array; the copy runs outside any critical section on a
/// background task while reads proceed (old indices from the old array, new ones from the new array), pushes go to
/// the new array's fresh upper half, and writes to copied indices wait for REST so that none is lost. The critical
/// section back to REST swings the array reference.
/// </summary>
public sealed class TwoPhaseEpvsResizableArray : IResizableArray
{
    /// <summary>The phase in which the old array is being copied into the new one.</summary>
    public const byte Copying = 1;

    private readonly EpochProtectedVersionScheme epvs;

    /// <summary>The array at rest; during COPYING the (immutable) source of the copy. Replaced only in a critical
    /// section, so stable inside a protected region.</summary>
    private long[] list;

    /// <summary>The array being filled during COPYING (null at rest). Set and cleared only in critical sections.</summary>
    private long[]? newList;

    private int count;

    /// <summary>The growth machine that has entered COPYING and not yet finished (null otherwise).</summary>
    private ArrayGrowthStateMachine? activeGrowth;

    /// <summary>Creates an array with its own scheme.</summary>
    /// <param name="initialCapacity">The initial length of the backing array (at least 1).</param>
    /// <param name="resizeDelay">Extra time spent copying in each resize, outside the critical section (the paper's
    /// Fig. 13); zero by default.</param>
    /// <exception cref="ArgumentOutOfRangeException"><paramref name="initialCapacity"/> is below 1.</exception>
    public TwoPhaseEpvsResizableArray(int initialCapacity, TimeSpan resizeDelay = default)
    {
        ArgumentOutOfRangeException.ThrowIfLessThan(initialCapacity, 1);
        epvs = new EpochProtectedVersionScheme();
        list = new long[initialCapacity];
        ResizeDelay = resizeDelay;
    }

    /// <inheritdoc/>
    public string Name => "2-phase-EPVS";

    /// <summary>The scheme protecting the array. Its phase is <see cref="Copying"/> while a resize copies.</summary>
    public EpochProtectedVersionScheme Scheme => epvs;

    internal TimeSpan ResizeDelay { get; }

    /// <summary>Test hook: when set, the copy waits for it before starting, so a test can hold the array in
    /// COPYING.</summary>
    internal ManualResetEventSlim? CopyGateForTesting { get; set; }

    /// <inheritdoc/>
    public int Count => Volatile.Read(ref count); // acquire: pairs with the Interlocked.Increment in Push

    /// <inheritdoc/>
    public int Capacity
    {
        get
        {
            using var scope = epvs.EnterScope(out VersionSchemeState state);
            return state.Phase == Copying ? newList!.Length : list.Length;
        }
    }

    /// <inheritdoc/>
    public long Read(int index)
    {
        VersionSchemeState state = epvs.Enter();
        try
        {
            int n = Volatile.Read(ref count);
            if ((uint)index >= (uint)n)
                ArrayErrors.IndexOutOfRange(index, n);
            long[] current = list; // stable for the region
            if ((uint)index < (uint)current.Length)
                return current[index]; // at rest, or an index being copied: the old array is not written in COPYING
            if (state.Phase == Copying)
            {
                long[] next = newList!;
                return (uint)index < (uint)next.Length ? next[index] : 0;
            }
            return 0; // push in flight, waiting for the next resize
        }
        finally
        {
            epvs.Leave();
        }
    }

    /// <inheritdoc/>
    public void Write(int index, long value)
    {
        VersionSchemeState state = epvs.Enter();
        try
        {
            int n = Volatile.Read(ref count);
            if ((uint)index >= (uint)n)
                ArrayErrors.IndexOutOfRange(index, n);
            var spinner = new SpinWait();
            while (true)
            {
                long[] current = list;
                if (state.Phase != Copying)
                {
                    if ((uint)index >= (uint)current.Length)
                        ArrayErrors.PushInFlight(index);
                    current[index] = value;
                    return;
                }
                if (index >= current.Length)
                {
                    // The new array's upper half is never copied into: safe to write now (Fig. 4).
                    long[] next = newList!;
                    if ((uint)index >= (uint)next.Length)
                        ArrayErrors.PushInFlight(index);
                    next[index] = value;
                    return;
                }
                // A write to an index being copied could be lost: wait for REST (Fig. 6, lines 26-28). Refresh lets
                // the COPYING -> REST transition pass us.
                spinner.SpinOnce();
                state = epvs.Refresh();
            }
        }
        finally
        {
            epvs.Leave();
        }
    }

    /// <inheritdoc/>
    public int Push(long value)
    {
        VersionSchemeState state = epvs.Enter();
        try
        {
            int pos = Interlocked.Increment(ref count) - 1; // full fence; inside protection (see SimpleEpvsResizableArray)
            if (pos < 0)
                throw new InvalidOperationException("The array is full: more than int.MaxValue pushes.");
            var spinner = new SpinWait();
            while (true)
            {
                if (state.Phase != Copying)
                {
                    long[] current = list;
                    if (pos < current.Length)
                    {
                        current[pos] = value;
                        return pos;
                    }
                    // Full: start growing, unless someone already has for the version after the one we saw.
                    if (epvs.CurrentState.Version == state.Version)
                        epvs.TryExecuteStateMachine(new ArrayGrowthStateMachine(this, state.Version + 1));
                }
                else
                {
                    // Fig. 6 (line 52) asserts pos >= list.Length here, reasoning that every slot of the old array
                    // was filled before COPYING began. Not so: a pusher that waited out a resize (Refresh steps
                    // aside while a transition is pending) can miss a whole REST state and wake up in the next
                    // resize's COPYING still holding a slot of the old array's range. Writing it into the new
                    // array would race with the copy (which copies the old, empty slot over it): a lost push, found
                    // by this sample's oracle test. Such a slot waits for REST, like a write.
                    long[] next = newList!;
                    if (pos >= list.Length && pos < next.Length)
                    {
                        next[pos] = value; // the new array's upper half: the copy never touches it
                        return pos;
                    }
                    // An old-range slot, or past the new array too: wait for REST.
                    spinner.SpinOnce();
                }
                state = epvs.Refresh();
            }
        }
        finally
        {
            epvs.Leave();
        }
    }

    /// <inheritdoc/>
    public IResizableArraySession OpenSession() => new Session(this);

    /// <summary>Critical section REST → COPYING: no operation is in flight, so <see cref="count"/> is stable.</summary>
    internal long[] BeginGrowth(ArrayGrowthStateMachine machine)
    {
        Volatile.Write(ref activeGrowth, machine); // release; read by Dispose
        long[] old = list;
        var grown = new long[ArrayErrors.GrownLength(old.Length, Volatile.Read(ref count))];
        newList = grown; // published by the scheme's release store of COPYING
        return grown;
    }

    /// <summary>Runs outside any critical section, concurrently with reads and pushes.</summary>
    internal void CopyInto(long[] grown)
    {
        CopyGateForTesting?.Wait();
        long[] old = list; // not replaced until COPYING -> REST, which waits for this copy
        Array.Copy(old, grown, old.Length);
        if (ResizeDelay > TimeSpan.Zero)
            Thread.Sleep(ResizeDelay);
    }

    /// <summary>Critical section COPYING → REST: swing the reference.</summary>
    internal void EndGrowth(long[] grown)
    {
        list = grown;
        newList = null;
    }

    /// <summary>Waits (up to 30 s) for a resize still copying in the background, then disposes the scheme. No thread
    /// may be using the array.</summary>
    /// <exception cref="TimeoutException">The background copy did not finish within 30 s.</exception>
    public void Dispose()
    {
        if (Volatile.Read(ref activeGrowth) is { } growth && !growth.Completion.Wait(TimeSpan.FromSeconds(30)))
            throw new TimeoutException("A resize of the two-phase array was still copying 30 s after Dispose was called.");
        epvs.Dispose();
    }

    /// <summary>
    /// The session of a variant that protects each operation by itself: forwards every call to the (sealed) array,
    /// so the calls bind directly, as EPVS-pinned's session does; nothing to refresh.
    /// </summary>
    private sealed class Session : IResizableArraySession
    {
        private readonly TwoPhaseEpvsResizableArray array;

        public Session(TwoPhaseEpvsResizableArray array) => this.array = array;

        public long Read(int index) => array.Read(index);

        public void Write(int index, long value) => array.Write(index, value);

        public int Push(long value) => array.Push(value);

        public void Refresh()
        {
        }

        public void Dispose()
        {
        }
    }
}
