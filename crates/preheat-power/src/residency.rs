//! CPU idle residency over a window, from the kernel's `cpuidle` counters (measured): the one
//! implementation behind `preheat power residency|quiesce-bench`, the energy model
//! ([`crate::energy`]) and `preheat stage bench`.
//!
//! For every online CPU `N`, `ROOT/cpuN/cpuidle/stateK/` holds `name` (e.g. `POLL`, `C1`,
//! `haltpoll idle`), `time` (total µs spent in the state), `usage` (entries) and, on newer
//! kernels, `above`/`below` (entries where the state turned out too deep / too shallow). `ROOT` is
//! under a [`MachineRoot`] (normally the real machine); every reader takes it as a parameter so
//! tests run on a synthetic tree of either machine variant. The counters are read by the one
//! reader, [`preheat_engine::idle::read_counters`].
//!
//! **Without a cpuidle driver** (no `stateK` directories) the reader falls back to `/proc/stat`:
//! each CPU's idle + iowait time as one undivided state named `idle` ([`CounterKind::ProcStat`]),
//! in 10 ms ticks and without entry counts. Residency then still gives the deep-idle (= halted:
//! without a driver the kernel's default idle halts) and busy shares, but per-state time,
//! transitions and wakeups are reported as unavailable with the reason
//! ([`Residency::unavailable`]), and the energy model, which needs per-state time, declines
//! ([`crate::energy::PowerProfile::model`]).
//!
//! A [`Snapshot`] is all counters plus a monotonic wall time; [`Snapshot::diff`] turns two of them
//! into a [`ResidencyDiff`] (raw µs and entry counts per CPU and state; windows add up with
//! [`ResidencyDiff::accumulate`]); [`ResidencyDiff::report`] turns it into the one serialised
//! shape, [`Residency`]: per state the time, share (Δtime / wall) and transitions (Δusage), per
//! CPU the deep-idle, POLL and busy shares and the wakeups, and their mean / sum over CPUs.
//!
//! Definitions: **POLL counts as busy** (it is a busy loop in the idle task, not a sleep), so
//! *deep idle* is the sum of all non-POLL states, busy = 1 − deep idle, and *wakeups* are entries
//! into non-POLL states (each ends in a wakeup). The energy model classifies states with its
//! profile instead ([`ResidencyDiff::busy`]).
//!
//! Caveats (documented, not corrected):
//! * The kernel adds an idle period to `time` when the CPU *leaves* the state, so an idle period
//!   in progress at a snapshot is counted in the window in which it ends: a share can be off by
//!   up to one idle period / window (deep idle can exceed 1; busy is then clamped to 0 and the
//!   CPU flagged `clamped`). Keep windows long against the idle periods measured.
//! * CPUs without a `cpuidle` directory (no cpuidle driver) are listed with no states and count
//!   as busy for the whole window; offline CPUs (`online` = 0) are skipped. A CPU that appears,
//!   disappears or changes its idle states during a window is left out of it, with a note.

use std::sync::OnceLock;
use std::time::Instant;

use serde::{Deserialize, Serialize};

pub use preheat_engine::idle::IdleError;
use preheat_engine::idle::IdleSource;
pub use preheat_engine::machine::MachineRoot;

use crate::{Label, Quantity};

/// The default sysfs root for CPUs.
pub const SYSFS_CPU_ROOT: &str = preheat_engine::idle::SYSFS_CPU;

/// Name of the polling idle state. It burns the CPU, so its residency counts as busy.
pub const POLL_STATE: &str = "POLL";

/// The definitions every [`Residency`] carries with it.
pub const DEFINITIONS: &str = "POLL counts as busy; deep idle = all non-POLL states; busy = 1 - \
                               deep idle; wakeups = entries into non-POLL states; an idle period \
                               in progress at a snapshot is counted in the window in which it ends";

/// Whether a state is the polling pseudo-state (busy, not a sleep).
pub fn is_poll(name: &str) -> bool {
    preheat_engine::idle::is_poll(name)
}

#[derive(Debug, thiserror::Error)]
pub enum ResidencyError {
    /// No CPUs, no cpuidle, or unreadable counters: residency is unavailable here.
    #[error(transparent)]
    Unavailable(#[from] IdleError),
    #[error("snapshots are not comparable: {0}")]
    Mismatch(String),
}

/// Where a snapshot's counters come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CounterKind {
    /// Per-state time and entries from the cpuidle driver.
    #[default]
    Cpuidle,
    /// No cpuidle states: one undivided `idle` state per CPU from `/proc/stat` (10 ms ticks,
    /// entries unknown).
    ProcStat,
}

impl CounterKind {
    /// Whether idle-state entries (transitions, wakeups) are counted.
    pub fn counts_entries(self) -> bool {
        self == CounterKind::Cpuidle
    }
}

/// Why per-state numbers are missing under [`CounterKind::ProcStat`] (printed and serialised).
pub const NO_CPUIDLE_REASON: &str = "the kernel has no cpuidle driver (no cpu*/cpuidle/state*): \
                                     idle time is one undivided state from /proc/stat (idle + \
                                     iowait, 10 ms ticks); per-state time, idle-state entries and \
                                     wakeups are not counted";

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
    /// Cumulative too-deep / too-shallow entries, when the kernel reports them.
    #[serde(default)]
    pub above: Option<u64>,
    #[serde(default)]
    pub below: Option<u64>,
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
    /// The cpuidle driver and governor, when the kernel names them.
    #[serde(default)]
    pub driver: Option<String>,
    #[serde(default)]
    pub governor: Option<String>,
    /// Where the counters come from.
    #[serde(default)]
    pub kind: CounterKind,
}

/// Monotonic nanoseconds since a process-local epoch (the first call).
pub fn wall_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

impl Snapshot {
    /// Read every online CPU's counters on the machine at `root`; the wall time is the midpoint
    /// of the reads.
    pub fn read(root: &MachineRoot) -> Result<Snapshot, ResidencyError> {
        let t0 = wall_ns();
        let mut snap = Snapshot::read_with_wall(root, 0)?;
        let t1 = wall_ns();
        snap.wall_ns = t0 + (t1 - t0) / 2;
        Ok(snap)
    }

    /// Read the counters under `root` and stamp them with the given wall time (for tests and
    /// for callers with their own clock).
    pub fn read_with_wall(root: &MachineRoot, wall_ns: u64) -> Result<Snapshot, ResidencyError> {
        let c = preheat_engine::idle::read_counters(root)?;
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
                            above: st.above,
                            below: st.below,
                        })
                        .collect(),
                })
                .collect(),
            driver: c.driver,
            governor: c.governor,
            kind: match c.source {
                IdleSource::Cpuidle => CounterKind::Cpuidle,
                IdleSource::ProcStat => CounterKind::ProcStat,
            },
        })
    }

    /// Where the numbers come from, e.g. `cpuidle counters (driver haltpoll, governor haltpoll)`.
    pub fn source(&self) -> String {
        if self.kind == CounterKind::ProcStat {
            return format!(
                "/proc/stat idle time (cpuidle driver {})",
                self.driver.as_deref().unwrap_or("absent")
            );
        }
        match (&self.driver, &self.governor) {
            (Some(d), Some(g)) => format!("cpuidle counters (driver {d}, governor {g})"),
            (Some(d), None) => format!("cpuidle counters (driver {d})"),
            (None, Some(g)) => format!("cpuidle counters (governor {g})"),
            (None, None) => "cpuidle counters".to_string(),
        }
    }

    /// The residency between `self` (earlier) and `later`. CPUs that appear, disappear or change
    /// their idle states in between are left out with a note; a later snapshot with an earlier
    /// wall time, or counters that went backwards, are errors.
    pub fn diff(&self, later: &Snapshot) -> Result<ResidencyDiff, ResidencyError> {
        if self.kind != later.kind {
            return Err(ResidencyError::Mismatch(
                "the counters changed source (cpuidle vs /proc/stat) during the window".into(),
            ));
        }
        let wall_ns = later.wall_ns.checked_sub(self.wall_ns).ok_or_else(|| {
            ResidencyError::Mismatch("the later snapshot has an earlier wall time".into())
        })?;
        let mut notes = Vec::new();
        for a in &self.cpus {
            if !later.cpus.iter().any(|b| b.cpu == a.cpu) {
                notes.push(format!(
                    "cpu{} went offline during the window: left out",
                    a.cpu
                ));
            }
        }
        let mut cpus = Vec::with_capacity(later.cpus.len());
        for b in &later.cpus {
            let Some(a) = self.cpus.iter().find(|a| a.cpu == b.cpu) else {
                notes.push(format!("cpu{} appeared during the window: left out", b.cpu));
                continue;
            };
            let same = a.states.len() == b.states.len()
                && a.states
                    .iter()
                    .zip(&b.states)
                    .all(|(x, y)| x.index == y.index && x.name == y.name);
            if !same {
                notes.push(format!(
                    "cpu{}: idle states changed during the window: left out",
                    b.cpu
                ));
                continue;
            }
            let mut states = Vec::with_capacity(a.states.len());
            for (sa, sb) in a.states.iter().zip(&b.states) {
                let (Some(time_us), Some(transitions)) = (
                    sb.time_us.checked_sub(sa.time_us),
                    sb.usage.checked_sub(sa.usage),
                ) else {
                    return Err(ResidencyError::Mismatch(format!(
                        "cpu{} state{} ({}): counters went backwards",
                        a.cpu, sa.index, sa.name
                    )));
                };
                states.push(StateDiff {
                    index: sa.index,
                    name: sa.name.clone(),
                    time_us,
                    transitions,
                    above: sb.above.zip(sa.above).map(|(y, x)| y.saturating_sub(x)),
                    below: sb.below.zip(sa.below).map(|(y, x)| y.saturating_sub(x)),
                });
            }
            cpus.push(CpuDiff { cpu: b.cpu, states });
        }
        Ok(ResidencyDiff {
            wall_us: wall_ns / 1000,
            cpus,
            source: later.source(),
            kind: later.kind,
            windows: 1,
            notes,
        })
    }
}

/// Residency of one state of one CPU over a window (raw counts).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateDiff {
    pub index: u32,
    pub name: String,
    /// µs spent in the state.
    pub time_us: u64,
    /// Entries into the state.
    pub transitions: u64,
    /// Too-deep / too-shallow entries, when the kernel reports them.
    pub above: Option<u64>,
    pub below: Option<u64>,
}

/// Residency of one CPU over a window (raw counts; no states when it has no cpuidle driver).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuDiff {
    pub cpu: u32,
    pub states: Vec<StateDiff>,
}

/// Per-CPU busy time under a state classifier (see [`ResidencyDiff::busy`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Busy {
    pub cpu: u32,
    /// wall − idle time in states the classifier calls idle, clamped to `[0, wall]`, µs.
    pub busy_us: u64,
    /// `busy_us / wall_us` (0 when the window is empty).
    pub share: f64,
    /// True if the idle counters exceeded the wall time and busy time was clamped to 0.
    pub clamped: bool,
}

/// Residency of every CPU over a window: the difference of two [`Snapshot`]s, or the sum of
/// several such differences ([`ResidencyDiff::accumulate`]). Raw µs and counts; the energy model
/// works on this, reports serialise [`ResidencyDiff::report`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResidencyDiff {
    /// Wall time of the window(s), µs.
    pub wall_us: u64,
    pub cpus: Vec<CpuDiff>,
    /// Where the counters come from ([`Snapshot::source`]).
    pub source: String,
    /// Which kind of counters.
    #[serde(default)]
    pub kind: CounterKind,
    /// Snapshot differences summed into this one (0 for an empty diff).
    pub windows: usize,
    /// CPUs left out of a window, and why.
    pub notes: Vec<String>,
}

impl ResidencyDiff {
    /// Busy time per CPU with `POLL` counted as busy and every other state as idle.
    pub fn busy_default(&self) -> Vec<Busy> {
        self.busy(|name| !is_poll(name))
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

    /// Total transitions (idle-state entries, POLL included) over all CPUs and states.
    pub fn transitions(&self) -> u64 {
        self.cpus
            .iter()
            .flat_map(|c| c.states.iter())
            .map(|s| s.transitions)
            .sum()
    }

    /// Add another window of the same machine (same CPUs and states) to this one: wall time,
    /// residencies, transitions and above/below are summed, notes kept. An empty diff
    /// (`windows == 0`, e.g. `ResidencyDiff::default()`) takes `other` as is.
    pub fn accumulate(&mut self, other: &ResidencyDiff) -> Result<(), ResidencyError> {
        if self.windows == 0 {
            *self = other.clone();
            return Ok(());
        }
        let same_shape = self.kind == other.kind
            && self.cpus.len() == other.cpus.len()
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
                "accumulating windows with different CPUs or states".into(),
            ));
        }
        self.wall_us += other.wall_us;
        self.windows += other.windows;
        for (a, b) in self.cpus.iter_mut().zip(&other.cpus) {
            for (x, y) in a.states.iter_mut().zip(&b.states) {
                x.time_us += y.time_us;
                x.transitions += y.transitions;
                x.above = x.above.zip(y.above).map(|(x, y)| x + y);
                x.below = x.below.zip(y.below).map(|(x, y)| x + y);
            }
        }
        self.notes.extend(other.notes.iter().cloned());
        Ok(())
    }

    /// The one serialised shape: shares, rates and means, every number labeled measured.
    pub fn report(&self) -> Residency {
        let w = Window {
            wall_us: self.wall_us as f64,
        };
        let entries = self.kind.counts_entries();
        let mut notes = self.notes.clone();
        let per_cpu: Vec<CpuResidency> = self
            .cpus
            .iter()
            .map(|c| self.cpu_report(c, w, &mut notes))
            .collect();
        let n = per_cpu.len();
        let mean = |f: fn(&CpuResidency) -> f64| {
            let v = if n == 0 {
                0.0
            } else {
                per_cpu.iter().map(f).sum::<f64>() / n as f64
            };
            Quantity::measured(v, "share")
        };
        let wakeups: u64 = per_cpu
            .iter()
            .filter_map(|c| c.wakeups.as_ref())
            .map(|w| w.value as u64)
            .sum();
        if self.kind == CounterKind::ProcStat {
            notes.push(
                "idle time from /proc/stat in 10 ms ticks: each CPU's share is uncertain by \
                 ±10 ms per snapshot difference"
                    .into(),
            );
        }
        Residency {
            label: Label::Measured,
            source: self.source.clone(),
            definitions: DEFINITIONS,
            interval: Quantity::measured(w.wall_us / 1e6, "s"),
            windows: self.windows,
            cpus_measured: n,
            deep_idle_share: mean(|c| c.deep_idle_share.value),
            poll_share: mean(|c| c.poll_share.value),
            busy_share: mean(|c| c.busy_share.value),
            wakeups: entries.then(|| count(wakeups)),
            wakeups_per_s: entries.then(|| w.rate(wakeups)),
            unavailable: (!entries).then(|| NO_CPUIDLE_REASON.to_string()),
            per_cpu,
            notes,
        }
    }

    /// CPU `c`'s part of [`ResidencyDiff::report`] over window `w`; what the reader must know
    /// about it goes to `notes`.
    fn cpu_report(&self, c: &CpuDiff, w: Window, notes: &mut Vec<String>) -> CpuResidency {
        let entries = self.kind.counts_entries();
        let (mut deep_us, mut poll_us, mut wakeups) = (0u64, 0u64, 0u64);
        let mut states = Vec::with_capacity(c.states.len());
        for s in &c.states {
            let poll = is_poll(&s.name);
            if poll {
                poll_us += s.time_us;
            } else {
                deep_us += s.time_us;
                wakeups += s.transitions;
            }
            states.push(StateResidency {
                index: s.index,
                name: s.name.clone(),
                poll,
                time: Quantity::measured(s.time_us as f64 / 1e6, "s"),
                share: w.share(s.time_us),
                transitions: entries.then(|| count(s.transitions)),
                transitions_per_s: entries.then(|| w.rate(s.transitions)),
                above: s.above.map(count),
                below: s.below.map(count),
            });
        }
        if c.states.is_empty() {
            notes.push(format!(
                "cpu{}: no cpuidle states (no cpuidle driver): counted busy for the whole window",
                c.cpu
            ));
        }
        let clamped = deep_us > self.wall_us;
        if clamped {
            notes.push(format!(
                "cpu{}: deep idle {:.3} > 1 (a sleep that began before the window ended in it)",
                c.cpu,
                w.share(deep_us).value
            ));
        }
        let busy_us = self.wall_us.saturating_sub(deep_us);
        CpuResidency {
            cpu: c.cpu,
            deep_idle_share: w.share(deep_us),
            poll_share: w.share(poll_us),
            busy_share: w.share(busy_us),
            busy: Quantity::measured(busy_us as f64 / 1e6, "s"),
            clamped,
            wakeups: entries.then(|| count(wakeups)),
            wakeups_per_s: entries.then(|| w.rate(wakeups)),
            mean_sleep: (entries && wakeups > 0)
                .then(|| Quantity::measured(deep_us as f64 / wakeups as f64, "us")),
            states,
        }
    }
}

/// A window's wall time, for shares of it and rates over it.
#[derive(Clone, Copy)]
struct Window {
    wall_us: f64,
}

impl Window {
    /// `us` as a share of the window (0 for an empty window).
    fn share(self, us: u64) -> Quantity {
        Quantity::measured(
            if self.wall_us > 0.0 {
                us as f64 / self.wall_us
            } else {
                0.0
            },
            "share",
        )
    }

    /// `n` events over the window, per second (0 for an empty window).
    fn rate(self, n: u64) -> Quantity {
        let wall_s = self.wall_us / 1e6;
        Quantity::measured(if wall_s > 0.0 { n as f64 / wall_s } else { 0.0 }, "1/s")
    }
}

/// A number of events.
fn count(n: u64) -> Quantity {
    Quantity::measured(n as f64, "count")
}

/// One idle state of one CPU over the window.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StateResidency {
    /// `K` of `stateK`.
    pub index: u32,
    pub name: String,
    /// True for the POLL pseudo-state (counted as busy).
    pub poll: bool,
    /// Time in the state, s.
    pub time: Quantity,
    /// time / window.
    pub share: Quantity,
    /// Entries into the state (null where the counters have none: [`CounterKind::ProcStat`]).
    pub transitions: Option<Quantity>,
    pub transitions_per_s: Option<Quantity>,
    /// Too-deep / too-shallow entries, when the kernel reports them.
    pub above: Option<Quantity>,
    pub below: Option<Quantity>,
}

/// One CPU over the window.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CpuResidency {
    pub cpu: u32,
    /// Share of the window in non-POLL idle states (can exceed 1, see the caveats).
    pub deep_idle_share: Quantity,
    /// Share in POLL (counted as busy).
    pub poll_share: Quantity,
    /// 1 − deep idle (running or polling), clamped to [0, 1].
    pub busy_share: Quantity,
    /// Busy time, s.
    pub busy: Quantity,
    /// Deep idle exceeded the window and busy was clamped to 0.
    pub clamped: bool,
    /// Entries into non-POLL states (each ends in a wakeup); null without entry counts.
    pub wakeups: Option<Quantity>,
    pub wakeups_per_s: Option<Quantity>,
    /// Mean length of a non-POLL sleep, µs, when there was one.
    pub mean_sleep: Option<Quantity>,
    pub states: Vec<StateResidency>,
}

/// CPU idle residency over a window (or several summed): the one JSON shape every command
/// emits. Every number is labeled measured; the means are over `cpus_measured` CPUs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Residency {
    /// Always `measured` (read from kernel counters).
    pub label: Label,
    pub source: String,
    /// [`DEFINITIONS`]: what POLL, deep idle and wakeups mean here, and the caveat.
    pub definitions: &'static str,
    /// Wall time of the window(s), s.
    pub interval: Quantity,
    /// Snapshot differences summed into this one.
    pub windows: usize,
    /// CPUs the means are over (the sample count of the shares).
    pub cpus_measured: usize,
    /// Mean over CPUs of the deep-idle share.
    pub deep_idle_share: Quantity,
    /// Mean over CPUs of the POLL share.
    pub poll_share: Quantity,
    /// Mean over CPUs of the busy share.
    pub busy_share: Quantity,
    /// Sum over CPUs; null without entry counts (see `unavailable`).
    pub wakeups: Option<Quantity>,
    pub wakeups_per_s: Option<Quantity>,
    /// What these counters cannot give on this machine, and why (null where nothing is missing).
    pub unavailable: Option<String>,
    pub per_cpu: Vec<CpuResidency>,
    pub notes: Vec<String>,
}

impl Residency {
    /// A short human-readable table.
    pub fn render(&self) -> String {
        let mut out = format!(
            "idle residency (measured, {}, {:.3} s, {} window(s), {} CPUs; POLL counted as busy)\n",
            self.source, self.interval.value, self.windows, self.cpus_measured
        );
        let wakeups = |n: &Option<Quantity>, r: &Option<Quantity>| match (n, r) {
            (Some(n), Some(r)) => format!("{} wakeups ({:.0}/s)", n.value, r.value),
            _ => "wakeups not counted".to_string(),
        };
        out.push_str(&format!(
            "  mean over CPUs: deep idle {:.1}%, poll {:.1}%, busy {:.1}%; {}\n",
            100.0 * self.deep_idle_share.value,
            100.0 * self.poll_share.value,
            100.0 * self.busy_share.value,
            wakeups(&self.wakeups, &self.wakeups_per_s)
        ));
        for c in &self.per_cpu {
            out.push_str(&format!(
                "  cpu{}: deep idle {:.1}%, poll {:.1}%, busy {:.1}%{}, {}",
                c.cpu,
                100.0 * c.deep_idle_share.value,
                100.0 * c.poll_share.value,
                100.0 * c.busy_share.value,
                if c.clamped { " (clamped)" } else { "" },
                wakeups(&c.wakeups, &c.wakeups_per_s)
            ));
            for s in &c.states {
                out.push_str(&format!("; {} {:.1}%", s.name, 100.0 * s.share.value));
                if let Some(t) = &s.transitions {
                    out.push_str(&format!(" ×{}", t.value));
                }
            }
            out.push('\n');
        }
        if let Some(u) = &self.unavailable {
            out.push_str(&format!("  unavailable here: {u}\n"));
        }
        for n in &self.notes {
            out.push_str(&format!("  note: {n}\n"));
        }
        out
    }
}

/// Read a snapshot of the real machine.
pub fn snapshot() -> Result<Snapshot, ResidencyError> {
    Snapshot::read(&MachineRoot::real())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};

    /// A machine root in `t` and its CPU sysfs directory.
    fn machine(t: &tempfile::TempDir) -> (MachineRoot, PathBuf) {
        let m = MachineRoot::at(t.path());
        let sys = m.sys_cpu();
        std::fs::create_dir_all(&sys).unwrap();
        (m, sys)
    }

    fn val(q: &Option<Quantity>) -> f64 {
        q.as_ref().expect("counted").value
    }

    const S: u64 = 1_000_000_000; // 1 s in ns

    fn write_state(root: &Path, cpu: u32, idx: u32, name: &str, time: u64, usage: u64) {
        let d = root.join(format!("cpu{cpu}/cpuidle/state{idx}"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("name"), format!("{name}\n")).unwrap();
        std::fs::write(d.join("time"), format!("{time}\n")).unwrap();
        std::fs::write(d.join("usage"), format!("{usage}\n")).unwrap();
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn synthetic_sysfs_tree() {
        let t = tempfile::tempdir().unwrap();
        let (m, sys) = machine(&t);
        let root = sys.as_path();
        // Noise the reader must ignore.
        std::fs::create_dir_all(root.join("cpufreq")).unwrap();
        std::fs::create_dir_all(root.join("cpuidle")).unwrap();
        std::fs::write(root.join("cpuidle/current_driver"), "haltpoll\n").unwrap();
        std::fs::write(root.join("cpuidle/current_governor_ro"), "haltpoll\n").unwrap();
        std::fs::write(root.join("online"), "0-1\n").unwrap();
        for cpu in 0..2 {
            write_state(root, cpu, 0, "POLL", 1000, 10);
            write_state(root, cpu, 1, "haltpoll", 5000, 100);
        }
        // cpu10 sorts numerically after cpu2.
        write_state(root, 10, 0, "POLL", 0, 0);
        write_state(root, 10, 1, "C1", 0, 0);
        std::fs::write(root.join("cpu0/cpuidle/state1/above"), "3\n").unwrap();
        let before = Snapshot::read_with_wall(&m, 0).unwrap();
        assert_eq!(
            before.cpus.iter().map(|c| c.cpu).collect::<Vec<_>>(),
            [0, 1, 10]
        );
        assert_eq!(before.driver.as_deref(), Some("haltpoll"));
        assert_eq!(before.governor.as_deref(), Some("haltpoll"));
        assert_eq!(before.cpus[0].states[1].above, Some(3));
        assert_eq!(before.cpus[1].states[1].above, None);

        // One second: cpu0 polls 100 ms and sleeps 600 ms in 60 entries; cpu1 sleeps 900 ms.
        write_state(root, 0, 0, "POLL", 101_000, 30);
        write_state(root, 0, 1, "haltpoll", 605_000, 160);
        std::fs::write(root.join("cpu0/cpuidle/state1/above"), "5\n").unwrap();
        write_state(root, 1, 1, "haltpoll", 905_000, 110);
        write_state(root, 10, 1, "C1", 1_000_000, 1);
        let after = Snapshot::read_with_wall(&m, S).unwrap();
        let d = before.diff(&after).unwrap();
        assert_eq!(d.windows, 1);
        let r = d.report();
        assert_eq!(r.label, Label::Measured);
        assert_eq!(r.cpus_measured, 3);
        assert!(close(r.interval.value, 1.0));
        let c0 = &r.per_cpu[0];
        assert!(close(c0.deep_idle_share.value, 0.6));
        assert!(close(c0.poll_share.value, 0.1));
        assert!(close(c0.busy_share.value, 0.4), "POLL counts as busy");
        assert_eq!(val(&c0.wakeups), 60.0, "POLL entries are not wakeups");
        assert_eq!(val(&c0.states[0].transitions), 20.0);
        assert!(c0.states[0].poll && !c0.states[1].poll);
        assert_eq!(c0.states[1].above.as_ref().map(|q| q.value), Some(2.0));
        assert_eq!(c0.states[1].below, None);
        assert_eq!(c0.mean_sleep.as_ref().map(|q| q.value), Some(10_000.0));
        assert!(!c0.clamped);
        let c1 = &r.per_cpu[1];
        assert!(close(c1.deep_idle_share.value, 0.9));
        assert_eq!(val(&c1.wakeups), 10.0);
        assert!(close(r.per_cpu[2].deep_idle_share.value, 1.0));
        assert!(close(r.deep_idle_share.value, (0.6 + 0.9 + 1.0) / 3.0));
        assert!(close(r.busy_share.value, (0.4 + 0.1 + 0.0) / 3.0));
        assert_eq!(val(&r.wakeups), 71.0);
        assert!(close(val(&r.wakeups_per_s), 71.0));
        assert!(r.source.contains("haltpoll"));
        assert!(r.render().contains("cpu0: deep idle 60.0%"));

        // Every number in the JSON is labeled measured.
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["label"], "measured");
        assert_eq!(v["cpus_measured"], 3);
        assert_eq!(v["deep_idle_share"]["label"], "measured");
        assert_eq!(v["per_cpu"][0]["states"][1]["share"]["unit"], "share");
        assert!(v["definitions"]
            .as_str()
            .unwrap()
            .contains("POLL counts as busy"));

        // Two equal windows sum to the same shares and double counts.
        let mut m = d.clone();
        m.accumulate(&d).unwrap();
        let m = m.report();
        assert_eq!(m.windows, 2);
        assert!(close(m.deep_idle_share.value, r.deep_idle_share.value));
        assert_eq!(val(&m.wakeups), 142.0);
        assert!(close(val(&m.wakeups_per_s), 71.0));
        assert_eq!(val(&m.per_cpu[0].states[1].transitions), 120.0);
        assert_eq!(
            m.per_cpu[0].states[1].above.as_ref().map(|q| q.value),
            Some(4.0)
        );
        let mut e = ResidencyDiff::default();
        e.accumulate(&d).unwrap();
        assert_eq!(e, d);
    }

    #[test]
    fn a_sleep_ending_in_the_window_is_clamped_and_noted() {
        let t = tempfile::tempdir().unwrap();
        let (m, sys) = machine(&t);
        write_state(&sys, 0, 0, "C1", 0, 0);
        let a = Snapshot::read_with_wall(&m, 0).unwrap();
        write_state(&sys, 0, 0, "C1", 1_200_000, 1);
        let b = Snapshot::read_with_wall(&m, S).unwrap();
        let r = a.diff(&b).unwrap().report();
        assert!(close(r.per_cpu[0].deep_idle_share.value, 1.2));
        assert_eq!(r.per_cpu[0].busy_share.value, 0.0);
        assert!(r.per_cpu[0].clamped);
        assert!(r.notes[0].contains("> 1"), "{:?}", r.notes);
    }

    #[test]
    fn absent_cpuidle_falls_back_to_proc_stat_or_says_why() {
        let t = tempfile::tempdir().unwrap();
        let m = MachineRoot::at(t.path());
        let e = Snapshot::read(&m).unwrap_err().to_string();
        assert!(e.contains("unavailable"), "{e}");
        let sys = m.sys_cpu();
        std::fs::create_dir_all(sys.join("cpu0/cpufreq")).unwrap();
        std::fs::create_dir_all(sys.join("cpu1/cpufreq")).unwrap();
        let e = Snapshot::read(&m).unwrap_err().to_string();
        assert!(
            e.contains("no cpuidle states") && e.contains("proc/stat"),
            "{e}"
        );
        // With /proc/stat: one undivided idle state per CPU, no entry counts.
        std::fs::create_dir_all(t.path().join("proc")).unwrap();
        let stat = |i0: u64, i1: u64| {
            std::fs::write(
                m.proc_stat(),
                format!(
                    "cpu 0 0 0 {} 0 0 0 0\ncpu0 0 0 0 {i0} 0 0 0 0\ncpu1 0 0 0 {i1} 0 0 0 0\n",
                    i0 + i1
                ),
            )
            .unwrap()
        };
        stat(100, 200);
        let a = Snapshot::read_with_wall(&m, 0).unwrap();
        assert_eq!(a.kind, CounterKind::ProcStat);
        assert!(a.source().contains("/proc/stat"), "{}", a.source());
        // One second: cpu0 idles 250 ms, cpu1 900 ms.
        stat(125, 290);
        let b = Snapshot::read_with_wall(&m, S).unwrap();
        let r = a.diff(&b).unwrap().report();
        assert!(close(r.per_cpu[0].deep_idle_share.value, 0.25));
        assert!(close(r.per_cpu[1].busy_share.value, 0.1));
        assert_eq!(r.per_cpu[1].states[0].name, "idle");
        assert!(r.per_cpu[1].states[0].transitions.is_none());
        assert!(r.wakeups.is_none() && r.per_cpu[0].wakeups.is_none());
        assert!(r.per_cpu[0].mean_sleep.is_none());
        assert!(r
            .unavailable
            .as_deref()
            .unwrap()
            .contains("no cpuidle driver"));
        assert!(r.notes.iter().any(|n| n.contains("10 ms")), "{:?}", r.notes);
        let text = r.render();
        assert!(
            text.contains("wakeups not counted") && text.contains("unavailable here"),
            "{text}"
        );
        let j = serde_json::to_value(&r).unwrap();
        assert!(j["wakeups"].is_null());
        assert_eq!(j["per_cpu"][0]["deep_idle_share"]["label"], "measured");
        // Unreadable cpuidle counters are an error, not zeros, and not a fallback.
        write_state(&sys, 0, 0, "POLL", 1, 1);
        std::fs::write(sys.join("cpu0/cpuidle/state0/time"), "x\n").unwrap();
        let e = Snapshot::read(&m).unwrap_err().to_string();
        assert!(e.contains("unreadable"), "{e}");
        // Snapshots of two sources do not compare.
        std::fs::write(sys.join("cpu0/cpuidle/state0/time"), "1\n").unwrap();
        let c = Snapshot::read_with_wall(&m, 2 * S).unwrap();
        assert!(matches!(b.diff(&c), Err(ResidencyError::Mismatch(_))));
    }

    #[test]
    fn states_changing_mid_window_are_left_out() {
        let t = tempfile::tempdir().unwrap();
        let (m, sys) = machine(&t);
        write_state(&sys, 0, 0, "POLL", 0, 0);
        let before = Snapshot::read_with_wall(&m, 0).unwrap();
        write_state(&sys, 0, 1, "C1", 10, 1);
        write_state(&sys, 1, 0, "POLL", 0, 0);
        let after = Snapshot::read_with_wall(&m, S).unwrap();
        let r = before.diff(&after).unwrap().report();
        assert_eq!(r.cpus_measured, 0);
        assert!(
            r.notes.iter().any(|n| n.contains("changed")),
            "{:?}",
            r.notes
        );
        assert!(
            r.notes.iter().any(|n| n.contains("appeared")),
            "{:?}",
            r.notes
        );
    }

    #[test]
    fn this_machine_if_present() {
        match snapshot() {
            // With or without a cpuidle driver, every online CPU has at least one state.
            Ok(s) => assert!(s.cpus.iter().all(|c| !c.states.is_empty()), "{s:?}"),
            Err(e) => preheat_testsupport::skip!("cpuidle", "{e}"),
        }
    }
}
