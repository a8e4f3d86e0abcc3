using System;
using System.Runtime.CompilerServices;
using System.Threading;

namespace Epvs;

/// <summary>How deep drains nest on a thread: per instance (<see cref="MaxInlineDrainDepth"/>) and for all instances
/// together (<see cref="MaxThreadDrainDepth"/>), and what a drain past either bound leaves to an outer one.</summary>
public sealed unsafe partial class LightEpoch
{
    /// <summary>Per thread and per instance: drain nesting (actions that bump or step run drains inside drains), and
    /// whether a drain too deep to run inline asked the outermost one to look again. Per instance, so deep nesting on one
    /// epoch never stops another epoch's drain: that epoch has its own outermost drain on this thread (or none, and runs
    /// inline). Indexed by <see cref="id"/>, which a disposed instance gives back for reuse, so each entry also names its
    /// instance (<see cref="DrainNesting.Token"/>): see <see cref="Drain(bool, Action?)"/>. A managed array, indexed afresh on
    /// every access, because an action may grow it.</summary>
    [ThreadStatic] private static DrainNesting[]? t_drainNesting;

    private struct DrainNesting
    {
        /// <summary>The <see cref="token"/> of the instance whose drains the entry counts; 0 before first use.</summary>
        public long Token;
        public int Depth;
        public bool Again;
    }

    /// <summary>
    /// This instance's drain-nesting entry on this thread. An entry of a disposed instance that had our id is taken over;
    /// if it is in use (<paramref name="restore"/>), it is returned in <paramref name="displaced"/>, for the outermost
    /// frame of ours to put back when it returns.
    /// </summary>
    private ref DrainNesting ClaimNesting(out DrainNesting displaced, out bool restore)
    {
        displaced = default;
        restore = false;
        ref DrainNesting entry = ref Nesting;
        if (entry.Token != token && !SharedDrainDepthForTesting && !DrainNestingByIdForTesting)
        {
            restore = entry.Depth != 0;
            displaced = entry;
            entry = new DrainNesting { Token = token };
        }
        return ref entry;
    }

    private ref DrainNesting Nesting
    {
        get
        {
            int index = SharedDrainDepthForTesting ? 0 : id;
            DrainNesting[]? all = t_drainNesting;
            if (all is null || all.Length <= index)
                all = GrowDrainNesting(index);
            return ref all[index];
        }
    }

    /// <summary>
    /// Makes this thread's drain-nesting array long enough for <paramref name="index"/>. Allocates: called where a failure
    /// is harmless, when a thread's record is created (so a thread that was ever protected never allocates in a drain: a
    /// Suspend in a finally block does not replace the exception in flight with an OutOfMemoryException, nor leave the
    /// actions it made safe pending), and by a drain of a thread that never was (a bump, a registration).
    /// </summary>
    [MethodImpl(MethodImplOptions.NoInlining)]
    private static DrainNesting[] GrowDrainNesting(int index)
    {
        DrainNesting[]? all = t_drainNesting;
        if (all is not null && all.Length > index)
            return all;
        DrainNestingGrowHookForTesting?.Invoke();
        var grown = new DrainNesting[Math.Max(index + 1, Math.Max(4, (all?.Length ?? 0) * 2))];
        all?.AsSpan().CopyTo(grown);
        t_drainNesting = grown;
        return grown;
    }

    /// <summary>Beyond this depth a drain only asks the outermost one to look again, so a chain of actions that
    /// register actions (or a long state machine) cannot overflow the stack.</summary>
    private const int MaxInlineDrainDepth = 16;

    /// <summary>
    /// Beyond this many drains on a thread's stack, of all instances together, a drain is left to the outermost drain on
    /// the thread (<see cref="LeaveToOutermostDrain"/>): <see cref="MaxInlineDrainDepth"/> bounds each instance, so a chain
    /// of actions that each register with the next of many epochs (one per shard, say) nested 16 levels per epoch, and
    /// 128 epochs overflowed a 1.5 MB thread stack.
    /// </summary>
    private const int MaxThreadDrainDepth = 64;

    /// <summary>Drains (of every instance; waiting ones and final runs too) on this thread's stack.</summary>
    [ThreadStatic] private static int t_threadDrainDepth;

    /// <summary>Instances whose drain was left to the outermost drain on this thread (<see cref="LeaveToOutermostDrain"/>); null until first needed.</summary>
    [ThreadStatic] private static LightEpoch?[]? t_leftToOutermost;

    [ThreadStatic] private static int t_leftToOutermostCount;

    /// <summary>Whether <see cref="LeaveThreadDrain"/> is running the drains left to the outermost one on this thread (further up its stack).</summary>
    [ThreadStatic] private static bool t_runningLeftDrains;

    /// <summary>
    /// Whether a drain of this instance, with <paramref name="depth"/> of its own drains on this thread, is past
    /// <see cref="MaxThreadDrainDepth"/>; if so, leaves it to this instance's own outermost drain on the thread when there
    /// is one (which looks again), or else to the outermost drain on the thread, which runs it before it returns.
    /// </summary>
    private bool LeftPastThreadDepth(ref DrainNesting entry, int depth, in DrainNesting displaced, bool restore)
    {
        if (t_threadDrainDepth < MaxThreadDrainDepth || PerInstanceDrainDepthOnlyForTesting)
            return false;
        if (depth != 0)
        {
            entry.Again = true;
            return true;
        }
        if (restore)
            entry = displaced; // nothing of ours ran: the entry we set aside is put back at once
        LeaveToOutermostDrain(this);
        return true;
    }

    /// <summary>Queues <paramref name="epoch"/>'s drain for the outermost drain on this thread. Allocates only when a
    /// thread first goes this deep (an out-of-memory failure leaves the registration pending for a later drain).</summary>
    private static void LeaveToOutermostDrain(LightEpoch epoch)
    {
        LightEpoch?[]? left = t_leftToOutermost;
        if (left is null || t_leftToOutermostCount == left.Length)
        {
            var grown = new LightEpoch?[Math.Max(8, (left?.Length ?? 0) * 2)];
            left?.AsSpan().CopyTo(grown);
            t_leftToOutermost = left = grown;
        }
        left[t_leftToOutermostCount++] = epoch;
    }

    /// <summary>
    /// Counts a drain out of this thread's stack; the outermost one (the count back at 0) then runs the drains left to it,
    /// one at a time from this depth, in a loop (a drain it runs may leave more).
    /// </summary>
    private static void LeaveThreadDrain()
    {
        if (--t_threadDrainDepth != 0 || t_leftToOutermostCount == 0 || t_runningLeftDrains)
            return;
        t_runningLeftDrains = true;
        try
        {
            while (t_leftToOutermostCount != 0)
            {
                int last = --t_leftToOutermostCount;
                LightEpoch epoch = t_leftToOutermost![last]!;
                t_leftToOutermost[last] = null;
                epoch.Drain(); // on a Closed epoch too: its safe epoch then covers every registration
            }
        }
        finally
        {
            t_runningLeftDrains = false;
        }
    }

    /// <summary>Counts a drain into this thread's stack (see <see cref="MaxThreadDrainDepth"/>).</summary>
    private static void EnterThreadDrain()
    {
        int deep = ++t_threadDrainDepth;
        if (RecordDrainDepthForTesting && deep > t_maxThreadDrainDepthForTesting)
            t_maxThreadDrainDepthForTesting = deep;
    }
}
