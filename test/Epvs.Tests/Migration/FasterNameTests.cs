using Xunit;

namespace Epvs.Tests;

/// <summary>The [Obsolete] FASTER.core names compile and mean the same as the .NET-cased ones.</summary>
public sealed class FasterNameTests
{
#pragma warning disable CS0618 // the point of the test: the obsolete FASTER names
    [Fact]
    public void FasterNames_MapToTheSameValues()
    {
        Assert.Equal(StateMachineExecutionStatus.Ok, StateMachineExecutionStatus.OK);
        Assert.Equal(StateMachineExecutionStatus.Retry, StateMachineExecutionStatus.RETRY);
        Assert.Equal(StateMachineExecutionStatus.Fail, StateMachineExecutionStatus.FAIL);
        Assert.Equal(VersionSchemeState.Rest, VersionSchemeState.REST);

        using var scheme = new EpochProtectedVersionScheme();
        Assert.Equal(StateMachineExecutionStatus.OK, scheme.TryAdvanceVersionWithCriticalSection((_, _) => { }));
        Assert.Equal(VersionSchemeState.REST, scheme.CurrentState.Phase);
    }
#pragma warning restore CS0618
}
