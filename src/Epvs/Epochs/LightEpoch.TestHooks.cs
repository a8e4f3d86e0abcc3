namespace Epvs;

public sealed unsafe partial class LightEpoch
{
    /// <summary>
    /// Test-only: skips the second look (and its process-wide barrier) that a bumper takes when its action is left
    /// pending, which turns the lost-wakeup race it closes back on, so the self-stepping test can show that its
    /// checker catches it. Read only on that cold path.
    /// </summary>
    internal static bool DisableLeaveRaceGuardForTesting;

    /// <summary>
    /// Test-only: skips the re-announcement after a bump slipped between reading the epoch and announcing it, which
    /// lets a nested Enter trust a stale announcement, so the randomized stress test can show that it catches that.
    /// Read only on that cold path.
    /// </summary>
    internal static bool DisableReannounceForTesting;

    /// <summary>Test-only: the instance id used to index per-thread records.</summary>
    internal int DebugId => id;
}
