using Xunit;

// The stress tests each use every core of a small machine; running them side by side only adds noise and makes the
// thread pool (used by the samples' background copies and flushes) slower to respond.
[assembly: CollectionBehavior(DisableTestParallelization = true)]
