using BenchmarkDotNet.Attributes;
using BenchmarkDotNet.Configs;
using FasterEpoch = FASTER.core.LightEpoch;
using FasterEpvs = FASTER.core.EpochProtectedVersionScheme;
using FasterMachine = FASTER.core.VersionSchemeStateMachine;
using FasterState = FASTER.core.VersionSchemeState;

namespace Epvs.Benchmarks;

/// <summary>
/// One run of a three-step state machine (REST v → PREPARE v → IN_PROGRESS v → REST v+1) with empty callbacks,
/// executed to completion by an unprotected thread with nobody else protected: the fixed cost of the machinery.
/// Each run creates its machine (machines are single-use on both sides), so allocation is reported, not zero.
/// </summary>
[MemoryDiagnoser]
[GroupBenchmarksBy(BenchmarkLogicalGroupRule.ByCategory)]
[CategoriesColumn]
public class StateMachineBenchmarks
{
    private EpochProtectedVersionScheme scheme = null!;
    private FasterEpoch fasterEpoch = null!;
    private FasterEpvs fasterScheme = null!;

    [GlobalSetup]
    public void Setup()
    {
        scheme = new EpochProtectedVersionScheme();
        fasterEpoch = new FasterEpoch();
        fasterScheme = new FasterEpvs(fasterEpoch);
    }

    [GlobalCleanup]
    public void Cleanup()
    {
        scheme.Dispose();
        fasterEpoch.Dispose();
    }

    [Benchmark(Baseline = true), BenchmarkCategory("3-phase state machine")]
    public long Faster_ThreePhaseMachine()
    {
        fasterScheme.ExecuteStateMachine(new FasterThreePhase(), spin: true);
        return fasterScheme.CurrentState().Version;
    }

    [Benchmark, BenchmarkCategory("3-phase state machine")]
    public long Epvs_ThreePhaseMachine()
    {
        scheme.ExecuteStateMachine(new ThreePhase(), spin: true);
        return scheme.CurrentState.Version;
    }

    private const byte Prepare = 1;
    private const byte InProgress = 2;

    private sealed class ThreePhase : VersionSchemeStateMachine
    {
        public override bool GetNextStep(VersionSchemeState currentState, out VersionSchemeState nextState)
        {
            nextState = currentState.Phase switch
            {
                VersionSchemeState.Rest => VersionSchemeState.Make(Prepare, currentState.Version),
                Prepare => VersionSchemeState.Make(InProgress, currentState.Version),
                _ => VersionSchemeState.Make(VersionSchemeState.Rest, ActualToVersion),
            };
            return true;
        }

        public override void OnEnteringState(VersionSchemeState fromState, VersionSchemeState toState)
        {
        }

        public override void AfterEnteringState(VersionSchemeState state)
        {
        }
    }

    private sealed class FasterThreePhase : FasterMachine
    {
        public FasterThreePhase()
            : base(-1)
        {
        }

        public override bool GetNextStep(FasterState currentState, out FasterState nextState)
        {
            nextState = currentState.Phase switch
            {
                FasterState.REST => FasterState.Make(Prepare, currentState.Version),
                Prepare => FasterState.Make(InProgress, currentState.Version),
                _ => FasterState.Make(FasterState.REST, actualToVersion),
            };
            return true;
        }

        public override void OnEnteringState(FasterState fromState, FasterState toState)
        {
        }

        public override void AfterEnteringState(FasterState state)
        {
        }
    }
}
