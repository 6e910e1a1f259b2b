//! cpuidle counters from sysfs (`/sys/devices/system/cpu/cpu*/cpuidle/state*/{name,time,usage,
//! above,below}`, the driver and governor): the one reader behind idle-residency reports
//! (staged bursts, quiescence, modeled energy). Takes the sysfs root as a parameter so tests use
//! synthetic trees. Offline CPUs (`cpuN/online` = 0) are skipped.

use std::path::{Path, PathBuf};

/// Where the kernel exposes CPUs.
pub const SYSFS_CPU: &str = "/sys/devices/system/cpu";

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

/// Every online CPU's idle counters at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdleCounters {
    pub cpus: Vec<CpuCounters>,
    pub driver: Option<String>,
    pub governor: Option<String>,
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

/// Read every online CPU's idle counters under `root` (normally [`SYSFS_CPU`]).
pub fn read_counters(root: &Path) -> Result<IdleCounters, IdleError> {
    let dirs = numbered(root, "cpu");
    if dirs.is_empty() {
        return Err(IdleError::NoCpus(root.to_path_buf()));
    }
    let mut cpus = Vec::new();
    let mut any = false;
    for (cpu, dir) in dirs {
        if read_trim(&dir.join("online")).as_deref() == Some("0") {
            continue;
        }
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
        return Err(IdleError::NoCpuidle(root.to_path_buf()));
    }
    Ok(IdleCounters {
        cpus,
        driver: read_trim(&root.join("cpuidle/current_driver")),
        governor: read_trim(&root.join("cpuidle/current_governor"))
            .or_else(|| read_trim(&root.join("cpuidle/current_governor_ro"))),
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

    #[test]
    fn reads_a_synthetic_tree_and_skips_offline_cpus() {
        let dir = std::env::temp_dir().join(format!("preheat-idle-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for (cpu, online) in [(0, None), (1, Some("1")), (2, Some("0"))] {
            let c = dir.join(format!("cpu{cpu}"));
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
        write(&dir.join("cpuidle/current_driver"), "haltpoll\n");
        let r = read_counters(&dir).unwrap();
        assert_eq!(r.cpus.iter().map(|c| c.cpu).collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(r.cpus[0].states[1].time_us, 1000);
        assert_eq!(r.cpus[0].states[1].above, Some(1));
        assert_eq!(r.cpus[0].states[0].below, None);
        assert_eq!(r.driver.as_deref(), Some("haltpoll"));
        assert!(is_poll(&r.cpus[0].states[0].name));
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(matches!(read_counters(&dir), Err(IdleError::NoCpus(_))));
    }
}
