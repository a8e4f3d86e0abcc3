namespace Epvs.Samples.PersistentKv;

/// <summary>What one run of <see cref="PersistentKvDemo"/> showed.</summary>
public sealed class PersistentKvDemoResult
{
    internal PersistentKvDemoResult()
    {
    }

    /// <summary>How the writer was crashed: "SIGKILL of a child process" or "simulated power failure".</summary>
    public string CrashKind { get; internal set; } = string.Empty;

    /// <summary>Operations the writers logged before the crash.</summary>
    public long LoggedOperations { get; internal set; }

    /// <summary>The durable frontier recovery cut at.</summary>
    public long RecoveredVersion { get; internal set; }

    /// <summary>The last version any logged operation ran in.</summary>
    public long LastLoggedVersion { get; internal set; }

    /// <summary>The highest version a returned Sync covered.</summary>
    public long LastSyncedVersion { get; internal set; }

    /// <summary>Logged operations in versions at or below the recovered version (the survivors).</summary>
    public long SurvivingOperations { get; internal set; }

    /// <summary>Keys in the recovered map.</summary>
    public long RecoveredKeys { get; internal set; }

    /// <summary>Whether the recovered map equals the op log's prefix of versions ≤ <see cref="RecoveredVersion"/>, and no Sync was broken.</summary>
    public bool MatchesOpLog { get; internal set; }

    /// <summary>Recovery time in milliseconds.</summary>
    public double RecoveryMilliseconds { get; internal set; }
}
