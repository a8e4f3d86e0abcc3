using System;
using System.Threading;
using Epvs.Samples.ResizableArray;
using Epvs.Samples.Tests.Infrastructure;
using Xunit;

namespace Epvs.Samples.Tests.ResizableArray;

public sealed class ResizableArrayTests
{
    private const int Seed = 4242;
    private const int Threads = 4;
    private const int OperationsPerThread = 12_000;
    private const int Rounds = 3;

    private readonly ITestOutputHelper output;

    public ResizableArrayTests(ITestOutputHelper output) => this.output = output;

    public static TheoryData<ResizableArrayKind> Kinds()
    {
        var data = new TheoryData<ResizableArrayKind>();
        foreach (ResizableArrayKind kind in ResizableArrayFactory.AllKinds)
            data.Add(kind);
        return data;
    }

    [Theory]
    [MemberData(nameof(Kinds))]
    public void ConcurrentPushReadWrite_EveryVariant_MatchesOracle(ResizableArrayKind kind)
    {
        for (int round = 0; round < Rounds; round++)
        {
            int seed = Seed + 100 * round;
            output.WriteLine($"{kind}: round {round}, seed {seed}, {Threads} threads x {OperationsPerThread} ops, initial capacity 1");
            // Capacity 1 so the array grows through many resizes while the other threads work (the mock is preallocated).
            using IResizableArray array = ResizableArrayFactory.Create(kind, 1, mockCapacity: Threads * OperationsPerThread);
            ViolationLog violations = ResizableArrayOracle.Check(array, Threads, OperationsPerThread, seed);
            output.WriteLine($"  count {array.Count}, capacity {array.Capacity}: {violations.Describe()}");
            Assert.True(violations.Count == 0, $"{array.Name}, seed {seed}: {violations.Describe()}");
        }
    }

    [Fact]
    public void ConcurrentPushReadWrite_UnprotectedResizeControl_IsCaught()
    {
        // The same oracle must catch a resize that skips EPVS, or the test above proves nothing.
        const int Attempts = 5;
        for (int attempt = 0; attempt < Attempts; attempt++)
        {
            int seed = Seed + attempt;
            using var control = new UnprotectedResizeControlArray(1);
            ViolationLog violations = ResizableArrayOracle.Check(control, Threads, OperationsPerThread, seed);
            output.WriteLine($"control attempt {attempt}, seed {seed}: {violations.Describe()}");
            if (violations.Count > 0)
                return;
        }
        Assert.Fail($"Inconclusive: control not caught. The oracle found no violation in {Attempts} runs of an array whose resize skips EPVS, so its passes on the real variants prove nothing.");
    }

    [Fact]
    public void TwoPhaseResize_WhileCopying_PushesGoToNewArrayAndWritesWaitForRest()
    {
        using var array = new TwoPhaseEpvsResizableArray(4);
        for (int i = 0; i < 4; i++)
            Assert.Equal(i, array.Push(100 + i));

        using var gate = new ManualResetEventSlim(false);
        array.CopyGateForTesting = gate;

        // The 5th push starts the growth machine; it returns while the copy is still held back.
        Assert.Equal(4, array.Push(104));
        Assert.Equal(TwoPhaseEpvsResizableArray.Copying, array.Scheme.CurrentState.Phase);
        Assert.Equal(8, array.Capacity);
        for (int i = 5; i < 8; i++)
            Assert.Equal(i, array.Push(100 + i)); // more pushes during COPYING, into the new array's upper half
        for (int i = 0; i < 8; i++)
            Assert.Equal(100 + i, array.Read(i)); // old indices from the old array, new ones from the new
        array.Write(6, 206); // an index the copy never touches: no need to wait

        using var writeReturned = new ManualResetEventSlim(false);
        GuardedThread writer = Workers.Start("writer", () =>
        {
            array.Write(1, 201); // an index being copied: must wait for REST
            writeReturned.Set();
        });
        // One-sided check (cannot fail spuriously): while the copy is held, the write must not have returned.
        Assert.False(writeReturned.Wait(TimeSpan.FromMilliseconds(200)), "A write to an index being copied returned during COPYING.");
        Assert.Equal(TwoPhaseEpvsResizableArray.Copying, array.Scheme.CurrentState.Phase);

        gate.Set();
        writer.Join();
        array.CopyGateForTesting = null;
        Assert.Equal(VersionSchemeState.Rest, array.Scheme.CurrentState.Phase);
        Assert.Equal(2, array.Scheme.CurrentState.Version);
        Assert.Equal(201, array.Read(1));
        Assert.Equal(206, array.Read(6));
        Assert.Equal(8, array.Push(108)); // and it grows again
        Assert.Equal(16, array.Capacity);
    }

    [Fact]
    public void SimplePush_PastCapacity_ResizesOnceForEachDoubling()
    {
        using var array = new SimpleEpvsResizableArray(1);
        for (int i = 0; i < 8; i++)
            Assert.Equal(i, array.Push(i + 1));

        Assert.Equal(8, array.Capacity);
        Assert.Equal(4, array.Scheme.CurrentState.Version); // 1 -> 2 -> 4 -> 8: three resizes after version 1
        for (int i = 0; i < 8; i++)
            Assert.Equal(i + 1, array.Read(i));
    }

    [Theory]
    [MemberData(nameof(Kinds))]
    public void Read_IndexNotBelowCount_ThrowsArgumentOutOfRange(ResizableArrayKind kind)
    {
        using IResizableArray array = ResizableArrayFactory.Create(kind, 4);
        array.Push(7);

        Assert.Throws<ArgumentOutOfRangeException>(() => array.Read(1));
        Assert.Throws<ArgumentOutOfRangeException>(() => array.Read(-1));
        Assert.Throws<ArgumentOutOfRangeException>(() => array.Write(1, 0));
        Assert.Equal(7, array.Read(0));
    }

    [Fact]
    public void LatchFreeMockPush_PastItsCapacity_ThrowsInvalidOperation()
    {
        using var array = new LatchFreeMockResizableArray(2);
        array.Push(1);
        array.Push(2);

        var ex = Assert.Throws<InvalidOperationException>(() => array.Push(3));
        Assert.Contains("never grows", ex.Message);
    }

    [Fact]
    public void PinnedSessionPush_ThatResizes_CompletesOnceTheOtherPinnedSessionRefreshes()
    {
        using var array = new EpvsPinnedResizableArray(1);
        array.Push(1);
        using var otherPinned = new ManualResetEventSlim(false);
        using var release = new ManualResetEventSlim(false);
        GuardedThread other = Workers.Start("pinned reader", () =>
        {
            using IResizableArraySession session = array.OpenSession();
            Assert.Equal(1, session.Read(0));
            otherPinned.Set();
            // Keep refreshing (as a pinned worker must) until the test is done.
            while (!release.IsSet)
            {
                session.Refresh();
                Thread.Yield();
            }
        });
        Assert.True(otherPinned.Wait(Workers.Timeout));

        using (IResizableArraySession session = array.OpenSession())
            Assert.Equal(1, session.Push(2)); // needs a resize, which waits for the other session's Refresh

        release.Set();
        other.Join();
        Assert.Equal(2, array.Read(1));
    }
}
