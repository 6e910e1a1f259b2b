//! Idle counters of every CPU: the one reader behind idle-residency reports (staged bursts,
//! quiescence, modeled energy).
//!
//! Where the kernel has a cpuidle driver, they come from sysfs
//! (`sys/devices/system/cpu/cpu*/cpuidle/state*/{name,time,usage,above,below}`, the driver and
//! governor): time and entries per idle state. Where it has none (`current_driver` reads `none`,
//! no `state*` directories — one of the variants of our machines), the idle loop still runs but
//! nothing counts its states: the counters then come from `proc/stat` as **one undivided idle
//! state** per CPU (idle + iowait ticks, 10 ms resolution, entries unknown), and
//! [`IdleCounters::source`] says so. Both are read under a [`MachineRoot`], so tests use
//! synthetic trees of either variant. Offline CPUs (`cpuN/online` = 0) are skipped.

use std::path::{Path, PathBuf};

use crate::machine::MachineRoot;
use crate::procstat;

/// Where the kernel exposes CPUs on the real machine.
pub const SYSFS_CPU: &str = "/sys/devices/system/cpu";

/// Name of the one undivided state of the `/proc/stat` fallback.
pub const UNDIVIDED_IDLE: &str = "idle";

/// Counters of one idle state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateCounters {
    /// `K` of `stateK`.
    pub index: u32,
    pub name: String,
    /// Cumulative residency, µs.
    pub time_us: u64,
    /// Cumulative entries.
    pub usage: u64,
    /// Entries where the state turned out too deep / too shallow, when the kernel reports it.
    pub above: Option<u64>,
    pub below: Option<u64>,
}

/// The idle states of one online CPU (empty when it has no cpuidle directory).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuCounters {
    pub cpu: u32,
    pub states: Vec<StateCounters>,
}

/// Where idle counters come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdleSource {
    /// Per-state time and entries from the cpuidle driver's sysfs counters.
    Cpuidle,
    /// No cpuidle states: idle + iowait time per CPU from `/proc/stat`, one undivided state
    /// named [`UNDIVIDED_IDLE`], in ticks of 1/[`procstat::USER_HZ`] s; entries unknown (`usage`
    /// is 0).
    ProcStat,
}

/// Every online CPU's idle counters at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdleCounters {
    pub cpus: Vec<CpuCounters>,
    pub driver: Option<String>,
    pub governor: Option<String>,
    pub source: IdleSource,
}

/// Why counters could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdleError {
    /// No `cpuN` directories under the root.
    NoCpus(PathBuf),
    /// No CPU has cpuidle states (no cpuidle driver on this machine or kernel).
    NoCpuidle(PathBuf),
    /// A counter file that exists could not be read or parsed.
    Unreadable(PathBuf),
    /// No cpuidle states, and `/proc/stat` lists none of the CPUs either.
    NoProcStat(PathBuf),
}

impl std::fmt::Display for IdleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IdleError::NoCpus(p) => write!(
                f,
                "no CPUs under {}: idle residency unavailable",
                p.display()
            ),
            IdleError::NoCpuidle(p) => write!(
                f,
                "cpuidle is absent (no {}/cpu*/cpuidle/state*): idle residency unavailable",
                p.display()
            ),
            IdleError::Unreadable(p) => write!(
                f,
                "unreadable cpuidle counter {}: idle residency unavailable",
                p.display()
            ),
            IdleError::NoProcStat(p) => write!(
                f,
                "no cpuidle states and no per-CPU idle time in {}: idle residency unavailable",
                p.display()
            ),
        }
    }
}

impl std::error::Error for IdleError {}

fn read_trim(p: &Path) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

fn read_u64(p: &Path) -> Option<u64> {
    read_trim(p)?.parse().ok()
}

/// `prefixN` entries of `dir`, sorted by N.
fn numbered(dir: &Path, prefix: &str) -> Vec<(u32, PathBuf)> {
    let mut out: Vec<(u32, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name();
            let num = name.to_str()?.strip_prefix(prefix)?;
            if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            Some((num.parse().ok()?, e.path()))
        })
        .collect();
    out.sort_by_key(|(n, _)| *n);
    out
}

/// Read every online CPU's idle counters on the machine at `root`: per state from cpuidle where
/// the kernel has states, else one undivided state from `proc/stat` ([`IdleSource`]).
pub fn read_counters(root: &MachineRoot) -> Result<IdleCounters, IdleError> {
    let sys = root.sys_cpu();
    match read_cpuidle(&sys) {
        Err(IdleError::NoCpuidle(_)) => read_proc_stat(root, &sys),
        r => r,
    }
}

/// The cpuidle driver and governor the kernel names under `sys` (`None` where the file is
/// missing; `Some("none")` where there is no driver).
fn driver_governor(sys: &Path) -> (Option<String>, Option<String>) {
    (
        read_trim(&sys.join("cpuidle/current_driver")),
        read_trim(&sys.join("cpuidle/current_governor"))
            .or_else(|| read_trim(&sys.join("cpuidle/current_governor_ro"))),
    )
}

/// Online CPU numbers and directories under `sys`.
fn online_cpus(sys: &Path) -> Result<Vec<(u32, PathBuf)>, IdleError> {
    let dirs = numbered(sys, "cpu");
    if dirs.is_empty() {
        return Err(IdleError::NoCpus(sys.to_path_buf()));
    }
    Ok(dirs
        .into_iter()
        .filter(|(_, dir)| read_trim(&dir.join("online")).as_deref() != Some("0"))
        .collect())
}

fn read_cpuidle(sys: &Path) -> Result<IdleCounters, IdleError> {
    let mut cpus = Vec::new();
    let mut any = false;
    for (cpu, dir) in online_cpus(sys)? {
        let mut states = Vec::new();
        for (index, sdir) in numbered(&dir.join("cpuidle"), "state") {
            let (Some(name), Some(time_us), Some(usage)) = (
                read_trim(&sdir.join("name")),
                read_u64(&sdir.join("time")),
                read_u64(&sdir.join("usage")),
            ) else {
                return Err(IdleError::Unreadable(sdir));
            };
            states.push(StateCounters {
                index,
                name,
                time_us,
                usage,
                above: read_u64(&sdir.join("above")),
                below: read_u64(&sdir.join("below")),
            });
        }
        any |= !states.is_empty();
        cpus.push(CpuCounters { cpu, states });
    }
    if !any {
        return Err(IdleError::NoCpuidle(sys.to_path_buf()));
    }
    let (driver, governor) = driver_governor(sys);
    Ok(IdleCounters {
        cpus,
        driver,
        governor,
        source: IdleSource::Cpuidle,
    })
}

/// The fallback without cpuidle states: each online CPU's idle + iowait ticks from `proc/stat`
/// as one state.
fn read_proc_stat(root: &MachineRoot, sys: &Path) -> Result<IdleCounters, IdleError> {
    let path = root.proc_stat();
    let stat = procstat::read(&path).map_err(|_| IdleError::NoProcStat(path.clone()))?;
    let us_per_tick = 1_000_000 / procstat::USER_HZ;
    let cpus: Vec<CpuCounters> = online_cpus(sys)?
        .into_iter()
        .filter_map(|(cpu, _)| {
            let t = stat.cpu(cpu)?;
            Some(CpuCounters {
                cpu,
                states: vec![StateCounters {
                    index: 0,
                    name: UNDIVIDED_IDLE.to_string(),
                    time_us: t.idle_all().saturating_mul(us_per_tick),
                    usage: 0,
                    above: None,
                    below: None,
                }],
            })
        })
        .collect();
    if cpus.is_empty() {
        return Err(IdleError::NoProcStat(path));
    }
    let (driver, governor) = driver_governor(sys);
    Ok(IdleCounters {
        cpus,
        driver,
        governor,
        source: IdleSource::ProcStat,
    })
}

/// Whether a state is the polling pseudo-state (busy, not a sleep).
pub fn is_poll(name: &str) -> bool {
    name.eq_ignore_ascii_case("POLL")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(p: &Path, s: &str) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, s).unwrap();
    }

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("preheat-idle-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn reads_a_synthetic_tree_and_skips_offline_cpus() {
        let dir = temp("cpuidle");
        let root = MachineRoot::at(&dir);
        let sys = root.sys_cpu();
        for (cpu, online) in [(0, None), (1, Some("1")), (2, Some("0"))] {
            let c = sys.join(format!("cpu{cpu}"));
            if let Some(o) = online {
                write(&c.join("online"), o);
            }
            write(&c.join("cpuidle/state0/name"), "POLL\n");
            write(&c.join("cpuidle/state0/time"), "10\n");
            write(&c.join("cpuidle/state0/usage"), "2\n");
            write(&c.join("cpuidle/state1/name"), "halt\n");
            write(&c.join("cpuidle/state1/time"), "1000\n");
            write(&c.join("cpuidle/state1/usage"), "7\n");
            write(&c.join("cpuidle/state1/above"), "1\n");
        }
        write(&sys.join("cpuidle/current_driver"), "haltpoll\n");
        let r = read_counters(&root).unwrap();
        assert_eq!(r.source, IdleSource::Cpuidle);
        assert_eq!(r.cpus.iter().map(|c| c.cpu).collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(r.cpus[0].states[1].time_us, 1000);
        assert_eq!(r.cpus[0].states[1].above, Some(1));
        assert_eq!(r.cpus[0].states[0].below, None);
        assert_eq!(r.driver.as_deref(), Some("haltpoll"));
        assert!(is_poll(&r.cpus[0].states[0].name));
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(matches!(read_counters(&root), Err(IdleError::NoCpus(_))));
    }

    #[test]
    fn without_cpuidle_states_idle_time_comes_from_proc_stat() {
        let dir = temp("procstat");
        let root = MachineRoot::at(&dir);
        let sys = root.sys_cpu();
        for cpu in 0..3 {
            write(&sys.join(format!("cpu{cpu}/topology/core_id")), "0\n");
        }
        write(&sys.join("cpu2/online"), "0\n");
        write(&sys.join("cpuidle/current_driver"), "none\n");
        // No proc/stat: a clear error naming it.
        let e = read_counters(&root).unwrap_err();
        assert!(matches!(e, IdleError::NoProcStat(_)), "{e}");
        assert!(e.to_string().contains("proc/stat"), "{e}");
        write(
            &root.proc_stat(),
            "cpu  1 0 1 30 3 0 0 0\ncpu0 1 0 1 10 2 0 0 0\ncpu1 0 0 0 20 1 0 0 0\n",
        );
        let r = read_counters(&root).unwrap();
        assert_eq!(r.source, IdleSource::ProcStat);
        assert_eq!(r.driver.as_deref(), Some("none"));
        assert_eq!(r.cpus.len(), 2, "the offline CPU is left out");
        let s = &r.cpus[1].states;
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].name, UNDIVIDED_IDLE);
        // idle + iowait = 21 ticks of 10 ms.
        assert_eq!(s[0].time_us, 210_000);
        assert_eq!(s[0].usage, 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
