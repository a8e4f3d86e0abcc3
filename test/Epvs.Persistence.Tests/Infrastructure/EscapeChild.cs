using System;
using System.Threading;

namespace Epvs.Persistence.Tests;

/// <summary>
/// Child-process scenarios for <see cref="FinalizerEscapeTests"/>: an exception that leaves a finalizer (or another
/// thread the library owns) ends the process (exit 134, SIGABRT, "Unhandled exception"). Each scenario returns
/// <see cref="Survived"/> when the process lived through a full collection and its finalizers.
/// </summary>
internal static class EscapeChild
{
    internal const string Role = "escape";
    internal const int Survived = 0;

    internal static int Run(string scenario)
    {
        AppDomain.CurrentDomain.UnhandledException += (_, e) => Console.WriteLine($"unhandled on thread '{Thread.CurrentThread.Name}': {e.ExceptionObject}");
        switch (scenario)
        {
            case "simulated-bad-length":
                // A documented ArgumentOutOfRangeException from the public constructor...
                Abandon(() => new SimulatedPersistenceDomain(100));
                break;
            case "simulated-no-memory":
                // ...or an OutOfMemoryException (calloc of a capacity the machine cannot give).
                Abandon(() => new SimulatedPersistenceDomain(64, 1L << 60));
                break;
            default:
                throw new ArgumentException($"unknown scenario {scenario}");
        }

        // The half-built object is garbage: its finalizer runs here.
        for (int i = 0; i < 3; i++)
        {
            GC.Collect();
            GC.WaitForPendingFinalizers();
        }

        Console.WriteLine("survived the finalizers");
        return Survived;
    }

    private static void Abandon(Func<object> create)
    {
        try
        {
            _ = create();
            Console.WriteLine("WRONG: the constructor did not throw");
        }
        catch (Exception e)
        {
            Console.WriteLine($"constructor threw {e.GetType().Name} (as documented)");
        }
    }
}
