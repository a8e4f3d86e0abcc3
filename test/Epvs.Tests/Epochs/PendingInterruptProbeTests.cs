using System.Threading;
using Xunit;

namespace Epvs.Tests;

/// <summary>The probe the interrupt tests rely on: it must see a pending interrupt, consume it, and see none after.</summary>
public class PendingInterruptProbeTests
{
    [Fact]
    public void TryConsume_SeesAPendingInterruptOnce()
    {
        bool before = true, pending = false, after = true;
        var thread = new Thread(() =>
        {
            before = PendingInterrupt.TryConsume();
            Thread.CurrentThread.Interrupt();
            pending = PendingInterrupt.TryConsume();
            after = PendingInterrupt.TryConsume();
        });
        thread.Start();
        Assert.True(thread.Join(GuardedThread.DefaultTimeout));
        Assert.False(before);
        Assert.True(pending);
        Assert.False(after);
    }
}
