//! The cache-affinity controller: what a scheduler loses when it interleaves or moves a task,
//! measured on this machine with the method of Kazempour, Fedorova and Alagheband ("Performance
//! Implications of Cache Affinity on Multicore Processors", Euro-Par 2008) — and won back by
//! preheating. The plan (caches, base vectors, the experiment matrix) is the pure
//! `preheat-affinity`; this crate runs it. `preheat affinity` parses the arguments and prints.
//!
//! * [`topology`] — the machine's caches as the plan's machine, the plan, and each vector's
//!   measured eviction.
//! * [`run`] — one cell: the controller (`control`; Section 2 `interleaving`, Section 3
//!   `moves`) and its processes ([`proc`],
//!   [`worker`], `programs`).
//! * [`bench`](mod@bench) — the controller's overhead and quantum accuracy as ratios within one run.
//!
//! Workers are separate processes started from an executable that runs [`worker::run`]
//! ([`proc::WorkerCmd`]: the `preheat` binary's hidden `affinity worker`). No `unsafe`: scheduling,
//! affinity and signals go through `preheat-engine`; processes are stopped through
//! `preheat-launch`.

pub mod bench;
mod control;
mod interleaving;
mod moves;
pub mod proc;
mod programs;
pub mod run;
pub mod topology;
pub mod worker;

use anyhow::Result;

/// A scratch directory for program inputs: removed on exit and on SIGINT/SIGTERM, and by the
/// next affinity command if this one was killed.
pub fn scratch() -> Result<tempfile::TempDir> {
    preheat_launch::launch::owned_scratch(&std::env::temp_dir(), "preheat-affinity-")
}
