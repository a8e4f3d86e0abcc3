using System.Collections.Generic;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// An exception that leaves a finalizer ends the process. A <see cref="SimulatedPersistenceDomain"/> whose public
/// constructor threw (a length that is not a multiple of 64, documented as ArgumentOutOfRangeException; or calloc out of
/// memory) is still finalized: its constructor chains with <c>: this(Allocate(...), ...)</c>, so the argument throws
/// before the field initializers ran, and <c>~SimulatedPersistenceDomain</c> → <c>Dispose(false)</c> →
/// <c>InterruptShield.Hold(_gate)</c> locks a null gate: ArgumentNullException on the finalizer thread, exit 134. A check
/// of an order (the finalizer always runs), not a race: no control needed.
/// </summary>
public sealed class FinalizerEscapeTests
{
    private static readonly Dictionary<string, string> NoEnvironment = new();
    private readonly ITestOutputHelper _output;

    public FinalizerEscapeTests(ITestOutputHelper output) => _output = output;

    [Theory]
    [InlineData("simulated-bad-length")]
    [InlineData("simulated-no-memory")]
    public void SimulatedDomain_ConstructorThrew_FinalizerDoesNotEndTheProcess(string scenario)
    {
        (int code, string output) = TestProgram.RunChild(NoEnvironment, EscapeChild.Role, scenario);
        _output.WriteLine($"exit {code}: {output}");
        Assert.True(code == EscapeChild.Survived, $"exit {code} (134 = an exception left a finalizer): {output}");
    }
}
