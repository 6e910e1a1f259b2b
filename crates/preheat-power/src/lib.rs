//! Sleep shaping for preheat: Zhu et al., *Software Engagement with Sleeping CPUs*
//! (`../shared/papers/sleeping-cpus.txt`), §3 "Energy-Conserving Sleep Shaping".
//!
//! The paper observes that a multicore saves most power only when *all* CPUs sleep at the same
//! time (Haswell E5-2620 v3: the first active CPU costs 37 W above idle, each further one ≤ 8 W),
//! and proposes **slack-enabled quiescence**: while a latency-critical request is blocked on a
//! slow synchronous I/O, hold back non-critical background work so every CPU can idle together,
//! and let the background work run again (piggybacked) while the critical work is active.
//!
//! Modules:
//!
//! * [`residency`] – the one implementation of CPU idle residency over a window, used here and by
//!   `preheat stage bench`: snapshots of `cpuidle/state*/{name,time,usage,above,below}` for
//!   every CPU, their difference (summable over windows) and its one serialised shape
//!   ([`residency::Residency`]: per state time/share/transitions, per CPU deep-idle/POLL/busy
//!   shares and wakeups, means over CPUs; POLL counts as busy). Measured from kernel counters.
//! * [`energy`] – a documented, configurable per-state power profile (default: the paper's
//!   Haswell figures) turning a residency difference into **modeled** energy and average power.
//!   There is no RAPL/powercap/MSR on our machines: nothing here is a power *measurement*.
//! * [`quiesce`] – the cgroup freezer ([`quiesce::Freezer`]: v2 `cgroup.freeze` where it exists,
//!   else the v1 `freezer` controller) and [`quiesce::BackgroundGroup`], the cgroup
//!   `preheat-bg-<pid>` holding registered background work, frozen by `hold()` and thawed by
//!   `release()`. Every group is thawed and removed on drop, error and (through [`run`])
//!   SIGINT/SIGTERM; stale groups of dead owners are cleaned up at start-up.
//! * [`hogs`] – the experiment's background load: CPU-burning child processes, killed and reaped
//!   on drop, and the CPU time they and this process got.
//! * [`bench`](mod@bench) – the quiescence experiment behind `preheat power quiesce-bench`.
//! * [`cli`] – `PowerArgs` and [`run`], wired by the CLI as `preheat power`.
//!
//! Every number this crate prints or serialises carries a label: `measured` (timed or read from
//! kernel counters here), `emulated` (an input we fabricate, e.g. a 2 ms "device" wait that is a
//! sleep) or `modeled` (computed from a model, e.g. energy).

#![forbid(unsafe_code)]

pub mod bench;
pub mod cli;
pub mod energy;
pub mod hogs;
pub mod quiesce;
pub mod residency;
pub mod stats;

pub use cli::{run, PowerArgs};

use serde::{Deserialize, Serialize};

/// Where a number comes from. Serialised lowercase: `"measured"`, `"emulated"`, `"modeled"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Label {
    /// Timed or read from kernel counters on this machine.
    Measured,
    /// An input we fabricate to stand in for something real (e.g. a sleep standing in for a
    /// device wait).
    Emulated,
    /// Computed from a model (e.g. energy from residency and a power profile).
    Modeled,
}

impl Label {
    pub fn as_str(self) -> &'static str {
        match self {
            Label::Measured => "measured",
            Label::Emulated => "emulated",
            Label::Modeled => "modeled",
        }
    }
}

/// One labeled number with its unit, serialised as
/// `{"value": 1.5, "unit": "W", "label": "modeled"}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Quantity {
    pub value: f64,
    pub unit: String,
    pub label: Label,
}

impl Quantity {
    pub fn new(value: f64, unit: &str, label: Label) -> Quantity {
        Quantity {
            value,
            unit: unit.to_string(),
            label,
        }
    }
    pub fn modeled(value: f64, unit: &str) -> Quantity {
        Quantity::new(value, unit, Label::Modeled)
    }
    pub fn measured(value: f64, unit: &str) -> Quantity {
        Quantity::new(value, unit, Label::Measured)
    }
}
