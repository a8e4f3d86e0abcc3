using System;
using System.Diagnostics;
using System.Threading;
using System.Threading.Tasks;
using Epvs.Baselines;
using Xunit;

namespace Epvs.Benchmarks.Tests;

/// <summary>Correctness of the BRAVO baseline: it is only a fair baseline if it is a correct reader–writer lock.</summary>
public sealed class BravoReaderWriterLockTests
{
    private static readonly TimeSpan Bound = TimeSpan.FromSeconds(30);
    private readonly ITestOutputHelper output;

    public BravoReaderWriterLockTests(ITestOutputHelper output) => this.output = output;

    [Fact]
    public void EnterReadLock_Biased_TakesFastPathAndReleasesSlot()
    {
        var table = new VisibleReadersTable(64);
        using var bravo = new BravoReaderWriterLock(table);

        int token = bravo.EnterReadLock();

        Assert.InRange(token, 0, table.Size - 1);
        Assert.Same(bravo, table.Slots[token]);
        bravo.ExitReadLock(token);
        Assert.Null(table.Slots[token]);
    }

    [Fact]
    public void EnterWriteLock_Biased_RevokesBiasAndReadersLaterReenableIt()
    {
        using var bravo = new BravoReaderWriterLock(new VisibleReadersTable(64));

        bravo.EnterWriteLock();
        Assert.False(bravo.IsReadBiased);
        bravo.ExitWriteLock();

        // Slow-path readers re-enable the bias once the inhibit window (9x the revocation time) has passed.
        var clock = Stopwatch.StartNew();
        while (!bravo.IsReadBiased)
        {
            Assert.True(clock.Elapsed < Bound, "bias was never re-enabled");
            bravo.ExitReadLock(bravo.EnterReadLock());
        }
        Assert.True(bravo.EnterReadLock() is var t && t >= 0);
        bravo.ExitReadLock(t);
    }

    [Fact]
    public void EnterReadLock_ThreadOnlyHashing_NestedSecondLockCollidesAndTakesSlowPath()
    {
        var table = new VisibleReadersTable(4096);
        using var first = new BravoReaderWriterLock(table, BravoHashing.ThreadOnly);
        using var second = new BravoReaderWriterLock(table, BravoHashing.ThreadOnly);

        int outer = first.EnterReadLock();
        int inner = second.EnterReadLock();

        Assert.True(outer >= 0);
        Assert.Equal(BravoReaderWriterLock.SlowPathToken, inner); // same thread, same slot: the EPVS paper's Fig. 20 case
        second.ExitReadLock(inner);
        first.ExitReadLock(outer);
    }

    [Fact]
    public void EnterReadLock_ThreadAndLockHashing_NestedLocksMostlyUseTheFastPath()
    {
        var table = new VisibleReadersTable(4096);
        var locks = new BravoReaderWriterLock[4];
        var tokens = new int[locks.Length];
        for (int i = 0; i < locks.Length; i++)
            locks[i] = new BravoReaderWriterLock(table, BravoHashing.ThreadAndLock);

        for (int i = 0; i < locks.Length; i++)
            tokens[i] = locks[i].EnterReadLock();
        int fast = 0;
        for (int i = locks.Length - 1; i >= 0; i--)
        {
            if (tokens[i] >= 0)
                fast++;
            locks[i].ExitReadLock(tokens[i]);
            locks[i].Dispose();
        }

        // Distinct locks hash to distinct slots except by chance (1 in 4096 per pair).
        Assert.True(fast >= locks.Length - 1, $"only {fast} of {locks.Length} nested reads took the fast path");
    }

    [Fact]
    public void EnterWriteLock_FastPathReaderInside_WaitsUntilItLeaves()
    {
        using var bravo = new BravoReaderWriterLock(new VisibleReadersTable(64));
        using var readerIn = new ManualResetEventSlim();
        using var readerOut = new ManualResetEventSlim();
        int token = int.MinValue;
        Task reader = Task.Factory.StartNew(() =>
        {
            token = bravo.EnterReadLock();
            readerIn.Set();
            Assert.True(readerOut.Wait(Bound));
            bravo.ExitReadLock(token);
        }, TaskCreationOptions.LongRunning);
        Assert.True(readerIn.Wait(Bound));
        Assert.True(token >= 0, "reader did not take the fast path");

        Task writer = Task.Factory.StartNew(() =>
        {
            bravo.EnterWriteLock();
            bravo.ExitWriteLock();
        }, TaskCreationOptions.LongRunning);

        Assert.False(writer.Wait(TimeSpan.FromMilliseconds(200)), "the writer entered while a fast-path reader was inside");
        readerOut.Set();
        Assert.True(writer.Wait(Bound));
        Assert.True(reader.Wait(Bound));
    }

    [Fact]
    public void ReadersAndWriter_Concurrent_NeverOverlap()
    {
        ExclusionResult result = RunExclusion(skipScan: false, TimeSpan.FromSeconds(2));
        output.WriteLine(result.ToString());

        Assert.Equal(0, result.Violations);
        // The run must have exercised what it claims to test: fast-path readers and revocations.
        Assert.True(result.FastPathReads > 0, "no read took the fast path");
        Assert.True(result.Revocations > 0, "no write revoked the bias");
    }

    [Fact]
    public void ReadersAndWriter_ControlWithoutRevocationScan_IsCaught()
    {
        // The same test must catch a writer that does not wait for fast-path readers, or it proves nothing.
        ExclusionResult result = RunExclusion(skipScan: true, TimeSpan.FromSeconds(5), stopAtFirstViolation: true);
        output.WriteLine(result.ToString());

        Assert.SkipWhen(result.Violations == 0, "inconclusive: the broken control was not caught in this run");
        Assert.True(result.Violations > 0);
    }

    private sealed record ExclusionResult(long Writes, long Revocations, long FastPathReads, long SlowPathReads, long Violations)
    {
        public override string ToString() =>
            $"writes={Writes} revocations={Revocations} fast-path reads={FastPathReads} slow-path reads={SlowPathReads} violations={Violations}";
    }

    /// <summary>
    /// One writer and two readers. The writer, holding the write lock, checks no reader is inside and writes two
    /// fields; readers, holding a read lock, count themselves in and check the two fields agree. The writer pauses
    /// (spinning, not sleeping) between writes so that the bias comes back and fast-path readers are exercised.
    /// </summary>
    private static ExclusionResult RunExclusion(bool skipScan, TimeSpan duration, bool stopAtFirstViolation = false)
    {
        using var bravo = new BravoReaderWriterLock(new VisibleReadersTable(256)) { SkipRevocationScanForTesting = skipScan };
        long a = 0, b = 0;
        int inside = 0;
        long violations = 0, fast = 0, slow = 0, writes = 0, revocations = 0;
        int stop = 0;
        Exception? failure = null;

        void Reader()
        {
            try
            {
                long localFast = 0, localSlow = 0;
                while (Volatile.Read(ref stop) == 0)
                {
                    int token = bravo.EnterReadLock();
                    if (token >= 0) localFast++; else localSlow++;
                    Interlocked.Increment(ref inside);
                    long x = Volatile.Read(ref a);
                    Thread.SpinWait(20); // widen the window in which a writer could overlap
                    long y = Volatile.Read(ref b);
                    if (x != y)
                        Interlocked.Increment(ref violations);
                    Interlocked.Decrement(ref inside);
                    bravo.ExitReadLock(token);
                }
                Interlocked.Add(ref fast, localFast);
                Interlocked.Add(ref slow, localSlow);
            }
            catch (Exception ex)
            {
                Interlocked.CompareExchange(ref failure, ex, null);
            }
        }

        var readers = new[] { new Thread(Reader), new Thread(Reader) };
        foreach (Thread t in readers)
        {
            t.IsBackground = true;
            t.Start();
        }

        var clock = Stopwatch.StartNew();
        try
        {
            while (clock.Elapsed < duration && Volatile.Read(ref failure) is null)
            {
                bool biased = bravo.IsReadBiased;
                bravo.EnterWriteLock();
                if (biased)
                    revocations++;
                if (Volatile.Read(ref inside) != 0)
                    Interlocked.Increment(ref violations);
                writes++;
                Volatile.Write(ref a, writes);
                Thread.SpinWait(20);
                Volatile.Write(ref b, writes);
                bravo.ExitWriteLock();
                if (stopAtFirstViolation && Interlocked.Read(ref violations) > 0)
                    break;
                Thread.SpinWait(2000); // let the inhibit window pass so readers re-enable the bias
            }
        }
        finally
        {
            Volatile.Write(ref stop, 1);
            foreach (Thread t in readers)
                Assert.True(t.Join(Bound), "a reader did not stop");
        }
        if (failure is not null)
            throw new InvalidOperationException("a reader failed", failure);
        return new ExclusionResult(writes, revocations, fast, slow, Interlocked.Read(ref violations));
    }
}
