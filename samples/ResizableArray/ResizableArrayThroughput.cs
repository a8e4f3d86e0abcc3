using System;
using System.Diagnostics;
using System.Threading;

namespace Epvs.Samples.ResizableArray;

/// <summary>
/// A small thread-scaling driver for the demo and the Tour: prefills the array, then runs worker threads that each
/// open a session and issue a random mix of pushes, reads and writes (reads and writes on prefilled indices), refreshing
/// the session every 64 operations. Not a benchmark (use the harness under benchmark/ for published figures).
/// </summary>
public static class ResizableArrayThroughput
{
    private const int Batch = 64;

    /// <summary>Runs the mix on <paramref name="array"/>.</summary>
    /// <param name="array">A fresh array (it is prefilled here).</param>
    /// <param name="threads">Worker threads.</param>
    /// <param name="duration">How long to measure.</param>
    /// <param name="pushPercent">Percentage of pushes; the rest is half reads, half writes.</param>
    /// <param name="prefill">Elements pushed before measuring (the indices reads and writes use).</param>
    /// <param name="seed">Seed of the workers' random streams (worker i uses seed + i).</param>
    /// <returns>What was measured.</returns>
    public static ThroughputResult Run(IResizableArray array, int threads, TimeSpan duration, int pushPercent, int prefill, int seed)
    {
        ArgumentNullException.ThrowIfNull(array);
        ArgumentOutOfRangeException.ThrowIfLessThan(threads, 1);
        ArgumentOutOfRangeException.ThrowIfLessThan(prefill, 1);
        for (int i = 0; i < prefill; i++)
            array.Push(i);

        // The mock cannot grow: give each worker an equal share of what is left, then turn its pushes into reads.
        long pushBudget = array is LatchFreeMockResizableArray ? (array.Capacity - array.Count) / threads : long.MaxValue;

        long operations = 0;
        int stop = 0;
        Exception? failure = null;
        using var start = new Barrier(threads + 1);
        var workers = new Thread[threads];
        for (int t = 0; t < threads; t++)
        {
            int workerSeed = seed + t;
            workers[t] = new Thread(() =>
            {
                long done = 0;
                try
                {
                    var random = new Random(workerSeed);
                    long pushesLeft = pushBudget;
                    start.SignalAndWait();
                    using IResizableArraySession session = array.OpenSession();
                    while (Volatile.Read(ref stop) == 0) // acquire: pairs with the release below
                    {
                        for (int i = 0; i < Batch; i++)
                        {
                            int dice = random.Next(100);
                            if (dice < pushPercent && pushesLeft > 0)
                            {
                                session.Push(dice);
                                pushesLeft--;
                            }
                            else if ((dice & 1) == 0)
                            {
                                session.Read(random.Next(prefill));
                            }
                            else
                            {
                                session.Write(random.Next(prefill), dice);
                            }
                        }
                        done += Batch;
                        session.Refresh();
                    }
                }
                catch (Exception ex)
                {
                    Interlocked.CompareExchange(ref failure, ex, null);
                }
                Interlocked.Add(ref operations, done);
            })
            { IsBackground = true, Name = $"{array.Name} worker {t}" };
            workers[t].Start();
        }

        start.SignalAndWait();
        var clock = Stopwatch.StartNew();
        Thread.Sleep(duration);
        Volatile.Write(ref stop, 1); // release
        foreach (Thread worker in workers)
        {
            if (!worker.Join(TimeSpan.FromSeconds(30)))
                throw new TimeoutException($"A {array.Name} worker did not stop within 30 s.");
        }
        clock.Stop();
        if (failure is not null)
            throw new InvalidOperationException($"A {array.Name} worker failed.", failure);
        return new ThroughputResult(array.Name, threads, Interlocked.Read(ref operations), clock.Elapsed.TotalSeconds, array.Count, array.Capacity);
    }
}
