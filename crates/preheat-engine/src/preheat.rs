//! Deadline-aware preheating of resolved runs (paper §3.3).
use preheat_model::AbsRun;

/// How far a preheat got.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PreheatReport {
    pub runs_done: u64,
    pub lines_done: u64,
    pub lines_total: u64,
    /// All lines were issued before the deadline.
    pub completed: bool,
    pub elapsed_ns: u64,
}

/// Prefetch `runs` in order (prefetcht0 per line; never faults), checking the clock every few
/// lines and stopping once `deadline_ns` (CLOCK_MONOTONIC) has passed.
pub fn preheat_runs(runs: &[AbsRun], deadline_ns: Option<u64>) -> PreheatReport {
    let _ = (runs, deadline_ns);
    unimplemented!()
}

/// Split `runs` into `parts` contiguous pieces with nearly equal line counts (runs may be cut).
pub fn split_runs(runs: &[AbsRun], parts: usize) -> Vec<Vec<AbsRun>> {
    let _ = (runs, parts);
    unimplemented!()
}

/// Baseline for benchmarks: a plain loop loading one byte of every line of sorted addresses.
pub fn plain_load(addrs: &[usize]) -> u64 {
    let _ = addrs;
    unimplemented!()
}

/// Persistent worker threads pinned to CPUs that preheat pieces of a working set in parallel.
pub struct ParallelPreheater {
    _private: (),
}

impl ParallelPreheater {
    /// Start one pinned worker per CPU in `cpus`. Allocates only here.
    pub fn new(cpus: &[usize]) -> std::io::Result<ParallelPreheater> {
        let _ = cpus;
        unimplemented!()
    }
    /// Preheat `pieces[i]` on worker i (the caller runs `local` itself) and wait for all.
    pub fn run(&self, local: &[AbsRun], pieces: &[&[AbsRun]], deadline_ns: Option<u64>) -> PreheatReport {
        let _ = (local, pieces, deadline_ns);
        unimplemented!()
    }
}
