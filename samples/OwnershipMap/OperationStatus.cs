namespace Epvs.Samples.OwnershipMap;

/// <summary>The outcome of an operation sent to one shard.</summary>
public enum OperationStatus
{
    /// <summary>The shard owns the key's bucket and executed the operation.</summary>
    Ok,

    /// <summary>The shard owns the key's bucket, executed the read, and the key has no value.</summary>
    NotFound,

    /// <summary>The shard does not own the key's bucket (now): nothing was executed. Route again.</summary>
    NotOwner,
}
