using System;
using System.Diagnostics;
using System.Threading;
using System.Threading.Tasks;

namespace Epvs.Persistence;

/// <summary>
/// Work that a caller's thread does for the whole heap, which must run to its end once begun: an advance cycle's
/// write-back, seals, frontier and reclamation (a <see cref="BufferedDurableHeap.Sync()"/>, back-pressure), the
/// transition's critical section, a sweep, a format or a stocking for an allocation, a Strict operation's write-back.
/// <see cref="Thread.Interrupt"/> of a thread inside such work broke its next blocking wait (a contended lock, most
/// often the domain's fence gate) with <see cref="ThreadInterruptedException"/>, which left the work half done — and so
/// failed the whole heap for good: nothing more became durable. Inside a shield (<see cref="Enter"/>) the heap's waits
/// (<see cref="Hold"/>, <see cref="Lock"/>, <see cref="Wait"/>, <see cref="SpinOnce"/>) absorb the interrupt and wait on;
/// the outermost shield requests it again as it ends, so the thread's next interruptible wait outside the heap's work
/// (its own, or the heap's outside a shield, which have changed nothing when they throw) still sees it. Outside a
/// shield they are the plain waits. A wait costs nothing more until an interrupt (an exception filter); a scope costs
/// two thread-static accesses, so scopes sit on slow paths (a refill, a spill, a cycle, a Dispose), not per operation.
/// Every Dispose runs in one scope (an interrupt there skipped the unmapping and the release of the file lock, or failed
/// the last advance), and so do the ends of work that must not be left half done (a sweep's end, a failed open's stop
/// of the stocker); their timed waits (<see cref="TryLock"/>, <see cref="Join"/>, <see cref="WaitFor"/>) go on with what
/// is left of their timeout after an interrupt. No delegates: a Dispose must not fail to allocate before it has closed
/// the file.
/// </summary>
internal static class InterruptShield
{
    [ThreadStatic]
    private static int t_depth;

    [ThreadStatic]
    private static bool t_absorbed;

    /// <summary>Test-only (the calling thread's): the heap's waits let the interrupt through even inside a shield, as before; the tests' control.</summary>
    [ThreadStatic]
    private static bool t_interruptibleForTesting;

    /// <summary>Test-only: the calling thread's waits let interrupts through inside shields too (the broken control).</summary>
    internal static bool InterruptibleForTesting
    {
        get => t_interruptibleForTesting;
        set => t_interruptibleForTesting = value;
    }

    /// <summary>Test hook: runs on a thread whose wait inside a shield caught an interrupt (absorbed or, for a control, let through).</summary>
    internal static Action? InterruptCaughtForTesting { get; set; }

    /// <summary>Begins work that must run to its end on this thread (nests); dispose the scope to end it.</summary>
    internal static Scope Enter()
    {
        t_depth++;
        return default;
    }

    /// <summary>Test-only: <see cref="RunToItsEnd"/> runs its loop on the calling thread, as before (the broken control).</summary>
    internal static bool RunLoopsInlineForTesting { get; set; }

    /// <summary>
    /// Runs <paramref name="loop"/> (a <see cref="Parallel"/> loop over the heap's memory: recovery's scans and
    /// rebuilds, an enumeration) on a thread of its own and waits for it to end, absorbing interrupts (the outermost
    /// shield requests them again), then throws what the loop threw. On the calling thread, an interrupt broke the
    /// loop's wait for its workers: the loop threw while they went on, and the open that called it failed and unmapped
    /// the file under them, which crashed the process (an access violation). A body can interrupt the loop's own thread
    /// too (user code in it: a visitor, a filter, a key's hash), which broke the same wait there: so the call ends only
    /// once no body runs, whatever the loop's wait did (see <see cref="LoopBodies"/>).
    /// </summary>
    /// <param name="loop">The loop; each of its bodies (and thread-local finallies) wrapped by the given <see cref="LoopBodies"/>' <c>Guard</c>.</param>
    /// <param name="degreeOfParallelism">The loop's: at 1 it runs on the calling thread, inside a shield (such a loop has
    /// no workers to wait for, and its frees go to the caller's cache, as they always did).</param>
    /// <remarks>Of the exceptions the loop's bodies threw (a <see cref="Parallel"/> loop gathers them in an
    /// <see cref="AggregateException"/>), one is thrown as itself, not wrapped: the opens document their exceptions, and
    /// an <see cref="AggregateException"/> of an <see cref="OutOfMemoryException"/> (a probe's open under a managed
    /// memory limit) was none of them. The file's damage first (<see cref="HeapFileException"/>, the structures'
    /// <see cref="System.IO.InvalidDataException"/>), so that one worker's failure (out of memory, a key's user code)
    /// never hides what another found wrong with the file; else the first.</remarks>
    internal static void RunToItsEnd(Action<LoopBodies> loop, int degreeOfParallelism)
    {
        var bodies = new LoopBodies();
        try
        {
            RunToItsEndWrapped(() => loop(bodies), degreeOfParallelism);
        }
        catch (AggregateException e) when (e.InnerExceptions.Count > 0)
        {
            Exception picked = e.InnerExceptions[0];
            foreach (Exception inner in e.InnerExceptions)
            {
                if (inner is HeapFileException or System.IO.InvalidDataException)
                {
                    picked = inner;
                    break;
                }
            }

            System.Runtime.ExceptionServices.ExceptionDispatchInfo.Throw(picked);
        }
        finally
        {
            // Whatever the loop did: its wait for its workers is not to be trusted (see LoopBodies).
            bodies.Close();
        }
    }

    /// <summary><see cref="RunToItsEnd"/>, throwing what the loop threw as it is.</summary>
    private static void RunToItsEndWrapped(Action loop, int degreeOfParallelism)
    {
        if (RunLoopsInlineForTesting)
        {
            loop();
            return;
        }

        if (degreeOfParallelism <= 1)
        {
            RunShielded(loop);
            return;
        }

        // The exception itself, captured on the caller's thread: capturing allocates, and an allocation that fails on
        // the worker (out of memory) would escape its thread and end the process.
        Exception? failure = null;
        var worker = new Thread(() =>
        {
            try
            {
                loop();
            }
            catch (Exception e)
            {
                failure = e;
            }
        })
        { IsBackground = true, Name = "epvs-parallel-loop" };
        try
        {
            worker.Start();
        }
        catch (OutOfMemoryException)
        {
            // No thread to be had (the process's thread limit, memory): on the calling thread, as before, rather than fail.
            RunShielded(loop);
            return;
        }

        using (Enter())
        {
            Join(worker, Timeout.InfiniteTimeSpan);
        }

        if (failure is not null)
        {
            System.Runtime.ExceptionServices.ExceptionDispatchInfo.Throw(failure);
        }
    }

    /// <summary>Runs <paramref name="loop"/> on the calling thread inside a shield.</summary>
    private static void RunShielded(Action loop)
    {
        using (Enter())
        {
            loop();
        }
    }

    /// <summary><see cref="Monitor.Enter(object)"/> that absorbs an interrupt inside a shield.</summary>
    internal static void Lock(object gate)
    {
        while (true)
        {
            bool taken = false;
            try
            {
                Monitor.Enter(gate, ref taken);
                return;
            }
            catch (ThreadInterruptedException) when (Absorbs())
            {
                if (taken)
                {
                    return;
                }
            }
        }
    }

    /// <summary>
    /// <see cref="Monitor.TryEnter(object, TimeSpan)"/> that absorbs an interrupt inside a shield and waits on for what
    /// is left of <paramref name="timeout"/>.
    /// </summary>
    internal static bool TryLock(object gate, TimeSpan timeout)
    {
        long start = Stopwatch.GetTimestamp();
        while (true)
        {
            bool taken = false;
            try
            {
                Monitor.TryEnter(gate, Left(start, timeout), ref taken);
                return taken;
            }
            catch (ThreadInterruptedException) when (Absorbs())
            {
                if (taken)
                {
                    return true;
                }
            }
        }
    }

    /// <summary><see cref="Thread.Join(TimeSpan)"/> that absorbs an interrupt inside a shield and waits on for what is left of <paramref name="timeout"/>.</summary>
    internal static bool Join(Thread thread, TimeSpan timeout)
    {
        long start = Stopwatch.GetTimestamp();
        while (true)
        {
            try
            {
                return thread.Join(Left(start, timeout));
            }
            catch (ThreadInterruptedException) when (Absorbs())
            {
            }
        }
    }

    /// <summary><see cref="Task.Wait(TimeSpan)"/> that absorbs an interrupt inside a shield and waits on for what is left of <paramref name="timeout"/>.</summary>
    internal static bool WaitFor(Task task, TimeSpan timeout)
    {
        long start = Stopwatch.GetTimestamp();
        while (true)
        {
            try
            {
                return task.Wait(Left(start, timeout));
            }
            catch (ThreadInterruptedException) when (Absorbs())
            {
            }
        }
    }

    /// <summary><see cref="Lock"/> as a scope: <c>using (InterruptShield.Hold(gate)) { … }</c> for <c>lock (gate) { … }</c>.</summary>
    internal static Held Hold(object gate)
    {
        Lock(gate);
        return new Held(gate);
    }

    /// <summary>
    /// <see cref="Monitor.Wait(object, TimeSpan)"/> (the caller holds <paramref name="gate"/>) that absorbs an interrupt
    /// inside a shield: it returns then as after a pulse (callers look at their condition again, as after any wake).
    /// </summary>
    internal static bool Wait(object gate, TimeSpan timeout)
    {
        try
        {
            return Monitor.Wait(gate, timeout);
        }
        catch (ThreadInterruptedException) when (Absorbs())
        {
            // Monitor.Wait reacquires the lock before it throws.
            return true;
        }
    }

    /// <summary><see cref="SpinWait.SpinOnce()"/> (which sleeps at times) that absorbs an interrupt inside a shield.</summary>
    internal static void SpinOnce(ref SpinWait spinner)
    {
        try
        {
            spinner.SpinOnce();
        }
        catch (ThreadInterruptedException) when (Absorbs())
        {
        }
    }

    /// <summary>
    /// For an exception filter around a wait this class does not wrap (a concurrent collection's lock, say): whether an
    /// interrupt just caught is absorbed (inside a shield: the caller retries its call, which changed nothing).
    /// </summary>
    internal static bool Absorbs()
    {
        if (t_depth == 0)
        {
            return false;
        }

        InterruptCaughtForTesting?.Invoke();
        if (t_interruptibleForTesting)
        {
            return false;
        }

        t_absorbed = true;
        return true;
    }

    /// <summary>What is left of <paramref name="timeout"/> since <paramref name="start"/> (infinite stays infinite).</summary>
    private static TimeSpan Left(long start, TimeSpan timeout)
    {
        if (timeout == Timeout.InfiniteTimeSpan)
        {
            return timeout;
        }

        TimeSpan left = timeout - Stopwatch.GetElapsedTime(start);
        return left < TimeSpan.Zero ? TimeSpan.Zero : left;
    }

    private static void Exit()
    {
        // Never below 0 (a scope disposed twice, or a default one): a negative depth would absorb every later interrupt.
        if (t_depth == 0)
        {
            return;
        }

        if (--t_depth == 0 && t_absorbed)
        {
            t_absorbed = false;
            Thread.CurrentThread.Interrupt();
        }
    }

    /// <summary>The work's extent (see <see cref="Enter"/>).</summary>
    internal readonly struct Scope : IDisposable
    {
        public void Dispose() => Exit();
    }

    /// <summary>A monitor held through <see cref="Hold"/>.</summary>
    internal readonly struct Held : IDisposable
    {
        private readonly object _gate;

        internal Held(object gate) => _gate = gate;

        public void Dispose() => Monitor.Exit(_gate);
    }
}
