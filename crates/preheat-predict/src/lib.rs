//! Anticipatory CPU wakeup for fast devices: Zhu, Wu, Shen, Shen, Wang, *Software Engagement with
//! Sleeping CPUs* (HotOS 2015), §2 "Latency-Sensitive Anticipatory Wakeup"
//! (`../shared/papers/sleeping-cpus.txt`).
//!
//! A thread that blocks on a fast device lets its CPU sleep, and the wake-up when the operation
//! completes costs tens of µs here (measured-here notes: 20–95 µs on our KVM guests) — comparable
//! to the operation itself (~60 µs + 1.0 µs/KiB for a read of the host-cached virtual disk).
//! If the completion time can be predicted, the requester can stop blocking shortly before it
//! and spin, getting the prompt response of a never-sleeping CPU at a fraction of the awake time.
//!
//! | module | what |
//! |---|---|
//! | [`linear`] | pure: completion time = a + b·size per operation kind (online least squares, Pearson r, residual safety quantile, censoring-aware early-wake margin) |
//! | [`history`] | pure: runtime prediction for repeated kernels keyed by kernel id (last, EWMA, median of last k) and the paper's accuracy |
//! | [`wait`] | how a requester waits for another thread's completion: block, spin, block-until-then-spin; awake time; censoring |
//! | [`anticipatory_read`] | the anticipatory synchronous read (`O_DIRECT` file or the emulated SSD) |
//! | [`bench`](mod@bench) | `preheat io bench`: the paper's Figure 1 experiment |
//! | [`kernels`] | `preheat io kernels`: the paper's K-means accelerator experiment |
//! | [`stats`] | order statistics with confidence intervals |
//!
//! Every number the benchmarks print is labeled `measured` (real file, real threads) or
//! `emulated` (the emulated SSD's schedule).
#![forbid(unsafe_code)]

pub mod anticipatory_read;
pub mod bench;
mod cli;
pub mod history;
pub mod kernels;
pub mod linear;
mod measure;
pub mod stats;
pub mod wait;

pub use cli::{run, BenchArgs, IoArgs, IoCmd, KernelsArgs, PinSpec};
