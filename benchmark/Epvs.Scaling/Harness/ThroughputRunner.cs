using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Linq;
using System.Threading;

namespace Epvs.Scaling.Harness;

/// <summary>
/// Runs one measurement point: <c>threads</c> dedicated threads run a worker until told to stop after a fixed time;
/// throughput is the operations they report divided by the measured wall time. Repeated, median reported.
/// </summary>
public static class ThroughputRunner
{
    private static readonly TimeSpan JoinBound = TimeSpan.FromSeconds(60);

    /// <summary>Measures a point and returns the median throughput in million operations per second.</summary>
    /// <param name="settings">Duration, repetitions and warm-up.</param>
    /// <param name="threads">Worker threads.</param>
    /// <param name="setup">Creates the state of one run (a fresh data structure) and returns the worker body, called on
    /// each worker thread with its index; it returns the operations it completed.</param>
    public static Measurement Measure(RunSettings settings, int threads, Func<RunContext> setup)
    {
        if (settings.Warmup > TimeSpan.Zero)
            RunOnce(threads, settings.Warmup, setup);
        var samples = new List<double>();
        for (int r = 0; r < settings.Repetitions; r++)
            samples.Add(RunOnce(threads, settings.Duration, setup));
        samples.Sort();
        return new Measurement(samples[samples.Count / 2], samples.ToArray());
    }

    /// <summary>One run: the throughput in Mops/s.</summary>
    public static double RunOnce(int threads, TimeSpan duration, Func<RunContext> setup)
    {
        using RunContext context = setup();
        var stop = new StopFlag();
        long operations = 0;
        Exception? failure = null;
        using var start = new Barrier(threads + 1);
        var workers = new Thread[threads];
        for (int t = 0; t < threads; t++)
        {
            int index = t;
            workers[t] = new Thread(() =>
            {
                try
                {
                    start.SignalAndWait();
                    long done = context.Worker(index, stop);
                    Interlocked.Add(ref operations, done);
                }
                catch (Exception ex)
                {
                    Interlocked.CompareExchange(ref failure, ex, null);
                    stop.Set();
                }
            })
            { IsBackground = true, Name = $"worker {t}" };
            workers[t].Start();
        }

        start.SignalAndWait();
        var clock = Stopwatch.StartNew();
        Thread.Sleep(duration);
        stop.Set();
        foreach (Thread w in workers)
        {
            if (!w.Join(JoinBound))
                throw new TimeoutException($"A worker did not stop within {JoinBound.TotalSeconds} s (stuck transition?).");
        }
        clock.Stop();
        if (failure is not null)
            throw new InvalidOperationException("A worker failed.", failure);
        return Interlocked.Read(ref operations) / clock.Elapsed.TotalSeconds / 1e6;
    }
}

/// <summary>The state of one run and its worker body.</summary>
/// <param name="Worker">Runs on worker thread <c>index</c> until the flag is set; returns completed operations.</param>
/// <param name="Cleanup">Disposes the run's state after the workers have stopped.</param>
public sealed record RunContext(Func<int, StopFlag, long> Worker, Action? Cleanup = null) : IDisposable
{
    /// <inheritdoc/>
    public void Dispose() => Cleanup?.Invoke();
}

/// <summary>A measured point: the median and every sample (Mops/s).</summary>
public sealed record Measurement(double Median, double[] Samples)
{
    /// <summary>Spread of the samples relative to the median, for the tables.</summary>
    public double RelativeSpread => Samples.Length < 2 || Median == 0 ? 0 : (Samples.Max() - Samples.Min()) / Median;
}
