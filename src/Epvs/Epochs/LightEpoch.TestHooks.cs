namespace Epvs;

public sealed partial class LightEpoch
{
    /// <summary>
    /// Test-only: skips the second look (and its process-wide barrier) that a bumper takes when its action is left
    /// pending, which turns the lost-wakeup race it closes back on, so the self-stepping test can show that its
    /// checker catches it. Read only on that cold path.
    /// </summary>
    internal static bool DisableLeaveRaceGuardForTesting;
}
