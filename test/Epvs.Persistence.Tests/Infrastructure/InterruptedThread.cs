using System;
using System.Threading;
using Epvs.Tests;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// A thread that runs its work with an interrupt already pending (the first wait that blocks sees it), the interrupt
/// shield's control (<see cref="InterruptShield.InterruptibleForTesting"/>) set on it or not; once joined, what the work
/// threw and whether the interrupt was still pending on the thread afterwards.
/// </summary>
internal sealed class InterruptedThread
{
    internal InterruptedThread(Action work, bool control)
    {
        Thread = new Thread(() =>
        {
            InterruptShield.InterruptibleForTesting = control;
            Thread.CurrentThread.Interrupt();
            Failure = Record.Exception(work);
            InterruptShield.InterruptibleForTesting = false;
            InterruptPending = PendingInterrupt.TryConsume();
        })
        { IsBackground = true };
    }

    /// <summary>The thread (for hooks that look for it); start it with <see cref="Thread.Start()"/>.</summary>
    internal Thread Thread { get; }

    /// <summary>What the work threw (after the thread was joined).</summary>
    internal Exception? Failure { get; private set; }

    /// <summary>Whether the interrupt was pending when the work had ended (after the thread was joined).</summary>
    internal bool InterruptPending { get; private set; }
}
