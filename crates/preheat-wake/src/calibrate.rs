//! Which keep-awake mechanism works on the machine at hand, measured rather than assumed.
//!
//! Machines of our kind differ in ways that decide this: with the `haltpoll` cpuidle driver a
//! per-CPU PM QoS constraint (or `/dev/cpu_dma_latency`) makes idle CPUs poll and a blocked
//! thread runs 2–6 µs after its wakeup instead of 20–90 µs; without a cpuidle driver the idle
//! loop halts whatever PM QoS says, and a `SCHED_IDLE` spinner on the CPU may do better. So
//! [`calibrate`] measures, for each mechanism the planner offers (`pmqos`, `dma`, `spin`) and for
//! plain idle (`none`), how long a thread blocked on a futex for ≥ 10 ms idle takes to run after
//! it is woken from another CPU, with the mechanism held through the whole idle gap (the
//! [`crate::bench`] measurement with `--held`, `rounds` samples each), and names the best: the mechanism with the lowest p50 **whose 95% CI lies below that
//! of plain idle**. Where none beats idle, there is no best, and callers say so instead of
//! claiming the CPUs are kept awake.
//!
//! The result is cached per boot in the run directory ([`FILE`]), keyed by the boot id, the
//! kernel release, the cpuidle driver and the CPU model ([`MachineKey`]): a cached calibration of
//! another boot or machine is never used. It is a measurement of a moment (other tenants' load
//! moves it); [`Calibration::measured_unix_s`] says when. **The host can change under one
//! boot**: on the EPYC `haltpoll` host (2026-11-29) plain idle woke a thread in 90.6 µs p50 at
//! 23:15, when `dma` (9.2 µs) was chosen and cached, and in 7.1 µs half an hour later, when no
//! mechanism beat idle. So before a cached calibration is used, [`load_or_calibrate`] measures
//! plain idle again ([`RECHECK_ROUNDS`] samples, ~0.1 s) and calibrates anew where that moved
//! by more than [`RECHECK_FACTOR`] beyond the cached interval ([`still_holds`]).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::bench::{BenchArgs, Cell};
use crate::keep_awake::{MechChoice, Mechanism};
use crate::predictor::PredictorResult;

/// The cache file in the run directory.
pub const FILE: &str = "calibration.json";

/// Idle gap before each measured wakeup (µs): long enough for the deepest idle state.
pub const GAP_US: u64 = 10_000;

/// Other processes' CPU use above which a calibration is not cached (it measured them too).
pub const MAX_OTHERS_SHARE: f64 = 0.15;

/// Samples per mechanism by default.
pub const DEFAULT_ROUNDS: usize = 25;

/// Samples of plain idle's wake-up taken to check that a cached calibration still describes
/// the host ([`load_or_calibrate`]).
pub const RECHECK_ROUNDS: usize = 9;

/// How far plain idle's wake-up may have moved from a cached calibration's before the host
/// counts as changed: a factor beyond the cached 95% CI, either way.
pub const RECHECK_FACTOR: f64 = 2.0;

/// The keep-awake mechanisms a calibration may choose from by default.
pub const MECHANISMS: [&str; 3] = ["pmqos", "dma", "spin"];

/// What identifies the machine a calibration is valid for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MachineKey {
    /// `/proc/sys/kernel/random/boot_id`.
    pub boot_id: String,
    /// `/proc/sys/kernel/osrelease`.
    pub kernel: String,
    /// `cpuidle/current_driver` (`none` without a driver, `absent` where the file is missing).
    pub cpuidle_driver: String,
    pub cpu_model: String,
    /// `cpuidle/current_governor` (empty where unknown): it decides whether a latency
    /// constraint makes idle CPUs poll.
    #[serde(default)]
    pub cpuidle_governor: String,
    /// Idle states disabled on some CPU, as `cpuN/NAME` (disabling `POLL` keeps PM QoS from
    /// making CPUs poll: the calibration of another setting is not this one's).
    #[serde(default)]
    pub disabled_idle_states: Vec<String>,
}

fn read_trim(p: &str) -> String {
    std::fs::read_to_string(p)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

impl MachineKey {
    /// The machine this process runs on.
    pub fn current() -> MachineKey {
        let topo = preheat_engine::topology::read();
        MachineKey {
            boot_id: read_trim("/proc/sys/kernel/random/boot_id"),
            kernel: read_trim("/proc/sys/kernel/osrelease"),
            cpuidle_driver: topo
                .cpuidle_driver
                .clone()
                .unwrap_or_else(|| "absent".into()),
            cpu_model: preheat_engine::topology::cpu_model(),
            cpuidle_governor: topo.cpuidle_governor.clone().unwrap_or_default(),
            disabled_idle_states: topo
                .cpus
                .iter()
                .flat_map(|c| {
                    c.disabled_idle_states
                        .iter()
                        .map(move |s| format!("cpu{}/{s}", c.cpu))
                })
                .collect(),
        }
    }
}

/// One mechanism's measured wake-up latency.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MechResult {
    /// `none`, `pmqos`, `dma` or `spin`.
    pub mech: String,
    /// Samples.
    pub n: usize,
    pub p50_us: f64,
    /// 95% confidence interval of the p50.
    pub p50_ci_us: [f64; 2],
    pub p99_us: f64,
}

impl From<&Cell> for MechResult {
    fn from(c: &Cell) -> MechResult {
        MechResult {
            mech: c.mech.clone(),
            n: c.n,
            p50_us: c.p50_us,
            p50_ci_us: c.p50_ci_us,
            p99_us: c.p99_us,
        }
    }
}

/// A calibration: every mechanism's wake-up latency after [`GAP_US`] idle, and the best one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// Always `measured`.
    pub label: String,
    pub machine: MachineKey,
    /// When it was measured (seconds since the Unix epoch).
    pub measured_unix_s: u64,
    pub gap_us: u64,
    pub sleeper_cpu: usize,
    pub waker_cpu: usize,
    pub results: Vec<MechResult>,
    /// Mechanisms that could not be measured, and why.
    pub skipped: Vec<String>,
    /// Share of the machine's CPU time other processes used while it was measured (`None`:
    /// unknown). Above [`MAX_OTHERS_SHARE`] the calibration is reported but not cached.
    #[serde(default)]
    pub others_cpu_share: Option<f64>,
    /// The mechanism with the lowest p50 among those whose p50 CI lies entirely below plain
    /// idle's; `None` when no mechanism measured faster than idle.
    pub best: Option<Mechanism>,
    /// The mechanisms it was allowed to choose from, where fewer than [`MECHANISMS`]
    /// (`wake calibrate --mechs`); empty: all of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub limited_to: Vec<String>,
    /// Whether the sleeper CPU kept its branch-prediction state through a short idle
    /// ([`crate::predictor`]; `None`: not measured, see `skipped`, or a calibration from
    /// before it was part of one).
    #[serde(default)]
    pub predictor: Option<PredictorResult>,
}

/// The mechanism of a result's name (`None` for plain idle).
fn mechanism(name: &str) -> Option<Mechanism> {
    match name {
        "pmqos" => Some(Mechanism::PmQos),
        "dma" => Some(Mechanism::DmaLatency),
        "spin" => Some(Mechanism::Spin),
        _ => None,
    }
}

/// The best mechanism of `results`: lowest p50 among those whose CI lies below `none`'s.
pub fn choose(results: &[MechResult]) -> Option<Mechanism> {
    let none = results.iter().find(|r| r.mech == "none")?;
    results
        .iter()
        .filter_map(|r| Some((mechanism(&r.mech)?, r)))
        .filter(|(_, r)| r.n > 0 && r.p50_ci_us[1] < none.p50_ci_us[0])
        .min_by(|a, b| a.1.p50_us.total_cmp(&b.1.p50_us))
        .map(|(m, _)| m)
}

impl Calibration {
    /// The result of `mech` (`none`, `pmqos`, `dma`, `spin`).
    pub fn result(&self, mech: &str) -> Option<&MechResult> {
        self.results.iter().find(|r| r.mech == mech)
    }

    /// The planner's choice that applies the best mechanism (`Auto` when there is none).
    pub fn choice(&self) -> MechChoice {
        match self.best {
            Some(Mechanism::PmQos) => MechChoice::PmQos,
            Some(Mechanism::DmaLatency) => MechChoice::Dma,
            Some(Mechanism::Spin) => MechChoice::Spin,
            None => MechChoice::Auto,
        }
    }

    /// Whether other processes loaded the machine while it was measured.
    pub fn disturbed(&self) -> bool {
        self.others_cpu_share.is_some_and(|s| s > MAX_OTHERS_SHARE)
    }

    /// Whether it was measured on the machine and boot this process runs on.
    pub fn is_current(&self) -> bool {
        self.machine == MachineKey::current()
    }

    /// One line: the best mechanism and its measured effect, with sample counts.
    pub fn summary(&self) -> String {
        let fmt = |r: &MechResult| {
            format!(
                "{} {:.1} µs ({:.1}–{:.1}, n={})",
                r.mech, r.p50_us, r.p50_ci_us[0], r.p50_ci_us[1], r.n
            )
        };
        let all: Vec<String> = self.results.iter().map(fmt).collect();
        let verdict = match self.best {
            Some(m) => format!("best: {m}"),
            None => "no mechanism woke threads faster than plain idle".into(),
        };
        let verdict = if self.limited_to.is_empty() {
            verdict
        } else {
            format!(
                "{verdict} among {} (limited by `wake calibrate --mechs`)",
                self.limited_to.join(", ")
            )
        };
        let load = match self.others_cpu_share {
            Some(s) if self.disturbed() => format!(
                "; other processes used {:.0}% of the CPUs meanwhile: a disturbed measurement",
                s * 100.0
            ),
            Some(s) => format!("; other processes {:.0}% of the CPUs", s * 100.0),
            None => String::new(),
        };
        let disabled = if self.machine.disabled_idle_states.is_empty() {
            String::new()
        } else {
            format!(
                ", idle states disabled: {}",
                self.machine.disabled_idle_states.join(" ")
            )
        };
        format!(
            "{verdict} (measured{}: futex wake-up p50 after {} ms idle: {}; cpuidle driver \
             {}{disabled}{load})",
            age_phrase(self.measured_unix_s, unix_now_s()),
            self.gap_us / 1000,
            all.join(", "),
            self.machine.cpuidle_driver
        )
    }
}

/// Seconds since the epoch now (0 if the clock is before it).
fn unix_now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// How long ago a calibration was measured, where it is a cached one (a minute or more): so a
/// summary does not pass numbers from earlier in the boot as this run's.
fn age_phrase(measured_unix_s: u64, now_unix_s: u64) -> String {
    let age = now_unix_s.saturating_sub(measured_unix_s);
    match age {
        0..=59 => String::new(),
        60..=5399 => format!(
            " {} min ago in this boot (cached; plain idle re-checked since)",
            age / 60
        ),
        _ => format!(
            " {:.1} h ago in this boot (cached; plain idle re-checked since)",
            age as f64 / 3600.0
        ),
    }
}

/// The cache file of `run_dir`.
pub fn cache_path(run_dir: &Path) -> PathBuf {
    run_dir.join(FILE)
}

/// The cached calibration of this machine and boot, if there is one.
pub fn cached(run_dir: &Path) -> Option<Calibration> {
    let text = std::fs::read_to_string(cache_path(run_dir)).ok()?;
    let c: Calibration = serde_json::from_str(&text).ok()?;
    c.is_current().then_some(c)
}

/// Measure every mechanism now (about `rounds` × 4 × 11 ms, plus starting a planner per
/// mechanism; needs two CPUs). Unprivileged, only `none` and `spin` are measured.
pub fn calibrate(rounds: usize) -> Result<Calibration> {
    calibrate_among(rounds, &MECHANISMS.map(String::from))
}

/// [`calibrate`] with the best chosen among `mechs` only (a subset of [`MECHANISMS`]; plain
/// idle is always measured).
pub fn calibrate_among(rounds: usize, mechs: &[String]) -> Result<Calibration> {
    let online = preheat_engine::os::online_cpus();
    anyhow::ensure!(
        online >= 2,
        "calibration needs two CPUs (a sleeper and a waker)"
    );
    for m in mechs {
        anyhow::ensure!(
            MECHANISMS.contains(&m.as_str()),
            "unknown keep-awake mechanism {m:?} (choose from {})",
            MECHANISMS.join(", ")
        );
    }
    anyhow::ensure!(!mechs.is_empty(), "--mechs needs at least one mechanism");
    // The allowed mechanisms in their usual order; a limit only where some are left out.
    let allowed: Vec<String> = MECHANISMS
        .iter()
        .filter(|m| mechs.iter().any(|x| x == *m))
        .map(|m| m.to_string())
        .collect();
    let limited_to = if allowed.len() < MECHANISMS.len() {
        allowed.clone()
    } else {
        Vec::new()
    };
    let args = BenchArgs {
        gaps_us: vec![GAP_US],
        rounds,
        mechs: std::iter::once("none".to_string()).chain(allowed).collect(),
        waiters: vec!["futex".into()],
        held: true,
        sleeper_cpu: 1,
        waker_cpu: 0,
        json: true,
    };
    use preheat_engine::procstat::{machine_use, others_share};
    let before = machine_use();
    let report = crate::bench::bench(&args).context("measuring wake-up latency")?;
    let others_cpu_share = before
        .zip(machine_use())
        .and_then(|(b, a)| others_share(&b, &a));
    let results: Vec<MechResult> = report.cells.iter().map(MechResult::from).collect();
    let mut skipped = report.skipped;
    let predictor = crate::predictor::measure_on(args.sleeper_cpu)
        .map_err(|e| skipped.push(format!("branch prediction after idle: {e}")))
        .ok();
    Ok(Calibration {
        label: "measured".into(),
        machine: MachineKey::current(),
        measured_unix_s: unix_now_s(),
        gap_us: GAP_US,
        sleeper_cpu: args.sleeper_cpu,
        waker_cpu: args.waker_cpu,
        best: choose(&results),
        results,
        skipped,
        others_cpu_share,
        limited_to,
        predictor,
    })
}

/// Write `c` to the cache of `run_dir` (atomically: a temporary file renamed over it).
pub fn store(run_dir: &Path, c: &Calibration) -> Result<()> {
    std::fs::create_dir_all(run_dir).with_context(|| format!("creating {}", run_dir.display()))?;
    let path = cache_path(run_dir);
    let tmp = run_dir.join(format!(".{FILE}.{}", std::process::id()));
    std::fs::write(&tmp, serde_json::to_string_pretty(c)?)
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))
}

/// Whether plain idle's wake-up measured `now` still fits calibration `c`: within
/// [`RECHECK_FACTOR`] of its interval for plain idle, either way (a calibration without plain
/// idle has nothing to compare: it holds).
pub fn still_holds(c: &Calibration, now: &MechResult) -> bool {
    let Some(then) = c.result("none") else {
        return true;
    };
    now.n == 0
        || (now.p50_us >= then.p50_ci_us[0] / RECHECK_FACTOR
            && now.p50_us <= then.p50_ci_us[1] * RECHECK_FACTOR)
}

/// Plain idle's wake-up after [`GAP_US`], `rounds` samples.
fn idle_wake_up(rounds: usize) -> Result<MechResult> {
    let args = BenchArgs {
        gaps_us: vec![GAP_US],
        rounds,
        mechs: vec!["none".into()],
        waiters: vec!["futex".into()],
        held: true,
        sleeper_cpu: 1,
        waker_cpu: 0,
        json: true,
    };
    let report = crate::bench::bench(&args).context("measuring plain idle's wake-up")?;
    report
        .cells
        .iter()
        .find(|c| c.mech == "none")
        .map(MechResult::from)
        .context("no measurement of plain idle")
}

/// A cached calibration, checked against the host as it is now ([`checked`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Checked {
    /// None cached for this boot and machine.
    Missing,
    /// Cached, and plain idle still wakes as it did then (or the check could not be made).
    Holds(Calibration),
    /// Cached, but the host changed since: why, in words with the numbers.
    Changed(Calibration, String),
}

/// The cached calibration of this boot, checked: plain idle measured again
/// ([`RECHECK_ROUNDS`] samples, ~0.1 s) and compared ([`still_holds`]).
pub fn checked(run_dir: &Path) -> Checked {
    let Some(c) = cached(run_dir) else {
        return Checked::Missing;
    };
    // A check that cannot be made keeps the cached calibration (it was valid for this boot).
    let Ok(now) = idle_wake_up(RECHECK_ROUNDS) else {
        return Checked::Holds(c);
    };
    if still_holds(&c, &now) {
        return Checked::Holds(c);
    }
    let then = c.result("none").map_or(0.0, |r| r.p50_us);
    let why = format!(
        "the host changed since this boot's calibration: plain idle woke a thread in {:.1} µs (p50, n={}, measured) against {then:.1} µs then",
        now.p50_us, now.n
    );
    Checked::Changed(c, why)
}

/// The cached calibration of this boot where it still holds ([`checked`]), or a new one
/// (measured among the same mechanisms, then cached unless other processes loaded the machine
/// meanwhile or no mechanism beat idle — both are worth measuring again next time).
/// `progress` is told before a calibration starts, and why.
pub fn load_or_calibrate(run_dir: &Path, progress: impl FnOnce(&str)) -> Result<Calibration> {
    let (limited_to, why) = match checked(run_dir) {
        Checked::Holds(c) => return Ok(c),
        Checked::Missing => (Vec::new(), "once per boot".to_string()),
        Checked::Changed(c, why) => (c.limited_to, why),
    };
    // Among the mechanisms the stale calibration was limited to, else all of them.
    let mechs = if limited_to.is_empty() {
        MECHANISMS.map(String::from).to_vec()
    } else {
        limited_to
    };
    progress(&format!(
        "calibrating the keep-awake mechanisms ({why}; ~{} s; cached in {})",
        (DEFAULT_ROUNDS * 4 * 12).div_ceil(1000) + 1,
        cache_path(run_dir).display()
    ));
    let c = calibrate_among(DEFAULT_ROUNDS, &mechs)?;
    if !c.disturbed() && c.best.is_some() {
        store(run_dir, &c)?;
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(mech: &str, p50: f64, lo: f64, hi: f64) -> MechResult {
        MechResult {
            mech: mech.into(),
            n: 25,
            p50_us: p50,
            p50_ci_us: [lo, hi],
            p99_us: hi * 2.0,
        }
    }

    /// A calibration of this machine that chose `dma` over plain idle at `none`'s interval.
    fn dma_best(none: MechResult, others_cpu_share: f64) -> Calibration {
        Calibration {
            label: "measured".into(),
            machine: MachineKey::current(),
            measured_unix_s: 1,
            gap_us: GAP_US,
            sleeper_cpu: 1,
            waker_cpu: 0,
            results: vec![none, r("dma", 3.0, 2.5, 4.0)],
            skipped: vec![],
            best: Some(Mechanism::DmaLatency),
            others_cpu_share: Some(others_cpu_share),
            limited_to: vec![],
            predictor: None,
        }
    }

    #[test]
    fn a_cached_calibration_says_how_old_it_is() {
        assert_eq!(age_phrase(1000, 1030), "");
        assert!(age_phrase(1000, 1000 + 600).starts_with(" 10 min ago in this boot (cached"));
        assert!(age_phrase(1000, 1000 + 4 * 3600).starts_with(" 4.0 h ago"));
        assert_eq!(
            age_phrase(2000, 1000),
            "",
            "a clock behind the cache is no age"
        );
    }

    #[test]
    fn the_best_must_beat_idle_by_its_interval() {
        // A haltpoll-like machine: polling wins by far.
        let haltpoll = [
            r("none", 70.0, 60.0, 80.0),
            r("pmqos", 4.0, 3.0, 5.0),
            r("dma", 3.0, 2.5, 4.0),
            r("spin", 20.0, 18.0, 25.0),
        ];
        assert_eq!(choose(&haltpoll), Some(Mechanism::DmaLatency));
        // No cpuidle driver: spinning wins, polling idle only halves the latency.
        let none = [
            r("none", 68.0, 60.0, 75.0),
            r("pmqos", 33.0, 30.0, 36.0),
            r("dma", 31.0, 28.0, 34.0),
            r("spin", 24.0, 22.0, 26.0),
        ];
        assert_eq!(choose(&none), Some(Mechanism::Spin));
        // Overlapping intervals: nothing is shown to be better than idle.
        let flat = [r("none", 30.0, 20.0, 40.0), r("spin", 25.0, 15.0, 35.0)];
        assert_eq!(choose(&flat), None);
        // Without a measurement of idle there is nothing to compare with.
        assert_eq!(choose(&[r("spin", 1.0, 1.0, 1.0)]), None);
    }

    #[test]
    fn a_cached_calibration_holds_while_idle_wakes_as_it_did() {
        let c = dma_best(r("none", 90.6, 76.9, 97.0), 0.01);
        // Within a factor of two of the cached interval: the same host.
        assert!(still_holds(&c, &r("none", 60.0, 50.0, 70.0)));
        assert!(still_holds(&c, &r("none", 150.0, 140.0, 160.0)));
        // The 2026-11-29 change: idle woke in 7.1 µs half an hour after the calibration.
        assert!(!still_holds(&c, &r("none", 7.1, 6.2, 7.4)));
        assert!(!still_holds(&c, &r("none", 400.0, 300.0, 500.0)));
        // Nothing measured, or nothing to compare with: it holds.
        let mut empty = r("none", 0.0, 0.0, 0.0);
        empty.n = 0;
        assert!(still_holds(&c, &empty));
        let no_idle = Calibration {
            results: vec![r("dma", 3.0, 2.5, 4.0)],
            ..c.clone()
        };
        assert!(still_holds(&no_idle, &r("none", 7.1, 6.2, 7.4)));
    }

    #[test]
    fn a_cache_of_another_boot_is_not_used() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = dma_best(r("none", 70.0, 60.0, 80.0), 0.5);
        assert!(c.disturbed());
        assert!(c.summary().contains("disturbed"), "{}", c.summary());
        store(dir.path(), &c).unwrap();
        assert_eq!(cached(dir.path()), Some(c.clone()));
        assert_eq!(c.choice(), MechChoice::Dma);
        assert!(c.summary().contains("best: dma"), "{}", c.summary());
        c.machine.boot_id = "another boot".into();
        store(dir.path(), &c).unwrap();
        assert_eq!(cached(dir.path()), None);
        // An idle state switched off since: not this setting's calibration either.
        c.machine = MachineKey::current();
        c.machine.disabled_idle_states.push("cpu0/POLL".into());
        store(dir.path(), &c).unwrap();
        assert_eq!(cached(dir.path()), None);
        assert!(
            c.summary().contains("idle states disabled: cpu0/POLL"),
            "{}",
            c.summary()
        );
        // A limited calibration says so wherever it is shown.
        c.limited_to = vec!["spin".into()];
        assert!(
            c.summary()
                .contains("among spin (limited by `wake calibrate --mechs`)"),
            "{}",
            c.summary()
        );
        // A calibration cached before the branch-prediction measurement existed still loads.
        c.machine = MachineKey::current();
        c.limited_to.clear();
        let mut v = serde_json::to_value(&c).unwrap();
        v.as_object_mut().unwrap().remove("predictor");
        std::fs::write(cache_path(dir.path()), v.to_string()).unwrap();
        assert_eq!(cached(dir.path()).map(|c| c.predictor), Some(None));
        // Garbage in the cache is no calibration either.
        std::fs::write(cache_path(dir.path()), "{").unwrap();
        assert_eq!(cached(dir.path()), None);
    }
}
