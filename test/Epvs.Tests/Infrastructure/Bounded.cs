using System;
using System.Diagnostics;
using System.Threading;
using Xunit;

namespace Epvs.Tests;

/// <summary>Bounded waits on a condition that another thread makes true (never a sleep standing in for a signal).</summary>
internal static class Bounded
{
    public static bool TryWaitUntil(Func<bool> condition, TimeSpan timeout)
    {
        var sw = Stopwatch.StartNew();
        var spinner = new SpinWait();
        while (!condition())
        {
            if (sw.Elapsed > timeout)
                return false;
            spinner.SpinOnce();
        }
        return true;
    }

    public static void WaitUntil(Func<bool> condition, string what, TimeSpan? timeout = null)
    {
        TimeSpan limit = timeout ?? GuardedThread.DefaultTimeout;
        Assert.True(TryWaitUntil(condition, limit), $"Timed out after {limit.TotalSeconds:0} s waiting for: {what}");
    }
}
