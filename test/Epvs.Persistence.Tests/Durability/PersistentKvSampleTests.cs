using System;
using System.IO;
using Epvs.Samples.PersistentKv;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>The PersistentKv sample's whole story (write under load, SIGKILL, reopen, compare with the op log) as the Tour runs it.</summary>
public sealed class PersistentKvSampleTests
{
    private readonly ITestOutputHelper _output;

    public PersistentKvSampleTests(ITestOutputHelper output) => _output = output;

    [Fact]
    public void Demo_ShortRunKilledWithSigkill_RecoversAPrefixThatMatchesTheOpLog()
    {
        var text = new StringWriter();
        PersistentKvDemoResult result = PersistentKvDemo.Run(TimeSpan.FromSeconds(1), text);
        _output.WriteLine(text.ToString());
        Assert.Equal("SIGKILL of a child process", result.CrashKind);
        Assert.True(result.MatchesOpLog, text.ToString());
        Assert.True(result.SurvivingOperations > 0, "nothing survived: the demo showed nothing");
        Assert.True(result.RecoveredVersion >= result.LastSyncedVersion);
    }
}
