using System;
using System.Threading.Tasks;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// Recovery's parallel loops throw what their bodies threw, as itself: a probe's open under a managed memory limit
/// (<c>DOTNET_GCHeapHardLimit</c>) threw an <see cref="AggregateException"/> wrapping the
/// <see cref="OutOfMemoryException"/>, a type no open documents (the structures' rebuild already unwrapped its own).
/// Every recovery loop runs through <see cref="InterruptShield.RunToItsEnd"/>, on a thread of its own or inline.
/// </summary>
public sealed class RecoveryLoopExceptionTests
{
    [Theory]
    [InlineData(1)]
    [InlineData(2)]
    public void RunToItsEnd_ThrowsTheBodysException_NotAnAggregate(int parallelism)
    {
        var fault = new OutOfMemoryException("simulated: a recovery loop's allocation");
        Exception thrown = Assert.ThrowsAny<Exception>(() => InterruptShield.RunToItsEnd(
            bodies => Parallel.For(0, 8, new ParallelOptions { MaxDegreeOfParallelism = parallelism }, bodies.Guard<int>(i =>
            {
                if (i == 3)
                {
                    throw fault;
                }
            })),
            parallelism));
        Assert.Same(fault, thrown);
    }

    [Fact]
    public void RunToItsEnd_ThrowsTheFilesDamage_NotAnotherWorkersFailure()
    {
        // Two bodies fail together (the barrier holds both until both run): one out of memory, one finding the file
        // damaged. The damage is what the open must report.
        var damage = new System.IO.InvalidDataException("the file's damage");
        using var both = new System.Threading.Barrier(2);
        Exception thrown = Assert.ThrowsAny<Exception>(() => InterruptShield.RunToItsEnd(
            bodies => Parallel.For(0, 2, new ParallelOptions { MaxDegreeOfParallelism = 2 }, bodies.Guard<int>(i =>
            {
                Assert.True(both.SignalAndWait(TimeSpan.FromSeconds(30)), "the two bodies never ran together");
                throw i == 0 ? new OutOfMemoryException("simulated") : damage;
            })),
            2));
        Assert.Same(damage, thrown);
    }

    /// <summary>
    /// The picker, deterministically: the loop's aggregate lists another worker's failure first (as a Parallel loop
    /// does when that worker recorded first). The barrier test above catches a picker that takes the first only when
    /// the out-of-memory happened to be recorded first.
    /// </summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public void RunToItsEnd_ThrowsTheFilesDamage_WhenAnotherFailureIsListedFirst(bool heapFile)
    {
        Exception damage = heapFile
            ? new HeapFileException(HeapFileError.Corrupt, "the file's damage")
            : new System.IO.InvalidDataException("the file's damage");
        Exception thrown = Assert.ThrowsAny<Exception>(() => InterruptShield.RunToItsEnd(
            _ => throw new AggregateException(new OutOfMemoryException("simulated"), new InvalidCastException("a key's user code"), damage),
            1));
        Assert.Same(damage, thrown);
    }
}
