using System;
using System.Collections.Generic;
using System.Reflection;
using System.Threading;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// A probe's finding: a parallel loop's body that interrupts its own thread (user code: a
/// <see cref="PersistentHeap.ForEachAllocated"/> visitor) broke the loop's wait for its other workers on the loop's own
/// thread: <see cref="PersistentHeap.ForEachAllocated"/> threw while they went on calling the visitor over the mapping,
/// and a Dispose right after unmapped under them (an access violation: the process died). The heap's parallel loops
/// (<see cref="InterruptShield.RunToItsEnd"/>) now end only once no body runs (<see cref="LoopBodies"/>). In a child
/// process (scenario "visitor-interrupts-its-loop").
/// </summary>
public sealed class InterruptingLoopBodyTests
{
    private static readonly Dictionary<string, string> NoEnvironment = new();
    private readonly ITestOutputHelper _output;

    public InterruptingLoopBodyTests(ITestOutputHelper output) => _output = output;

    [Fact]
    public void AVisitorThatInterruptsItsLoop_NeverRunsAfterTheScanEnded_AndDisposeIsSafe()
    {
        using var dir = new TempDirectory();
        (int code, string output) = TestProgram.RunChild(NoEnvironment, SafetyChild.Role, "visitor-interrupts-its-loop", dir.File("a.heap"));
        _output.WriteLine($"exit {code}: {output}");
        Assert.True(code == SafetyChild.Survived, $"exit {code}: {output}");

        // The control: the scan ends without waiting for its bodies, as before. Whether a body runs after the scan ended
        // is timing: up to five children, stopping at the first that dies.
        (int controlCode, _, int children) = SafetyChild.RunControlUntilItDies("visitor-interrupts-its-loop", dir, _output, children: 5);
        Assert.SkipWhen(controlCode == SafetyChild.Survived, $"INCONCLUSIVE: the control (the scan does not wait for its bodies) survived in {children} children");
    }

    /// <summary>
    /// A review's finding: the last body out pulses the closing thread under a lock, and its thread may carry the interrupt
    /// its body raised (the case <see cref="LoopBodies"/> is for). With the lock contended (here held by the test, as in
    /// the closer's window between its read of the count and its wait) a plain lock threw that interrupt before the pulse;
    /// the count was 0, nothing pulsed again, and Close waited for ever. The pulse's lock now absorbs it. The control is
    /// the plain lock (<see cref="LoopBodies.ExitPulsesWithoutShieldForTesting"/>).
    /// </summary>
    [Fact]
    public void TheLastBodyOut_WithAnInterruptPendingAndTheLockContended_StillWakesClose()
    {
        Assert.True(CloseReturns(control: false, out string outcome), outcome);
        _output.WriteLine(outcome);

        bool controlReturned = CloseReturns(control: true, out string controlOutcome);
        _output.WriteLine($"control (a plain lock for the pulse): {controlOutcome}");
        Assert.False(controlReturned, $"INCONCLUSIVE: the control (a plain lock for the pulse) was not caught: {controlOutcome}");
    }

    private static bool CloseReturns(bool control, out string outcome)
    {
        LoopBodies.ExitPulsesWithoutShieldForTesting = control;
        try
        {
            var bodies = new LoopBodies();
            object gate = typeof(LoopBodies).GetField("_gate", BindingFlags.NonPublic | BindingFlags.Instance)!.GetValue(bodies)!;
            using var entered = new ManualResetEventSlim();
            using var go = new ManualResetEventSlim();
            int exiting = 0;
            Exception? fromExit = null;
            var body = new Thread(() =>
            {
                _ = bodies.TryEnter(); // true: not closed yet
                entered.Set();
                go.Wait();
                Thread.CurrentThread.Interrupt(); // the body's user code interrupts its own thread
                Volatile.Write(ref exiting, 1);
                try
                {
                    bodies.Exit();
                }
                catch (Exception e)
                {
                    fromExit = e;
                }
            })
            { IsBackground = true };
            body.Start();
            entered.Wait();
            var closer = new Thread(() => bodies.Close()) { IsBackground = true };
            closer.Start();
            var spin = new SpinWait();
            while ((closer.ThreadState & ThreadState.WaitSleepJoin) == 0)
            {
                spin.SpinOnce();
            }

            lock (gate)
            {
                // The closer waits (it released the lock in Monitor.Wait); the body exits with the lock held here: it
                // blocks on it (absorbing the interrupt), or throws and ends.
                go.Set();
                while (!(Volatile.Read(ref exiting) == 1 && (!body.IsAlive || (body.ThreadState & ThreadState.WaitSleepJoin) != 0)))
                {
                    spin.SpinOnce();
                }
            }

            Assert.True(body.Join(TimeSpan.FromSeconds(30)), "the body's Exit did not return");
            bool returned = closer.Join(TimeSpan.FromSeconds(control ? 5 : 30));
            outcome = $"Exit {(fromExit is null ? "returned" : $"threw {fromExit.GetType().Name}")}; Close {(returned ? "returned" : "still waits")}";
            return returned;
        }
        finally
        {
            LoopBodies.ExitPulsesWithoutShieldForTesting = false;
        }
    }
}
