using System.Collections.Generic;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// Out of managed memory on the heap's own threads (a probe's finding). Under <c>DOTNET_GCHeapHardLimit=0x2000000</c>, a
/// burst of 2 million upserts in one version made the stocker's stocking throw <see cref="System.OutOfMemoryException"/>
/// while the writer kept allocating; the stocker's catch then allocated the message of the fault it records
/// (<c>$"...{e.Message}"</c>), which threw again and left the thread: "Unhandled exception" on <c>epvs-stocker</c>, the
/// process aborted (exit 134) in about 1 run in 10. The advancer's catch has the same shape. A failure on a background
/// thread must fail the heap (fail-stop: Sync and Dispose say so, the acknowledged data reopens), never the process.
/// The child stands for the second OutOfMemoryException with a fault whose Message throws it, deterministically (a
/// check of an order, not a race: no control needed). Both threads now record the fault without allocating first, and
/// have an outermost catch.
/// </summary>
public sealed class BackgroundThreadOutOfMemoryTests
{
    private static readonly Dictionary<string, string> NoEnvironment = new();
    private readonly ITestOutputHelper _output;

    public BackgroundThreadOutOfMemoryTests(ITestOutputHelper output) => _output = output;

    [Theory]
    [InlineData("stocker")]
    [InlineData("advancer")]
    public void BackgroundThread_FaultWhoseHandlerRunsOutOfMemory_FailsTheHeapNotTheProcess(string thread)
    {
        using var dir = new TempDirectory();
        (int code, string output) = TestProgram.RunChild(NoEnvironment, BackgroundFaultChild.Role, thread, dir.File("a.heap"));
        _output.WriteLine($"exit {code}: {output}");
        Assert.True(code == BackgroundFaultChild.Survived, $"exit {code} (134 = an exception left the {thread}'s thread): {output}");
    }
}
