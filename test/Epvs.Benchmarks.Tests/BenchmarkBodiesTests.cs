using System.Linq;
using System.Reflection;
using BenchmarkDotNet.Attributes;
using Xunit;

namespace Epvs.Benchmarks.Tests;

/// <summary>What the benchmark classes measure and how their reports group them, checked without measuring.</summary>
public sealed class BenchmarkBodiesTests
{
    /// <summary>
    /// The suite runs with ConfigOptions.JoinSummary and groups by category: two classes whose baselines have no category
    /// share one logical group of the joined report, and every row of both takes its ratio from whichever baseline
    /// BenchmarkDotNet picks (ReaderLockBenchmarks' rows were divided by InSituEpochBenchmarks.Unprotected).
    /// </summary>
    [Fact]
    public void JoinedSuite_EachCategoryHasAtMostOneBaseline()
    {
        var baselines = typeof(LightEpochBenchmarks).Assembly.GetTypes()
            .SelectMany(t => t.GetMethods(BindingFlags.Public | BindingFlags.Instance | BindingFlags.DeclaredOnly))
            .Where(m => m.GetCustomAttribute<BenchmarkAttribute>() is { Baseline: true })
            .Select(m => (Method: m.DeclaringType!.Name + "." + m.Name, Category: Categories(m)))
            .ToList();

        var shared = baselines.GroupBy(b => b.Category).Where(g => g.Count() > 1)
            .Select(g => $"category '{g.Key}': {string.Join(", ", g.Select(b => b.Method))}").ToList();

        Assert.True(shared.Count == 0, "baselines sharing a logical group of the joined summary: " + string.Join("; ", shared));
    }

    /// <summary>
    /// Every class with a baseline groups its report by category and shows the category, as the joined report needs.
    /// </summary>
    [Fact]
    public void ClassesWithABaseline_GroupByCategory_AndShowIt()
    {
        var missing = typeof(LightEpochBenchmarks).Assembly.GetTypes()
            .Where(t => t.GetMethods().Any(m => m.GetCustomAttribute<BenchmarkAttribute>() is { Baseline: true }))
            .Where(t => t.GetCustomAttribute<GroupBenchmarksByAttribute>() is null || t.GetCustomAttribute<CategoriesColumnAttribute>() is null)
            .Select(t => t.Name)
            .ToList();

        Assert.True(missing.Count == 0, "without [GroupBenchmarksBy] or [CategoriesColumn]: " + string.Join(", ", missing));
    }

    private static string Categories(MethodInfo method) => string.Join("+",
        (method.GetCustomAttribute<BenchmarkCategoryAttribute>()?.Categories ?? [])
            .Concat(method.DeclaringType!.GetCustomAttribute<BenchmarkCategoryAttribute>()?.Categories ?? []));
}
