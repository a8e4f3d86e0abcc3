using System;
using System.Linq;
using System.Reflection;
using BenchmarkDotNet.Attributes;
using Epvs.Persistence;
using Epvs.Persistence.Benchmarks;
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

    /// <summary>
    /// InSituEpochBenchmarks promises two dependent cache misses per operation in a table it only reads. Stored into
    /// the chain, the loop index (0..1023) would replace entries with small numbers, so the second load would land in
    /// the table's first 8 KB (a hit); a default run does hundreds of millions of operations per process against 2^25
    /// entries, so the body would change during the measurement, and the faster rows sooner than the slower ones.
    /// </summary>
    [Fact]
    public void InSitu_BodyDoesNotRewriteTheChainItWalks()
    {
        const int Entries = 1 << 25;
        var bench = new InSituEpochBenchmarks();
        bench.Setup();
        try
        {
            long[] table = (long[])typeof(InSituEpochBenchmarks).GetField("table", BindingFlags.NonPublic | BindingFlags.Instance)!.GetValue(bench)!;

            // 2^22 operations: an eighth of the table's size, a few tenths of one default iteration.
            for (int i = 0; i < 4096; i++)
            {
                bench.Unprotected();
            }

            long changed = 0;
            for (int i = 0; i < Entries; i++)
            {
                if (table[i] != (long)(((ulong)i * 0x9E37_79B9UL) & (Entries - 1)))
                {
                    changed++;
                }
            }

            Assert.True(changed == 0, $"{changed:N0} of {Entries:N0} chain entries ({100.0 * changed / Entries:0.0}%) were overwritten by 2^22 operations");
        }
        finally
        {
            bench.Cleanup();
        }
    }

    /// <summary>
    /// AllocateWritePersistBenchmarks' row "Mapped file (msync)" measures msync: its heap is mapped shared, not with the
    /// default MappedFileWriteBack.Auto, which on Linux maps privately and writes back with pwrite + fdatasync. That
    /// path has a row of its own.
    /// </summary>
    [Theory]
    [InlineData("_mappedFile", nameof(AllocateWritePersistBenchmarks.MappedFile), MappedFileWriteBack.SharedMapping, "msync")]
    [InlineData("_privateMappedFile", "MappedFilePrivate", MappedFileWriteBack.PrivateMapping, "pwrite")]
    public void AllocateWritePersist_MappedRows_UseTheMappingTheirLabelNames(string field, string method, MappedFileWriteBack expected, string label)
    {
        var bench = new AllocateWritePersistBenchmarks();
        try
        {
            try
            {
                bench.Setup();
            }
            catch (InvalidOperationException)
            {
                // No PMEM_IS_PMEM_FORCE in this process: the pmem heap is refused after the mapped ones were created.
            }

            var heap = (PersistentHeap?)typeof(AllocateWritePersistBenchmarks).GetField(field, BindingFlags.NonPublic | BindingFlags.Instance)?.GetValue(bench);
            Assert.NotNull(heap);
            Assert.Equal(expected, heap!.File.MappedFileWriteBack);
            BenchmarkAttribute? row = typeof(AllocateWritePersistBenchmarks).GetMethod(method)?.GetCustomAttribute<BenchmarkAttribute>();
            Assert.Contains(label, row?.Description ?? "(no such row)");
        }
        finally
        {
            bench.Cleanup();
        }
    }

    private static string Categories(MethodInfo method) => string.Join("+",
        (method.GetCustomAttribute<BenchmarkCategoryAttribute>()?.Categories ?? [])
            .Concat(method.DeclaringType!.GetCustomAttribute<BenchmarkCategoryAttribute>()?.Categories ?? []));
}
