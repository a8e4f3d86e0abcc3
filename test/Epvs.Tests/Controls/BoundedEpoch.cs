using System;
using System.Threading;

namespace Epvs.Tests;

/// <summary>
/// Control for the unbounded guarantee (G9): a FASTER-shaped epoch with a fixed 128-slot thread table and a fixed
/// 16-slot drain list, both of which spin while full. Test-only; its spins give up when <see cref="Cancel"/> is
/// called so a caught control does not burn a core for the rest of the run.
/// </summary>
public sealed class BoundedEpoch : IEpochUnderTest
{
    private const int TableSize = 128;
    private const int DrainSize = 16;
    private const int Stride = 16; // 16 longs = 128 bytes between slots
    private const long Free = long.MaxValue;
    private const long Busy = long.MaxValue - 1;

    private readonly long[] table = new long[TableSize * Stride];
    private readonly long[] drainEpochs = new long[DrainSize];
    private readonly Action?[] drainActions = new Action?[DrainSize];
    private readonly ThreadLocal<int> slot = new(() => -1);
    private long current = 1;
    private volatile bool cancelled;

    public BoundedEpoch()
    {
        for (int i = 0; i < DrainSize; i++)
            drainEpochs[i] = Free;
    }

    public string Name => "control: fixed 128-slot table, 16-slot drain list";

    public void Cancel() => cancelled = true;

    public void Resume()
    {
        var spinner = new SpinWait();
        while (true)
        {
            long e = Volatile.Read(ref current);
            for (int i = 0; i < TableSize; i++)
            {
                if (Interlocked.CompareExchange(ref table[i * Stride], e, 0) == 0)
                {
                    slot.Value = i;
                    return;
                }
            }
            if (cancelled)
                throw new OperationCanceledException("table full");
            spinner.SpinOnce();
        }
    }

    public void Suspend()
    {
        Volatile.Write(ref table[slot.Value * Stride], 0);
        Interlocked.MemoryBarrier();
        Drain();
    }

    public void Bump(Action action)
    {
        long prior = Interlocked.Increment(ref current) - 1;
        var spinner = new SpinWait();
        while (true)
        {
            for (int i = 0; i < DrainSize; i++)
            {
                if (Interlocked.CompareExchange(ref drainEpochs[i], Busy, Free) == Free)
                {
                    drainActions[i] = action;
                    Volatile.Write(ref drainEpochs[i], prior);
                    Drain();
                    return;
                }
            }
            Drain();
            if (cancelled)
                throw new OperationCanceledException("drain list full");
            spinner.SpinOnce();
        }
    }

    private void Drain()
    {
        long oldest = Volatile.Read(ref current);
        for (int i = 0; i < TableSize; i++)
        {
            long e = Volatile.Read(ref table[i * Stride]);
            if (e != 0 && e < oldest)
                oldest = e;
        }
        long safe = oldest - 1;
        for (int i = 0; i < DrainSize; i++)
        {
            long e = Volatile.Read(ref drainEpochs[i]);
            if (e <= safe && Interlocked.CompareExchange(ref drainEpochs[i], Busy, e) == e)
            {
                Action a = drainActions[i]!;
                drainActions[i] = null;
                Volatile.Write(ref drainEpochs[i], Free);
                a();
            }
        }
    }

    public void Dispose()
    {
        Cancel();
        slot.Dispose();
    }
}
