using System;
using System.CommandLine;
using System.IO;
using Xunit;

namespace Epvs.Samples.Tests.Cli;

/// <summary>The shared command-line helper: exit codes for a failed run and duration parsing.</summary>
public sealed class SampleCliTests
{
    [Fact]
    public void Invoke_RunThrows_ExitsOneAndSaysTheRunFailed()
    {
        var error = new StringWriter();
        int code = SampleCli.Invoke(new RootCommand("test"), [], TextWriter.Null, error, _ => throw new InvalidOperationException("disk full"));

        Assert.Equal(SampleCli.Failed, code);
        Assert.Contains("the run failed: InvalidOperationException: disk full", error.ToString(), StringComparison.Ordinal);
    }

    [Fact]
    public void Invoke_RunReportsFailure_ExitsOne()
    {
        Assert.Equal(1, SampleCli.Invoke(new RootCommand("test"), [], TextWriter.Null, TextWriter.Null, _ => SampleCli.Failed));
    }

    [Theory]
    [InlineData("3", 3000)]
    [InlineData("0.5", 500)]
    [InlineData("500ms", 500)]
    [InlineData("3s", 3000)]
    [InlineData("1.5m", 90_000)]
    [InlineData(" 2S ", 2000)]
    public void TryParseDuration_AcceptedForms(string text, double milliseconds)
    {
        Assert.True(SampleCli.TryParseDuration(text, out TimeSpan value));
        Assert.Equal(milliseconds, value.TotalMilliseconds, 6);
    }

    [Theory]
    [InlineData("")]
    [InlineData("s")]
    [InlineData("3h")]
    [InlineData("1,5")]
    [InlineData("Infinity")]
    [InlineData("NaN")]
    [InlineData("1e300")]
    public void TryParseDuration_RejectedForms(string text)
    {
        Assert.False(SampleCli.TryParseDuration(text, out _));
    }
}
