namespace Epvs;

public sealed partial class EpochProtectedVersionScheme
{
    /// <summary>
    /// Test-only: lets the scheme ask a machine that has reached its target for another step (in the window between
    /// publishing its final state and retiring it), so the regression test can show that it catches that. Read only
    /// on the cold stepping path.
    /// </summary>
    internal static bool DisableFinishedMachineGuardForTesting;
}
