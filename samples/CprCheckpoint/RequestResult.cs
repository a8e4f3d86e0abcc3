namespace Epvs.Samples.CprCheckpoint;

/// <summary>What a store did with a client request.</summary>
public enum RequestResult
{
    /// <summary>The request was new and its effect was applied.</summary>
    Applied,

    /// <summary>The client's request with this sequence number (or a later one) had already been applied: nothing
    /// was done (de-duplication).</summary>
    Duplicate,
}
