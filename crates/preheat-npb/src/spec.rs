//! What every part of a run needs to know: which kernel it runs ([`Kernel`]) and when it stops
//! ([`Limit`]). The kernels themselves are in [`crate::kernels`].

use std::time::{Duration, Instant};

/// Which NPB-like kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kernel {
    /// MG/LU-like ring of halo exchanges.
    Mg,
    /// CG-like sparse, irregular exchanges.
    Cg,
    /// IS-like all-to-all exchange.
    Is,
    /// EP-like, no sharing at all.
    Ep,
}

impl Kernel {
    /// All kernels.
    pub const ALL: [Kernel; 4] = [Kernel::Mg, Kernel::Cg, Kernel::Is, Kernel::Ep];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Mg => "mg",
            Kernel::Cg => "cg",
            Kernel::Is => "is",
            Kernel::Ep => "ep",
        }
    }

    /// Whether the ranks of an instance synchronise (barrier) and so belong coscheduled.
    pub fn synchronised(self) -> bool {
        self != Kernel::Ep
    }

    /// Barriers per iteration (phases between barriers: what a simulator of a coscheduled host
    /// models).
    pub fn barriers_per_iteration(self) -> u32 {
        match self {
            Kernel::Mg | Kernel::Is => 2,
            Kernel::Cg => 1,
            Kernel::Ep => 0,
        }
    }
}

/// When a run stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// After this many iterations (at least 1).
    Iterations(u64),
    /// After this much time (synchronised kernels: as seen by rank 0, plus one iteration).
    Seconds(Duration),
}

impl Limit {
    /// Whether a rank that has completed `done` iterations since `started` should stop.
    pub fn reached(self, done: u64, started: Instant) -> bool {
        match self {
            Limit::Iterations(n) => done >= n,
            Limit::Seconds(d) => started.elapsed() >= d,
        }
    }
}
