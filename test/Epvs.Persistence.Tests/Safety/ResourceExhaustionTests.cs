using System;
using System.Collections.Generic;
using System.IO;
using System.Text.RegularExpressions;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// Resource exhaustion (a probe's findings). A structure's write that meets a managed <see cref="OutOfMemoryException"/>
/// must leave the heap as if it had not happened: the block it allocated stayed allocated but untracked (its header
/// reached the file, its payload was never written), and the next open refused the heap as inconsistent; a queue's
/// failed Enqueue became durable. Operations now make room in their lists before they allocate. And a creation that
/// cannot fsync its directory because the process is out of file descriptors must fail (README: "Create makes the new
/// file's name durable (the directory's fsync) or fails and removes the file"): it succeeded.
/// </summary>
public sealed class ResourceExhaustionTests
{
    private readonly ITestOutputHelper _output;

    public ResourceExhaustionTests(ITestOutputHelper output) => _output = output;

    [Theory]
    [InlineData("map-write-out-of-managed-memory")]
    [InlineData("queue-write-out-of-managed-memory")]
    public void WriteThatThrowsOutOfMemory_LeavesTheHeapOpenableWithTheAcknowledgedWrites(string scenario)
    {
        using var dir = new TempDirectory();
        string path = dir.File("a.heap");
        var environment = new Dictionary<string, string> { ["DOTNET_GCHeapHardLimit"] = "0x6000000" };
        (int code, string output) = TestProgram.RunChild(environment, ExhaustionChild.Role, scenario, path);
        _output.WriteLine($"exit {code}: {output}");
        Assert.SkipWhen(code == ExhaustionChild.Inconclusive, "no write met an OutOfMemoryException");
        Assert.Equal(ExhaustionChild.Done, code);
        long acknowledged = long.Parse(Regex.Match(output, @"acknowledged (\d+)").Groups[1].Value, System.Globalization.CultureInfo.InvariantCulture);

        using BufferedDurableHeap heap = BufferedDurableHeap.Open(path, new HeapFileOptions { MaxSize = 256L << 20, Domain = PersistenceDomainKind.MappedFile });
        if (scenario.StartsWith("map", StringComparison.Ordinal))
        {
            var map = new PersistentHashMap<long, long>(heap, typeId: 1);
            Assert.Equal(acknowledged, map.Count);
            for (long k = 0; k < acknowledged; k++)
            {
                Assert.True(map.TryGetValue(k, out long value) && value == k + 1, $"key {k}");
            }
        }
        else
        {
            var queue = new PersistentQueue<long>(heap, typeId: 1);
            long[] elements = queue.ToArray();
            Assert.Equal(acknowledged, elements.Length);
            for (long k = 0; k < acknowledged; k++)
            {
                Assert.Equal(k, elements[k]);
            }
        }
    }

    [Fact]
    public void Create_WithOneFileDescriptorLeft_FailsAndRemovesTheFile_InsteadOfSkippingTheDirectorySync()
    {
        Assert.SkipUnless(OperatingSystem.IsLinux(), "the directory fsync and RLIMIT_NOFILE are Linux's here");
        using var dir = new TempDirectory();
        string path = dir.File("a.heap");
        (int code, string output) = TestProgram.RunChildUnderDescriptorLimit(400, ExhaustionChild.Role, "create-one-descriptor-left", path);
        _output.WriteLine($"exit {code}: {output}");
        Assert.Equal(ExhaustionChild.Done, code);
        Assert.Contains("refused: IOException", output, StringComparison.Ordinal);
        Assert.Contains("exists False", output, StringComparison.Ordinal);
    }
}
