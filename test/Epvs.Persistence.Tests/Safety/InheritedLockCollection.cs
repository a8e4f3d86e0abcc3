using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// <see cref="InheritedLockTests"/> runs alone: its control sets a static hook (<see cref="HeapFileTestHooks.KeepLockUntilCloseForTesting"/>)
/// that every Dispose in the process reads, and it spawns a child process, whose fork would share the locks of files
/// other tests hold open at that moment.
/// </summary>
[CollectionDefinition(nameof(InheritedLockTests), DisableParallelization = true)]
public sealed class InheritedLockCollection
{
}
