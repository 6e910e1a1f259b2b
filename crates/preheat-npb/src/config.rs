//! What to run: the options of a run, their validation, and the thread names.
//!
//! These are the knobs an NPB build fixes at compile time (class, thread count) or takes from
//! `OMP_NUM_THREADS`, plus the "VM mode" (`instances`) and the start delay that lets an attached
//! detector reset its matrix once the threads exist (the paper resets SPCD's matrix after
//! starting the benchmark, Busse et al. §4).

use std::time::Duration;

use crate::kernels::{DEFAULT_ITERATIONS, DEFAULT_WORK};
use crate::spec::{Kernel, Limit};

/// Most threads a run may have (an `is` instance of 256 ranks has 32,640 mailbox pages).
pub const MAX_THREADS: usize = 256;
/// Linux limit on a thread name, in bytes (without the terminating NUL).
const THREAD_NAME_BYTES: usize = 15;

/// What to run.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The kernel.
    pub kernel: Kernel,
    /// Total threads.
    pub threads: usize,
    /// Independent instances (must divide `threads`).
    pub instances: usize,
    /// When to stop.
    pub limit: Limit,
    /// Compute units per iteration.
    pub work: u32,
    /// Shared pages per communicating pair beyond its mailbox page
    /// ([`crate::layout::shared_offsets`]).
    pub shared_pages: usize,
    /// Seed of data and of the `cg` pattern.
    pub seed: u64,
    /// Pin thread `j` to CPU `j mod online CPUs`.
    pub pin: bool,
    /// Pause between the announcement and the first iteration.
    pub start_delay: Duration,
    /// Record the shared pages each rank touches (tests; allocates during the run).
    pub trace_pages: bool,
    /// Report the barrier phases of every instance this often during the run (the main thread
    /// then reads each barrier page once per period; see [`mod@crate::run`]).
    pub progress: Option<Duration>,
}

impl Config {
    /// The defaults of the command line for `kernel`.
    pub fn new(kernel: Kernel) -> Config {
        Config {
            kernel,
            threads: 4,
            instances: 1,
            limit: Limit::Iterations(DEFAULT_ITERATIONS),
            work: DEFAULT_WORK,
            shared_pages: 0,
            seed: 1,
            pin: false,
            start_delay: Duration::ZERO,
            trace_pages: false,
            progress: None,
        }
    }

    /// Ranks per instance.
    pub fn ranks(&self) -> usize {
        self.threads / self.instances.max(1)
    }

    /// Check the options; the message names the bad one.
    pub fn validate(&self) -> Result<(), String> {
        if self.threads == 0 || self.threads > MAX_THREADS {
            return Err(format!(
                "--threads must be between 1 and {MAX_THREADS}, got {}",
                self.threads
            ));
        }
        if self.instances == 0 || !self.threads.is_multiple_of(self.instances) {
            return Err(format!(
                "--instances must be at least 1 and divide --threads ({}), got {}",
                self.threads, self.instances
            ));
        }
        match self.limit {
            Limit::Iterations(0) => return Err("--iterations must be at least 1".into()),
            Limit::Seconds(d) if d.is_zero() => {
                return Err("--seconds must be positive".into());
            }
            _ => {}
        }
        if self.work == 0 {
            return Err("--work must be at least 1".into());
        }
        if self.progress.is_some_and(|p| p.is_zero()) {
            return Err("--progress-ms must be at least 1".into());
        }
        Ok(())
    }
}

/// `npb-<kernel>-i<instance>-r<rank>`, cut to the 15 bytes Linux keeps.
pub fn thread_name(kernel: Kernel, instance: usize, rank: usize) -> String {
    let mut name = format!("npb-{}-i{instance}-r{rank}", kernel.name());
    name.truncate(THREAD_NAME_BYTES);
    name
}
