//! preheat-npb: multi-threaded workloads in the style of the NAS Parallel Benchmarks (NPB)
//! whose communication pattern is known by construction.
//!
//! Busse et al., *Partial Coscheduling of Virtual Machines Based on Memory Access Patterns*
//! (`../shared/papers/partial-coscheduling.txt`, §4), evaluate SPCD-based communication
//! detection and partial coscheduling with the OpenMP NPB. These kernels stand in for NPB as
//! test subjects for a user-space detector (which samples pages and notes which threads touch
//! each one) and a user-space coscheduler. They reproduce NPB's *sharing patterns*, not its
//! numerics: `mg` a ring of halo exchanges, `cg` a seeded sparse irregular pattern, `is`
//! all-to-all, `ep` nothing. Several independent *instances* can run in one process, like the
//! paper's single/double/quad scenarios.
//!
//! | module | what |
//! |---|---|
//! | [`layout`] | page-aligned, page-granular buffers; the region layout (barrier page, one mailbox page per pair) |
//! | [`barrier`] | the per-instance spinning barrier and stop word, on the barrier page |
//! | [`pattern`] | each kernel's communication graph; `truth`, `pattern` and `pair_pages` |
//! | [`private`] | a rank's private pages (data and its copy of its links) |
//! | [`exchange`] | a rank's access to shared memory (mailboxes, barrier, stop rule), with optional page recording |
//! | [`spec`] | which kernel, when a run stops |
//! | [`kernels`] | `mg`, `cg`, `is`, `ep` |
//! | [`config`] | the options of a run, their checks, thread names |
//! | [`run`](mod@run) | threads, the `READY` announcement, the start delay, join |
//! | [`report`] | the JSON summary |
//!
//! **Truth by construction.** All shared data of an instance is in its own page-aligned
//! region; each mailbox page is written and read by exactly its pair of ranks; the barrier
//! page by all ranks of the instance; every rank's private data lies in pages it allocated
//! itself. Nothing else is touched by more than one thread between the start time and the
//! end of the iterations (results travel back through join handles).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod barrier;
pub mod config;
pub mod exchange;
pub mod kernels;
pub mod layout;
pub mod pattern;
pub mod private;
pub mod report;
pub mod run;
pub mod spec;

pub use config::Config;
pub use report::Summary;
pub use run::{run, run_observed, Progress, Ready, RunOutcome};
pub use spec::{Kernel, Limit};
