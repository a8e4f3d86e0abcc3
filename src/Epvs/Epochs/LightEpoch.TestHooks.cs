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

    /// <summary>
    /// Test-only: restores the old Dispose, which treated an epoch as disposed as soon as a Dispose began (so a
    /// registration ran every pending action, and Resume/Bump threw, while a Dispose that would fail was still
    /// checking), so the lifecycle test can show that it catches that. Read only on cold paths.
    /// </summary>
    internal static bool LegacyDisposeForTesting;

    /// <summary>
    /// Test-only: keeps drain nesting per thread across all instances (as before), so the nested-drain test can show
    /// that it catches an action stranded on another epoch. Read only on the drain path.
    /// </summary>
    internal static bool SharedDrainDepthForTesting;

    /// <summary>Test-only: runs on the disposing thread while Dispose is Closing (free slots marked, not decided).</summary>
    internal System.Action? ClosingHookForTesting;

    /// <summary>Test-only: the instance id used to index per-thread records.</summary>
    internal int DebugId => id;
}
