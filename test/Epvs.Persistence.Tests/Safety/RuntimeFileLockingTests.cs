using System.Collections.Generic;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// A probe's finding: the exclusive open rested on <see cref="System.IO.FileShare.None"/> alone, which the runtime's
/// documented switch System.IO.DisableFileLocking (DOTNET_SYSTEM_IO_DISABLEFILELOCKING=1, or the runtimeconfig property)
/// turns into no lock at all: one heap file then opened twice, both heaps wrote and synced, and the reopened file had
/// one heap's writes only. An open now takes the file's lock itself (flock). In a child process run with the switch
/// (scenario "open-twice-without-runtime-locking").
/// </summary>
public sealed class RuntimeFileLockingTests
{
    private static readonly Dictionary<string, string> WithoutRuntimeLocking = new() { ["DOTNET_SYSTEM_IO_DISABLEFILELOCKING"] = "1" };
    private readonly ITestOutputHelper _output;

    public RuntimeFileLockingTests(ITestOutputHelper output) => _output = output;

    [Fact]
    public void WithTheRuntimesFileLockingOff_AFileAlreadyOpen_IsRefused()
    {
        Assert.SkipUnless(System.OperatingSystem.IsLinux(), "flock and the runtime's switch: Unix (Linux here)");
        using var dir = new TempDirectory();
        (int code, string output) = TestProgram.RunChild(WithoutRuntimeLocking, SafetyChild.Role, "open-twice-without-runtime-locking", dir.File("a.heap"));
        _output.WriteLine($"exit {code}: {output}");
        Assert.SkipWhen(code == SafetyChild.Inconclusive, $"INCONCLUSIVE: the switch was not in effect in the child: {output}");
        Assert.True(code == SafetyChild.Survived, $"exit {code}: {output}");

        // The control: no lock of the heap's own, as before.
        (int controlCode, string controlOutput) = TestProgram.RunChild(WithoutRuntimeLocking, SafetyChild.Role, "open-twice-without-runtime-locking", dir.File("control.heap"), "control");
        _output.WriteLine($"control (no lock of its own): exit {controlCode}: {controlOutput}");
        Assert.True(controlCode == SafetyChild.WrongOutcome, $"INCONCLUSIVE: the control (no lock of its own) was not caught: exit {controlCode}: {controlOutput}");
    }

    /// <summary>A review's finding: an in-place create whose new file another opener locked first said InsufficientSpace
    /// (its full-disk filter took the AlreadyOpen for one); it says AlreadyOpen. Scenario "create-in-place-loses-the-lock".</summary>
    [Fact]
    public void AnInPlaceCreateThatLosesTheLock_SaysAlreadyOpen()
    {
        Assert.SkipUnless(System.OperatingSystem.IsLinux(), "flock and the runtime's switch: Unix (Linux here)");
        using var dir = new TempDirectory();
        (int code, string output) = TestProgram.RunChild(WithoutRuntimeLocking, SafetyChild.Role, "create-in-place-loses-the-lock", dir.File("a.heap"));
        _output.WriteLine($"exit {code}: {output}");
        Assert.SkipWhen(code == SafetyChild.Inconclusive, $"INCONCLUSIVE: the racer never locked the new file first: {output}");
        Assert.True(code == SafetyChild.Survived, $"exit {code}: {output}");
    }
}
