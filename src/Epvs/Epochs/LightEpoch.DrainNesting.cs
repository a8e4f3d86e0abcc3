using System;
using System.Collections.Generic;
using System.Runtime.CompilerServices;
using System.Threading;

namespace Epvs;

// How deep drains nest on a thread: per instance (MaxInlineDrainDepth) and for all instances
// together (MaxThreadDrainDepth), and what a drain past either bound leaves to an outer one.
public sealed unsafe partial class LightEpoch
{
    /// <summary>Per thread and per instance: drain nesting (actions that bump or step run drains inside drains), and
    /// whether a drain too deep to run inline asked the outermost one to look again. Per instance, so deep nesting on one
    /// epoch never stops another epoch's drain: that epoch has its own outermost drain on this thread (or none, and runs
    /// inline). Indexed by <see cref="id"/>, which a disposed instance gives back for reuse, so each entry also names its
    /// instance (<see cref="DrainNesting.Token"/>): see <see cref="Drain(bool, Action?, bool)"/>. A managed array, indexed afresh on
    /// every access, because an action may grow it. With it, the thread's count of drains of all instances together.</summary>
    [ThreadStatic] private static DrainStack? t_drains;

    /// <summary>One thread's drains (one thread-static field, read once per drain: each read of a thread-static costs a call).</summary>
    private sealed class DrainStack
    {
        /// <summary>Per instance id; replaced by a longer copy when it grows (an action may grow it while a drain runs).</summary>
        internal DrainNesting[] Entries = Array.Empty<DrainNesting>();

        /// <summary>Drains (of every instance; waiting ones and final runs too) on this thread's stack.</summary>
        internal int Depth;

        /// <summary>Instances whose drain was left to the outermost drain on this thread (<see cref="LeaveToOutermostDrain"/>),
        /// each once; sized ahead, so that leaving a drain allocates only past eight epochs at once.</summary>
        internal LightEpoch?[] Left = new LightEpoch?[8];

        internal int LeftCount;

        /// <summary>Whether <see cref="LeaveThreadDrain"/> is running the drains left to the outermost one (further up this stack).</summary>
        internal bool RunningLeft;

        /// <summary>Reused by <see cref="RunDrainsLeftWhileWaiting"/> for the instances it keeps on the list (null while in use).</summary>
        internal List<LightEpoch>? SkippedScratch;
    }

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
    private ref DrainNesting ClaimNesting(DrainStack stack, out DrainNesting displaced, out bool restore)
    {
        displaced = default;
        restore = false;
        ref DrainNesting entry = ref NestingIn(stack);
        if (entry.Token != token && !SharedDrainDepthForTesting && !DrainNestingByIdForTesting)
        {
            restore = entry.Depth != 0;
            displaced = entry;
            entry = new DrainNesting { Token = token };
        }
        return ref entry;
    }

    /// <summary>This instance's index in a thread's <see cref="DrainStack.Entries"/>.</summary>
    private int NestingIndex => SharedDrainDepthForTesting ? 0 : id;

    /// <summary>This thread's drains, with an entry for this instance (allocated if need be: see <see cref="GrowDrainNesting"/>).</summary>
    private DrainStack Drains
    {
        get
        {
            int index = NestingIndex;
            DrainStack? stack = t_drains;
            return stack is not null && stack.Entries.Length > index ? stack : GrowDrainNesting(index);
        }
    }

    /// <summary>This instance's entry in <paramref name="stack"/> (indexed afresh: an action may have grown the array).</summary>
    private ref DrainNesting NestingIn(DrainStack stack) => ref stack.Entries[NestingIndex];

    /// <summary>
    /// Makes this thread's drain-nesting array long enough for <paramref name="index"/>. Allocates: called where a failure
    /// is harmless, when a thread's record is created (so a thread that was ever protected never allocates in a drain: a
    /// Suspend in a finally block does not replace the exception in flight with an OutOfMemoryException, nor leave the
    /// actions it made safe pending), and by a drain of a thread that never was (a bump, a registration).
    /// </summary>
    [MethodImpl(MethodImplOptions.NoInlining)]
    private static DrainStack GrowDrainNesting(int index)
    {
        DrainStack? stack = t_drains;
        if (stack is not null && stack.Entries.Length > index)
            return stack;
        DrainNestingGrowHookForTesting?.Invoke();
        DrainNesting[] all = stack?.Entries ?? Array.Empty<DrainNesting>();
        var grown = new DrainNesting[Math.Max(index + 1, Math.Max(4, all.Length * 2))];
        all.AsSpan().CopyTo(grown);
        // The stack itself stays: drains further up this thread's stack hold it, and read their entries from it afresh.
        stack ??= t_drains = new DrainStack();
        stack.Entries = grown;
        return stack;
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

    /// <summary>
    /// Whether a drain of this instance, with <paramref name="depth"/> of its own drains on this thread, is past
    /// <see cref="MaxThreadDrainDepth"/>; if so, leaves it to this instance's own outermost drain on the thread when there
    /// is one (which looks again), or else to the outermost drain on the thread, which runs it before it returns.
    /// </summary>
    private bool LeftPastThreadDepth(DrainStack stack, ref DrainNesting entry, int depth, in DrainNesting displaced, bool restore)
    {
        if (stack.Depth < MaxThreadDrainDepth || PerInstanceDrainDepthOnlyForTesting)
            return false;
        if (depth != 0)
        {
            LeaveToOuterDrains(stack, ref entry);
            return true;
        }
        if (restore)
            entry = displaced; // nothing of ours ran: the entry we set aside is put back at once
        LeaveToOutermostDrain(stack, this);
        return true;
    }

    /// <summary>
    /// A drain of this instance refused by a depth bound while the instance has a drain further up this thread's stack:
    /// that drain looks again when control returns to it (<see cref="DrainNesting.Again"/>). The instance also goes on
    /// the thread's list of drains left to the outermost one, because the thread may wait in a loop below that drain for
    /// one of the actions refused here (a blocking machine start whose step an action signals): the drain up the stack
    /// is stopped until the wait ends, and the wait runs the list (<see cref="RunDrainsLeftWhileWaiting"/>). Only the
    /// flag, and such a wait spun until another thread drained the instance, for ever when nobody else used it.
    /// </summary>
    private void LeaveToOuterDrains(DrainStack stack, ref DrainNesting entry)
    {
        entry.Again = true;
        if (RefusedDrainOnlyAsksTheOuterOneForTesting)
            return;
        try
        {
            LeaveToOutermostDrain(stack, this); // allocates only past eight epochs at once
        }
        catch (OutOfMemoryException)
        {
            // The flag is set: the drain up the stack still looks again when the wait (if any) ends. A drain that only
            // flagged the outer one used to allocate nothing; it still never fails for want of memory.
        }
    }

    /// <summary>Queues <paramref name="epoch"/>'s drain for the outermost drain on this thread, once however many
    /// registrations leave it (one drain runs them all). Allocates only past eight epochs at once (an out-of-memory
    /// failure leaves the registration pending for a later drain).</summary>
    private static void LeaveToOutermostDrain(DrainStack stack, LightEpoch epoch)
    {
        LightEpoch?[] left = stack.Left;
        for (int i = 0; i < stack.LeftCount; i++)
        {
            if (ReferenceEquals(left[i], epoch))
                return;
        }
        if (stack.LeftCount == left.Length)
        {
            var grown = new LightEpoch?[left.Length * 2];
            left.AsSpan().CopyTo(grown);
            stack.Left = left = grown;
        }
        left[stack.LeftCount++] = epoch;
    }

    /// <summary>
    /// Counts a drain out of this thread's stack; the outermost one (the count back at 0) then runs the drains left to it,
    /// one at a time from this depth, in a loop (a drain it runs may leave more).
    /// </summary>
    private static void LeaveThreadDrain(DrainStack stack)
    {
        if (--stack.Depth != 0 || stack.LeftCount == 0 || stack.RunningLeft)
            return;
        stack.RunningLeft = true;
        try
        {
            while (stack.LeftCount != 0)
            {
                int last = --stack.LeftCount;
                LightEpoch epoch = stack.Left[last]!;
                stack.Left[last] = null;
                epoch.Drain(); // on a Closed epoch too: its safe epoch then covers every registration
            }
        }
        finally
        {
            stack.RunningLeft = false;
        }
    }

    /// <summary>
    /// For a thread that waits in a loop (<see cref="DrainWhileWaiting"/>): runs the drains it left to its outermost drain
    /// (past <see cref="MaxThreadDrainDepth"/>), which is further up its own stack and stopped until the wait ends, while
    /// the wait may be for one of their actions (another epoch's action that signals a step). Waiting drains, as
    /// <see cref="DrainWhileWaiting"/>'s own: not bounded per thread, only per instance.
    /// </summary>
    private static void RunDrainsLeftWhileWaiting()
    {
        DrainStack? stack = t_drains;
        if (stack is null)
            return;
        // The thread's scratch list (taken while in use: a drain below may wait, and run this again, with its own list), so
        // that a wait that skips an instance on every turn does not allocate on every turn.
        List<LightEpoch>? skipped = null;
        while (stack.LeftCount != 0)
        {
            int last = --stack.LeftCount;
            LightEpoch epoch = stack.Left[last]!;
            stack.Left[last] = null;

            // An instance already MaxWaitingDrainDepth deep on this thread is not drained deeper: unbounded, a wait inside
            // each of its actions nested one more drain for every action pending. It stays on the list (put back below,
            // so that this loop ends), for a shallower wait further up the stack, or the outermost drain: its own drains
            // up the stack are stopped under those waits, so dropped it was stranded (G4).
            if (epoch.DrainDepthOn(stack) < MaxWaitingDrainDepth)
                epoch.Drain(waiting: true);
            else if (!SkippedLeftDrainDroppedForTesting)
            {
                skipped ??= TakeSkippedScratch(stack);
                skipped.Add(epoch);
            }
        }
        if (skipped is not null)
        {
            foreach (LightEpoch epoch in skipped)
                LeaveToOutermostDrain(stack, epoch);
            skipped.Clear();
            stack.SkippedScratch = skipped;
        }
    }

    private static List<LightEpoch> TakeSkippedScratch(DrainStack stack)
    {
        List<LightEpoch> scratch = stack.SkippedScratch ?? new List<LightEpoch>();
        stack.SkippedScratch = null;
        return scratch;
    }

    /// <summary>This instance's drains on <paramref name="stack"/> (0 when its entry belongs to a disposed instance that had its id).</summary>
    private int DrainDepthOn(DrainStack stack)
    {
        int index = NestingIndex;
        return index < stack.Entries.Length && stack.Entries[index].Token == token ? stack.Entries[index].Depth : 0;
    }

    /// <summary>Counts a drain into this thread's stack (see <see cref="MaxThreadDrainDepth"/>).</summary>
    private static void EnterThreadDrain(DrainStack stack)
    {
        int deep = ++stack.Depth;
        if (RecordDrainDepthForTesting && deep > t_maxThreadDrainDepthForTesting)
            t_maxThreadDrainDepthForTesting = deep;
    }
}
