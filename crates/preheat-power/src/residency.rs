//! CPU idle-state residency from `cpuidle` sysfs counters (measured).
//!
//! For every online CPU `N`, `ROOT/cpuN/cpuidle/stateK/` holds `name` (e.g. `POLL`, `C1`,
//! `haltpoll idle`), `time` (total µs spent in the state since boot) and `usage` (number of entries).
//! `ROOT` is normally `/sys/devices/system/cpu`; every reader takes it as a parameter so tests run
//! on a synthetic tree.
//!
//! A [`Snapshot`] is all counters plus a monotonic wall time; [`Snapshot::diff`] turns two of them
//! into a [`ResidencyDiff`]: per CPU the busy time (wall − time in non-`POLL` states: `POLL` is a
//! busy loop in the idle task, so it counts as busy, as the measured-here notes demand), the
//! residency and the number of transitions (entries) of each state.
//!
//! Caveats (documented, not corrected):
//! * The kernel adds an idle period to `time` when the CPU *leaves* the state. An idle period in
//!   progress at a snapshot is therefore attributed to the interval in which it ends: the busy
//!   time of an interval can be off by up to the length of the idle periods straddling its two
//!   ends (for a fully idle tickless CPU, that can be the whole interval). Busy time is clamped
//!   to `[0, wall]` and clamping is reported.
//! * CPUs without a `cpuidle` directory (no cpuidle driver) are listed with no states and count
//!   as busy for the whole interval; offline CPUs (`online` = 0) are skipped.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Instant;

use serde::{Deserialize, Serialize};

/// The default sysfs root for CPUs.
pub const SYSFS_CPU_ROOT: &str = "/sys/devices/system/cpu";

/// Name of the polling idle state. It burns the CPU, so its residency counts as busy.
pub const POLL_STATE: &str = "POLL";

#[derive(Debug, thiserror::Error)]
pub enum ResidencyError {
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: cannot parse {what} from {text:?}")]
    Parse {
        path: PathBuf,
        what: &'static str,
        text: String,
    },
    #[error("no CPU under {0} exposes cpuidle states (no cpuidle driver?)")]
    NoCpuidle(PathBuf),
    #[error("snapshots are not comparable: {0}")]
    Mismatch(String),
}

/// Counters of one idle state at one instant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateSnapshot {
    /// `K` of `stateK`.
    pub index: u32,
    pub name: String,
    /// Cumulative residency, µs.
    pub time_us: u64,
    /// Cumulative number of entries.
    pub usage: u64,
}

/// All idle states of one CPU at one instant (empty when the CPU has no cpuidle directory).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuSnapshot {
    pub cpu: u32,
    pub states: Vec<StateSnapshot>,
}

/// Idle-state counters of every online CPU plus a monotonic wall time.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Monotonic ns since an arbitrary, process-local epoch (see [`wall_ns`]); only differences
    /// between snapshots of one process mean anything.
    pub wall_ns: u64,
    pub cpus: Vec<CpuSnapshot>,
}

/// Monotonic nanoseconds since a process-local epoch (the first call).
pub fn wall_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

impl Snapshot {
    /// Read every online CPU's counters under `root` (normally [`SYSFS_CPU_ROOT`]); the wall time
    /// is the midpoint of the reads.
    pub fn read(root: &Path) -> Result<Snapshot, ResidencyError> {
        let t0 = wall_ns();
        let mut snap = Snapshot::read_with_wall(root, 0)?;
        let t1 = wall_ns();
        snap.wall_ns = t0 + (t1 - t0) / 2;
        Ok(snap)
    }

    /// Read the counters under `root` and stamp them with the given wall time (for tests and
    /// for callers with their own clock).
    pub fn read_with_wall(root: &Path, wall_ns: u64) -> Result<Snapshot, ResidencyError> {
        use preheat_engine::idle::{read_counters, IdleError};
        let c = read_counters(root).map_err(|e| match e {
            IdleError::NoCpus(p) | IdleError::NoCpuidle(p) => ResidencyError::NoCpuidle(p),
            IdleError::Unreadable(p) => ResidencyError::Parse {
                path: p,
                what: "cpuidle counters",
                text: String::new(),
            },
        })?;
        Ok(Snapshot {
            wall_ns,
            cpus: c
                .cpus
                .into_iter()
                .map(|cpu| CpuSnapshot {
                    cpu: cpu.cpu,
                    states: cpu
                        .states
                        .into_iter()
                        .map(|st| StateSnapshot {
                            index: st.index,
                            name: st.name,
                            time_us: st.time_us,
                            usage: st.usage,
                        })
                        .collect(),
                })
                .collect(),
        })
    }

    /// The residency between `self` (earlier) and `later`.
    pub fn diff(&self, later: &Snapshot) -> Result<ResidencyDiff, ResidencyError> {
        let wall_ns = later.wall_ns.checked_sub(self.wall_ns).ok_or_else(|| {
            ResidencyError::Mismatch("the later snapshot has an earlier wall time".into())
        })?;
        let wall_us = wall_ns / 1000;
        if self.cpus.len() != later.cpus.len() {
            return Err(ResidencyError::Mismatch(format!(
                "{} CPUs before, {} after (CPU hotplug?)",
                self.cpus.len(),
                later.cpus.len()
            )));
        }
        let mut cpus = Vec::with_capacity(self.cpus.len());
        for (a, b) in self.cpus.iter().zip(&later.cpus) {
            if a.cpu != b.cpu || a.states.len() != b.states.len() {
                return Err(ResidencyError::Mismatch(format!(
                    "CPU {} / {}: different CPUs or state counts",
                    a.cpu, b.cpu
                )));
            }
            let mut states = Vec::with_capacity(a.states.len());
            for (sa, sb) in a.states.iter().zip(&b.states) {
                if sa.index != sb.index || sa.name != sb.name {
                    return Err(ResidencyError::Mismatch(format!(
                        "cpu{} state{}: name changed from {:?} to {:?}",
                        a.cpu, sa.index, sa.name, sb.name
                    )));
                }
                let (Some(time_us), Some(transitions)) = (
                    sb.time_us.checked_sub(sa.time_us),
                    sb.usage.checked_sub(sa.usage),
                ) else {
                    return Err(ResidencyError::Mismatch(format!(
                        "cpu{} state{} ({}): counters went backwards",
                        a.cpu, sa.index, sa.name
                    )));
                };
                states.push(StateResidency {
                    index: sa.index,
                    name: sa.name.clone(),
                    time_us,
                    transitions,
                });
            }
            cpus.push(CpuResidency { cpu: a.cpu, states });
        }
        Ok(ResidencyDiff { wall_us, cpus })
    }
}

/// Residency of one state of one CPU over an interval.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateResidency {
    pub index: u32,
    pub name: String,
    /// µs spent in the state.
    pub time_us: u64,
    /// Entries into the state.
    pub transitions: u64,
}

/// Residency of one CPU over an interval.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuResidency {
    pub cpu: u32,
    pub states: Vec<StateResidency>,
}

/// Per-CPU busy time for one CPU (see [`ResidencyDiff::busy`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Busy {
    pub cpu: u32,
    /// wall − idle time in states the classifier calls idle, clamped to `[0, wall]`, µs.
    pub busy_us: u64,
    /// `busy_us / wall_us` (0 when the interval is empty).
    pub share: f64,
    /// True if the idle counters exceeded the wall time and busy time was clamped to 0.
    pub clamped: bool,
}

/// Residency of every CPU over an interval: the difference of two [`Snapshot`]s, or the sum of
/// several such differences ([`ResidencyDiff::accumulate`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResidencyDiff {
    /// Wall time of the interval, µs.
    pub wall_us: u64,
    pub cpus: Vec<CpuResidency>,
}

impl ResidencyDiff {
    /// Busy time per CPU with `POLL` counted as busy and every other state as idle.
    pub fn busy_default(&self) -> Vec<Busy> {
        self.busy(|name| name != POLL_STATE)
    }

    /// Busy time per CPU: wall − Σ time of states for which `is_idle(name)` is true.
    pub fn busy(&self, is_idle: impl Fn(&str) -> bool) -> Vec<Busy> {
        self.cpus
            .iter()
            .map(|c| {
                let idle: u64 = c
                    .states
                    .iter()
                    .filter(|s| is_idle(&s.name))
                    .map(|s| s.time_us)
                    .sum();
                let clamped = idle > self.wall_us;
                let busy_us = self.wall_us.saturating_sub(idle);
                Busy {
                    cpu: c.cpu,
                    busy_us,
                    share: if self.wall_us == 0 {
                        0.0
                    } else {
                        busy_us as f64 / self.wall_us as f64
                    },
                    clamped,
                }
            })
            .collect()
    }

    /// Share of all CPU time (CPUs × wall) spent in states for which `pred(name)` holds,
    /// clamped to [0, 1].
    pub fn share_of_states(&self, pred: impl Fn(&str) -> bool) -> f64 {
        let total = self.wall_us as f64 * self.cpus.len() as f64;
        if total == 0.0 {
            return 0.0;
        }
        let t: u64 = self
            .cpus
            .iter()
            .flat_map(|c| c.states.iter())
            .filter(|s| pred(&s.name))
            .map(|s| s.time_us)
            .sum();
        (t as f64 / total).clamp(0.0, 1.0)
    }

    /// Total transitions (idle-state entries) over all CPUs and states.
    pub fn transitions(&self) -> u64 {
        self.cpus
            .iter()
            .flat_map(|c| c.states.iter())
            .map(|s| s.transitions)
            .sum()
    }

    /// Add another interval of the same machine (same CPUs and states) to this one: wall time,
    /// residencies and transitions are summed. An empty diff (no CPUs) takes `other` as is.
    pub fn accumulate(&mut self, other: &ResidencyDiff) -> Result<(), ResidencyError> {
        if self.cpus.is_empty() && self.wall_us == 0 {
            *self = other.clone();
            return Ok(());
        }
        let same_shape = self.cpus.len() == other.cpus.len()
            && self.cpus.iter().zip(&other.cpus).all(|(a, b)| {
                a.cpu == b.cpu
                    && a.states.len() == b.states.len()
                    && a.states
                        .iter()
                        .zip(&b.states)
                        .all(|(x, y)| x.name == y.name)
            });
        if !same_shape {
            return Err(ResidencyError::Mismatch(
                "accumulating intervals with different CPUs or states".into(),
            ));
        }
        self.wall_us += other.wall_us;
        for (a, b) in self.cpus.iter_mut().zip(&other.cpus) {
            for (x, y) in a.states.iter_mut().zip(&b.states) {
                x.time_us += y.time_us;
                x.transitions += y.transitions;
            }
        }
        Ok(())
    }
}

/// Read a snapshot of the real machine.
pub fn snapshot() -> Result<Snapshot, ResidencyError> {
    Snapshot::read(Path::new(SYSFS_CPU_ROOT))
}
