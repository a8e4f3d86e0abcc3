using System.Threading;

namespace Epvs;

/// <summary>
/// A <see cref="SpinWait"/> for waits that must not throw. <see cref="Thread.Interrupt"/> breaks SpinWait's sleeps
/// (<see cref="ThreadInterruptedException"/>), which in the middle of a protocol step would leave it half done; this
/// wait absorbs the interrupt and keeps waiting (the sleeps stay: unlike a bare yield loop, they let a preempted thread
/// of any priority run), and <see cref="End"/> requests it again, so the thread's next interruptible wait still sees it.
/// </summary>
internal struct UninterruptibleSpinWait
{
    private SpinWait spinner;
    private bool interrupted;

    public void SpinOnce()
    {
        try
        {
            spinner.SpinOnce();
        }
        catch (ThreadInterruptedException)
        {
            interrupted = true; // the sleep is cut short: the caller looks again and spins on
        }
    }

    /// <summary>Requests again the interrupt this wait absorbed, if any: it surfaces at the thread's next wait.</summary>
    public readonly void End()
    {
        if (interrupted)
            Thread.CurrentThread.Interrupt();
    }
}
