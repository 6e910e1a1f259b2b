//! The four kernels and what they share: one rank's identity, its outcome, the dispatch to each
//! kernel (which kernel and when a run stops are in [`crate::spec`]).
//!
//! Each kernel is a stand-in for an NPB benchmark with the same *sharing pattern* (who
//! exchanges data with whom, and how often), not the same numerics or problem sizes:
//!
//! | kernel | stands in for | per iteration |
//! |---|---|---|
//! | [`mg`] | MG / LU: nearest-neighbour halo exchange | relax private grid, send halos, barrier, fold neighbours' halos, barrier |
//! | [`cg`] | CG: irregular sparse exchange | sparse gather on private vector, send parts, barrier, add received parts |
//! | [`is`] | IS: all-to-all key exchange | generate and bucket keys, send every rank its buckets, barrier, rank own keys, barrier |
//! | [`ep`] | EP: no communication | Gaussian pairs from a private generator; no barrier |
//!
//! `--work W` is the number of compute *units* per iteration; a unit is sized to take about
//! one microsecond on the development VM (see each kernel's `UNIT` constant), so the default
//! [`DEFAULT_WORK`] gives a few hundred µs per iteration. All arithmetic is integer or
//! sequential floating point in a fixed order, so a run's checksum depends only on the seed,
//! the shape (threads, instances, work) and the number of iterations.

pub mod cg;
pub mod ep;
pub mod is;
pub mod mg;

use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::exchange::Exchange;
use crate::pattern::Link;
use crate::private::Private;
use crate::spec::Kernel;

/// Default compute units per iteration (≈ 300 µs).
pub const DEFAULT_WORK: u32 = 300;
/// Default iterations (≈ 2.5 s per thread at the default work, one core per thread).
pub const DEFAULT_ITERATIONS: u64 = 8000;

/// One rank's identity and parameters (copied onto its own stack).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankSpec {
    /// The kernel.
    pub kernel: Kernel,
    /// Instance index.
    pub instance: usize,
    /// Rank within the instance.
    pub rank: usize,
    /// Ranks per instance.
    pub ranks: usize,
    /// Compute units per iteration.
    pub work: u32,
    /// Run seed.
    pub seed: u64,
}

/// What one rank returns through its join handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// Iterations completed.
    pub iterations: u64,
    /// Checksum over the rank's final data and what it received.
    pub checksum: u64,
}

/// Allocate and initialise a rank's private pages (call on the rank's own thread).
pub fn setup(spec: &RankSpec, links: &[Link]) -> Private {
    match spec.kernel {
        Kernel::Mg => mg::setup(spec, links),
        Kernel::Cg => cg::setup(spec, links),
        Kernel::Is => is::setup(spec, links),
        Kernel::Ep => ep::setup(spec, links),
    }
}

/// Run a rank's iterations to the limit held by `x`.
pub fn run(spec: &RankSpec, p: &mut Private, x: &mut Exchange) -> Outcome {
    match spec.kernel {
        Kernel::Mg => mg::run(spec, p, x),
        Kernel::Cg => cg::run(spec, p, x),
        Kernel::Is => is::run(spec, p, x),
        Kernel::Ep => ep::run(spec, p, x),
    }
}

/// Fold `v` into the hash `h` (order-sensitive).
pub fn mix(h: u64, v: u64) -> u64 {
    (h.rotate_left(23) ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Hash of a word slice.
pub fn fold(words: &[u64]) -> u64 {
    words.iter().fold(0x243f_6a88_85a3_08d3, |h, &w| mix(h, w))
}

/// The rank's deterministic generator for initial data.
pub(crate) fn rank_rng(spec: &RankSpec) -> StdRng {
    let id = mix(mix(spec.seed, spec.instance as u64), spec.rank as u64);
    StdRng::seed_from_u64(id)
}

/// One step of Knuth's MMIX linear congruential generator (the kernels' in-loop generator,
/// as NPB uses its own LCG `randlc`).
#[inline]
pub(crate) fn lcg(state: &mut u64) -> u64 {
    *state = state
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1_442_695_040_888_963_407);
    *state ^ (*state >> 29)
}
