using System;
using System.Threading;
using System.Threading.Tasks;

namespace Epvs;

public sealed partial class EpochProtectedVersionScheme
{
    /// <summary>
    /// Advances the version with one critical section without blocking a thread: starts the transition (waiting
    /// asynchronously, not spinning, while another machine is active) and completes when it has completed.
    /// </summary>
    /// <param name="criticalSection">Called with the old and the new version, in mutual exclusion with every protected region that saw the old one.</param>
    /// <param name="targetVersion">The version to reach, or -1 for the next one.</param>
    /// <param name="cancellationToken">Stops waiting for another machine to finish; a transition already started is not cancelled (it completes on its own).</param>
    /// <returns>True once this critical section has run and the transition completed; false if the target version had
    /// already been reached or claimed by another machine. Faults with the critical section's exception if it threw (the
    /// scheme is back in the starting state, as for <see cref="AdvanceVersionWithCriticalSection"/>).</returns>
    /// <exception cref="ArgumentNullException"><paramref name="criticalSection"/> is null.</exception>
    /// <exception cref="InvalidOperationException">The calling thread is protected: the transition would wait for it,
    /// and protection belongs to a thread, so it must not be held across an <c>await</c>. Leave first.</exception>
    /// <exception cref="ObjectDisposedException">The scheme has been disposed.</exception>
    /// <exception cref="OperationCanceledException"><paramref name="cancellationToken"/> was cancelled before the transition started.</exception>
    public Task<bool> AdvanceVersionAsync(Action<long, long> criticalSection, long targetVersion = -1, CancellationToken cancellationToken = default)
    {
        if (criticalSection is null)
            ThrowHelper.ThrowArgumentNull(nameof(criticalSection));
        if (epoch.ThisInstanceProtected())
            ThrowHelper.ThrowInvalidOperation("AdvanceVersionAsync was called inside a protected region: the transition would wait for this thread, which may never leave while it awaits. Leave (or end the scope) first.");
        return AdvanceVersionCoreAsync(criticalSection, targetVersion, cancellationToken);
    }

    private async Task<bool> AdvanceVersionCoreAsync(Action<long, long> criticalSection, long targetVersion, CancellationToken cancellationToken)
    {
        while (true)
        {
            cancellationToken.ThrowIfCancellationRequested();
            var machine = new CriticalSectionStateMachine(criticalSection, targetVersion);
            switch (TryExecuteStateMachine(machine))
            {
                case StateMachineExecutionStatus.Ok:
                    await machine.Completion.ConfigureAwait(false);
                    return true;
                case StateMachineExecutionStatus.Fail:
                    return false;
            }

            // Retry: another machine is active. Wait for it (its fault is not ours), then try again.
            if (ActiveStateMachine is { } active)
            {
                Task cancelled = Task.Delay(Timeout.Infinite, cancellationToken);
                await Task.WhenAny(active.Completion, cancelled).ConfigureAwait(false);
            }
            else
            {
                await Task.Yield();
            }
        }
    }
}
