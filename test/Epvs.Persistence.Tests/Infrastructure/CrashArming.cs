using System;

namespace Epvs.Persistence.Tests;

/// <summary>Arming crash points of a <see cref="SimulatedPersistenceDomain"/> for the random-point crash tests.</summary>
internal static class CrashArming
{
    /// <summary>
    /// Arms <paramref name="points"/> crash points drawn by <paramref name="random"/> between the domain's current count
    /// and <paramref name="estimate"/> (the count an unarmed run of the same workload reached), each with a seed from
    /// <paramref name="random"/>. A run with timed background work can end short of some of them.
    /// </summary>
    internal static void ArmBelowEstimate(this SimulatedPersistenceDomain domain, Random random, int points, long estimate)
    {
        for (int i = 0; i < points; i++)
        {
            domain.ArmCrash(random.NextInt64(domain.CrashPointCount, Math.Max(domain.CrashPointCount + 1, estimate)), random.Next());
        }
    }
}
