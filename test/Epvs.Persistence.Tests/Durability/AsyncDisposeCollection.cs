using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// <see cref="AsyncDisposeTests"/> runs alone: a control shortens <see cref="HeapFile.DisposeWait"/>, a static that every
/// Dispose in the process reads (another test's Dispose waiting for a call in flight would give up sooner).
/// </summary>
[CollectionDefinition(nameof(AsyncDisposeTests), DisableParallelization = true)]
public sealed class AsyncDisposeCollection
{
}
