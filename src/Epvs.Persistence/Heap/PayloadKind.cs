namespace Epvs.Persistence;

/// <summary>What a payload block records (Montage's payload kinds).</summary>
public enum PayloadKind
{
    /// <summary>A new payload.</summary>
    Alloc = 1,

    /// <summary>A copy that replaces an older payload with the same uid (written when the old one belongs to an earlier epoch).</summary>
    Update = 2,

    /// <summary>An anti-payload: deletes the payload with the same uid once it is old enough.</summary>
    Delete = 3,
}
