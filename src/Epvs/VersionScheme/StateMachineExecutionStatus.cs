namespace Epvs;

/// <summary>The outcome of asking an <see cref="EpochProtectedVersionScheme"/> to start a state machine.</summary>
public enum StateMachineExecutionStatus
{
    /// <summary>The machine was started; it completes on its own (see <see cref="VersionSchemeStateMachine.Completion"/>).</summary>
    Ok,

    /// <summary>Another machine is active; try again after leaving or refreshing protection. Nothing was started.</summary>
    Retry,

    /// <summary>The target version has already been reached or is claimed by the active machine; do not retry. The machine
    /// is completed without having run (its <see cref="VersionSchemeStateMachine.Completion"/> completes successfully, its
    /// <see cref="VersionSchemeStateMachine.ActualToVersion"/> stays -1), and passing it again throws.</summary>
    Fail,

    /// <summary>FASTER.core's name for <see cref="Ok"/>.</summary>
    [System.Obsolete("FASTER.core's name; use StateMachineExecutionStatus.Ok.")]
    OK = Ok,

    /// <summary>FASTER.core's name for <see cref="Retry"/>.</summary>
    [System.Obsolete("FASTER.core's name; use StateMachineExecutionStatus.Retry.")]
    RETRY = Retry,

    /// <summary>FASTER.core's name for <see cref="Fail"/>.</summary>
    [System.Obsolete("FASTER.core's name; use StateMachineExecutionStatus.Fail.")]
    FAIL = Fail,
}
