using System.Collections.Generic;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// A probe's finding: a parallel loop's body that interrupts its own thread (user code: a
/// <see cref="PersistentHeap.ForEachAllocated"/> visitor) broke the loop's wait for its other workers on the loop's own
/// thread: <see cref="PersistentHeap.ForEachAllocated"/> threw while they went on calling the visitor over the mapping,
/// and a Dispose right after unmapped under them (an access violation: the process died). The heap's parallel loops
/// (<see cref="InterruptShield.RunToItsEnd"/>) now end only once no body runs (<see cref="LoopBodies"/>). In a child
/// process (scenario "visitor-interrupts-its-loop").
/// </summary>
public sealed class InterruptingLoopBodyTests
{
    private static readonly Dictionary<string, string> NoEnvironment = new();
    private readonly ITestOutputHelper _output;

    public InterruptingLoopBodyTests(ITestOutputHelper output) => _output = output;

    [Fact]
    public void AVisitorThatInterruptsItsLoop_NeverRunsAfterTheScanEnded_AndDisposeIsSafe()
    {
        using var dir = new TempDirectory();
        (int code, string output) = TestProgram.RunChild(NoEnvironment, SafetyChild.Role, "visitor-interrupts-its-loop", dir.File("a.heap"));
        _output.WriteLine($"exit {code}: {output}");
        Assert.True(code == SafetyChild.Survived, $"exit {code}: {output}");

        // The control: the scan ends without waiting for its bodies, as before.
        (int controlCode, string controlOutput) = TestProgram.RunChild(NoEnvironment, SafetyChild.Role, "visitor-interrupts-its-loop", dir.File("control.heap"), "control");
        _output.WriteLine($"control (the scan does not wait for its bodies): exit {controlCode}: {controlOutput}");
        Assert.SkipWhen(controlCode == SafetyChild.Survived, "INCONCLUSIVE: the control (the scan does not wait for its bodies) survived");
    }
}
