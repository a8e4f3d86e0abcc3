using System;
using System.Threading;

namespace Epvs.Persistence.Tests;

/// <summary>
/// Child-process scenarios for <see cref="BackgroundThreadOutOfMemoryTests"/>: a failure on the heap's own background
/// threads (the stocker, the advancer) whose handler cannot itself complete, as when the process is out of managed
/// memory and the handler's first allocation (the message of the exception it records) throws
/// <see cref="OutOfMemoryException"/> again. The heap must record a failure and stay fail-stop; an exception that leaves
/// the thread kills the process (exit 134, SIGABRT, "Unhandled exception").
/// </summary>
internal static class BackgroundFaultChild
{
    internal const string Role = "background-fault";
    internal const int Survived = 0;
    internal const int WrongOutcome = 3;

    internal static int Run(string scenario, string path)
    {
        AppDomain.CurrentDomain.UnhandledException += (_, e) => Console.WriteLine($"unhandled on thread '{Thread.CurrentThread.Name}': {e.ExceptionObject.GetType().Name}\n{((Exception)e.ExceptionObject).StackTrace}");
        const int Acknowledged = 1000;
        var fileOptions = new HeapFileOptions { Size = 1L << 20, Domain = PersistenceDomainKind.MappedFile };
        var options = new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromMilliseconds(20), SyncTimeout = TimeSpan.FromSeconds(10) };
        BufferedDurableHeap heap = BufferedDurableHeap.Create(path, fileOptions, options);
        var map = new PersistentHashMap<long, long>(heap, typeId: 1);
        for (long k = 0; k < Acknowledged; k++)
        {
            map.Set(k, k * 3);
        }

        heap.Sync();
        Thread thread;
        switch (scenario)
        {
            case "stocker":
                thread = heap.StockerForTesting!;
                heap.StockingForTesting = () => throw new OutOfMemoryWhileDescribedException();
                heap.WakeStockerForTesting();
                break;
            case "advancer":
                thread = heap.AdvancerForTesting!;
                heap.BeforeSealForTesting = _ => throw new OutOfMemoryWhileDescribedException();
                try
                {
                    map.Set(-1, -1);
                }
                catch (InvalidOperationException)
                {
                    // A cycle after the Sync (the reclamation it leaves, the sweep log's mark) may have failed already: the heap refuses.
                }
                break;
            default:
                throw new ArgumentException($"unknown scenario {scenario}");
        }

        // The thread ends after its failure (or the process dies here if the failure escaped it).
        if (!thread.Join(TimeSpan.FromSeconds(10)))
        {
            Console.WriteLine($"the {scenario} did not end after its failure");
            return WrongOutcome;
        }

        int wrong = 0;
        try
        {
            heap.Sync();
            Console.WriteLine("WRONG: Sync succeeded after the background failure");
            wrong++;
        }
        catch (InvalidOperationException e)
        {
            Console.WriteLine($"Sync: {e.GetType().Name}");
        }

        try
        {
            heap.Dispose();
            Console.WriteLine("Dispose returned");
        }
        catch (InvalidOperationException e)
        {
            Console.WriteLine($"Dispose: {e.GetType().Name}");
        }

        using BufferedDurableHeap again = BufferedDurableHeap.Open(path, fileOptions);
        var reopened = new PersistentHashMap<long, long>(again, typeId: 1);
        for (long k = 0; k < Acknowledged; k++)
        {
            if (!reopened.TryGetValue(k, out long v) || v != k * 3)
            {
                Console.WriteLine($"WRONG: acknowledged key {k} lost");
                wrong++;
                break;
            }
        }

        return wrong == 0 ? Survived : WrongOutcome;
    }

    /// <summary>
    /// An out-of-memory failure whose description fails on the heap's own threads: reading <see cref="Message"/> there
    /// throws another <see cref="OutOfMemoryException"/>, as the
    /// string interpolation of a handler that records it does when the managed heap is exhausted (GCHeapHardLimit,
    /// a container's memory limit) while another thread keeps allocating.
    /// </summary>
    private sealed class OutOfMemoryWhileDescribedException : OutOfMemoryException
    {
        // Another of its kind: memory stays exhausted on that thread, so a handler that describes the second failure
        // (the advancer's cycle records a fault, then its loop records what that recording threw) fails again.
        public override string Message => Thread.CurrentThread.Name is { } name && name.StartsWith("epvs-", StringComparison.Ordinal)
            ? throw new OutOfMemoryWhileDescribedException()
            : "a simulated failure (described on the heap's own threads, it throws OutOfMemoryException)";
    }
}
