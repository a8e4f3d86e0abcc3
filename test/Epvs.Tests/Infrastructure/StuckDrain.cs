using System;
using Xunit;

namespace Epvs.Tests;

/// <summary>
/// For tests of waits that only a drain on the waiting thread itself can end (G4: nobody else calls anything): runs the
/// body on its own thread, reports whether it got stuck, then unsticks it by draining from the calling thread.
/// </summary>
internal static class StuckDrain
{
    /// <summary>
    /// Runs <paramref name="body"/> on a new thread and waits for it at most <paramref name="wait"/>. Then runs
    /// <paramref name="resetControl"/> (a test hook switched on for a control; also when starting fails) and, if the
    /// thread is still running, bumps <paramref name="epoch"/> from this thread until it ends.
    /// </summary>
    /// <returns>Null if the thread finished in time, else <paramref name="describeStuck"/>'s account of what stayed stuck.</returns>
    internal static string? RunThenUnstick(LightEpoch epoch, Action body, string name, TimeSpan wait, Func<string> describeStuck, Action? resetControl = null)
    {
        GuardedThread worker;
        string? stuck = null;
        try
        {
            worker = GuardedThread.Start(body, name);
            if (!worker.TryJoin(wait))
                stuck = describeStuck();
        }
        finally
        {
            resetControl?.Invoke();
        }
        if (stuck is not null)
        {
            Assert.True(
                Bounded.TryWaitUntil(() => { epoch.BumpCurrentEpoch(); return worker.TryJoin(TimeSpan.FromMilliseconds(10)); }, GuardedThread.DefaultTimeout),
                $"{name}: stayed stuck even with the test thread draining");
        }
        return stuck;
    }

    /// <summary>Runs <paramref name="deepest"/> inside a chain of <paramref name="nesting"/> deferred actions, each registering the next (each chain level one drain deeper).</summary>
    internal static void AtDrainDepth(LightEpoch epoch, int nesting, Action deepest)
    {
        if (nesting > 0)
            epoch.BumpCurrentEpoch(() => AtDrainDepth(epoch, nesting - 1, deepest));
        else
            deepest();
    }
}
