//! The end-of-run summary: what ran, how long, the checksum, and the truth by construction.
//!
//! NPB prints a verification block and a Mop/s figure; these stand-ins print instead what a
//! communication detector or coscheduler needs to be judged against: `truth` (the coscheduling
//! sets), `pattern` (which thread pairs share any page) and `pair_pages` (how many mailbox
//! pages each pair shares). See [`crate::pattern`] for their definitions.

use serde::Serialize;

use crate::pattern::{pair_page_matrix, pattern_matrix, truth};
use crate::run::{Mailbox, RunOutcome};
use crate::spec::{Kernel, Limit};

/// One thread's line of the summary.
#[derive(Debug, Clone, Serialize)]
pub struct ThreadSummary {
    /// Global index.
    pub index: usize,
    /// Kernel thread id.
    pub tid: u32,
    /// Thread name.
    pub name: String,
    /// Instance index.
    pub instance: usize,
    /// Rank within the instance.
    pub rank: usize,
    /// Iterations completed.
    pub iterations: u64,
    /// CPU seconds, if `/proc/thread-self/schedstat` was readable.
    pub cpu_s: Option<f64>,
    /// The thread's checksum, 16 hex digits.
    pub checksum: String,
}

/// The JSON summary printed at the end of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Kernel name.
    pub kernel: Kernel,
    /// Process id.
    pub pid: u32,
    /// Total threads.
    pub threads: usize,
    /// Instances.
    pub instances: usize,
    /// Ranks per instance.
    pub ranks_per_instance: usize,
    /// Seed.
    pub seed: u64,
    /// Compute units per iteration.
    pub work: u32,
    /// `--iterations`, if the run was bounded by iterations.
    pub iterations_limit: Option<u64>,
    /// `--seconds`, if the run was bounded by time.
    pub seconds_limit: Option<f64>,
    /// Fewest iterations any thread completed (all ranks of an instance complete the same).
    pub iterations: u64,
    /// From the common start time to the end of the last rank's last iteration, seconds.
    pub wall_s: f64,
    /// Per-thread CPU seconds, by index.
    pub cpu_s: Vec<Option<f64>>,
    /// Run checksum (threads' checksums folded in index order), 16 hex digits.
    pub checksum: String,
    /// True coscheduling sets, by thread index.
    pub truth: Vec<Vec<usize>>,
    /// Designed sharing: 1 where two threads share any page (mailbox or barrier).
    pub pattern: Vec<Vec<u8>>,
    /// Mailbox pages shared by each pair (barrier excluded).
    pub pair_pages: Vec<Vec<u32>>,
    /// Whether every pair of ranks of an instance shares a mailbox.
    pub pair_pages_all_to_all: bool,
    /// Per thread.
    pub per_thread: Vec<ThreadSummary>,
    /// Per instance: its shared region and the pages that carry the sharing (barrier and
    /// mailboxes), as hex addresses — for checking what a detector sampled.
    pub regions: Vec<RegionSummary>,
}

/// Where one instance's shared memory lives.
#[derive(Debug, Clone, Serialize)]
pub struct RegionSummary {
    /// Instance index.
    pub instance: usize,
    /// First address of the region.
    pub start: String,
    /// End of the region (exclusive).
    pub end: String,
    /// The barrier page, then the mailbox pages.
    pub shared_pages: Vec<String>,
}

fn seconds(ns: Option<u64>) -> Option<f64> {
    ns.map(|n| n as f64 / 1e9)
}

impl Summary {
    /// Summarise a finished run.
    pub fn new(run: &RunOutcome) -> Summary {
        let c = &run.config;
        let per_thread: Vec<ThreadSummary> = run
            .threads
            .iter()
            .map(|t| ThreadSummary {
                index: t.info.index,
                tid: t.info.tid,
                name: t.info.name.clone(),
                instance: t.info.instance,
                rank: t.info.rank,
                iterations: t.outcome.iterations,
                cpu_s: seconds(t.cpu_ns),
                checksum: format!("{:016x}", t.outcome.checksum),
            })
            .collect();
        let (iterations_limit, seconds_limit) = match c.limit {
            Limit::Iterations(n) => (Some(n), None),
            Limit::Seconds(d) => (None, Some(d.as_secs_f64())),
        };
        Summary {
            kernel: c.kernel,
            pid: run.pid,
            threads: c.threads,
            instances: c.instances,
            ranks_per_instance: c.ranks(),
            seed: c.seed,
            work: c.work,
            iterations_limit,
            seconds_limit,
            iterations: run.iterations(),
            wall_s: run.wall.as_secs_f64(),
            cpu_s: run.threads.iter().map(|t| seconds(t.cpu_ns)).collect(),
            checksum: format!("{:016x}", run.checksum()),
            truth: truth(c.kernel, c.threads, c.instances),
            pattern: pattern_matrix(c.kernel, &run.pattern, c.instances),
            pair_pages: pair_page_matrix(&run.pattern, c.instances, c.shared_pages),
            pair_pages_all_to_all: run.pattern.is_all_to_all(),
            per_thread,
            regions: run
                .regions
                .iter()
                .map(|r| RegionSummary {
                    instance: r.instance,
                    start: format!("{:#x}", r.range.start),
                    end: format!("{:#x}", r.range.end),
                    shared_pages: std::iter::once(r.barrier_page)
                        .chain(r.mailboxes.iter().flat_map(Mailbox::page_addrs))
                        .map(|p| format!("{p:#x}"))
                        .collect(),
                })
                .collect(),
        }
    }

    /// A few human-readable lines (no trailing newline).
    pub fn human(&self) -> String {
        let cpu: Vec<String> = self
            .cpu_s
            .iter()
            .map(|c| c.map_or("?".into(), |c| format!("{c:.2}")))
            .collect();
        format!(
            "preheat-npb {}: {} threads in {} instance(s) of {} rank(s), {} iterations of {} units\n\
             wall {:.3} s (measured), CPU s per thread [{}], checksum {}\n\
             truth {:?}",
            self.kernel.name(),
            self.threads,
            self.instances,
            self.ranks_per_instance,
            self.iterations,
            self.work,
            self.wall_s,
            cpu.join(", "),
            self.checksum,
            self.truth,
        )
    }
}
