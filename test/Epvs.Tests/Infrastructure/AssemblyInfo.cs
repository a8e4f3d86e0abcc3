using Xunit;

// The concurrency tests need both cores: running them side by side would starve the interleavings they look for
// (and the litmus test's two threads must run at the same time).
[assembly: CollectionBehavior(DisableTestParallelization = true)]
