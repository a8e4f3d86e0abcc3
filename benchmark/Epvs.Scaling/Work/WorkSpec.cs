namespace Epvs.Scaling.Work;

/// <summary>The protected-work microbenchmark's parameters (the paper's §6.2).</summary>
/// <param name="P">Probability that an operation triggers a version change (exclusive access).</param>
/// <param name="Rounds">Hash rounds of work inside each protected region.</param>
/// <param name="Depth">Nested acquisitions per operation (on distinct instances).</param>
/// <param name="Instances">Instances of the mechanism.</param>
/// <param name="Shared">Whether every thread uses instance 0 (else thread t uses instance t mod Instances).</param>
/// <param name="TableSize">Epoch table / visible-readers table size (0: the mechanism's default).</param>
/// <param name="CriticalRounds">Hash rounds of work in a version change's critical section(s), in total.</param>
/// <param name="Phases">Transitions per version change (EPVS state machine steps; 1 = one critical section).</param>
public sealed record WorkSpec(
    double P = 0,
    int Rounds = 1,
    int Depth = 1,
    int Instances = 1,
    bool Shared = true,
    int TableSize = 0,
    int CriticalRounds = 0,
    int Phases = 1)
{
    /// <summary>Instance used at nesting level <paramref name="level"/> by thread <paramref name="thread"/>.</summary>
    public int InstanceFor(int thread, int level) => ((Shared ? 0 : thread) + level) % Instances;
}
