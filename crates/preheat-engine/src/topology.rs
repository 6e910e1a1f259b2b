//! CPU and cache topology from sysfs.
//!
//! The paper assumes a last-level cache big enough for the working set (2 MiB L2 on the
//! Cortex-A15, §4) and wakes a core to preheat (§3.2). To decide which CPUs may preheat for a
//! server CPU (those sharing its last-level cache), how large a probe chunk may be, and which
//! idle states a CPU can fall into, we read the topology from sysfs. Missing files (containers,
//! other architectures, no cpuidle driver) give empty lists or `None`; nothing here panics.

use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheInfo {
    pub level: u32,
    /// "Data", "Instruction" or "Unified".
    pub kind: String,
    pub size_bytes: u64,
    pub line_size: u32,
    pub shared_cpus: Vec<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuInfo {
    pub cpu: u32,
    pub core_id: u32,
    pub package_id: u32,
    pub caches: Vec<CacheInfo>,
    /// cpuidle state names, e.g. ["POLL", "halt"].
    pub idle_states: Vec<String>,
    /// The names of the states disabled by an administrator (`stateN/disable` = 1): with
    /// `POLL` disabled, no latency constraint makes the CPU poll in idle.
    pub disabled_idle_states: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    pub cpus: Vec<CpuInfo>,
    /// e.g. "haltpoll", "intel_idle", "acpi_idle", or None.
    pub cpuidle_driver: Option<String>,
    pub cpuidle_governor: Option<String>,
}

impl Topology {
    /// The CPU with number `cpu`, if online.
    pub fn cpu(&self, cpu: u32) -> Option<&CpuInfo> {
        self.cpus.iter().find(|c| c.cpu == cpu)
    }
}

impl CpuInfo {
    /// The highest-level data or unified cache (the last-level cache), if known.
    pub fn llc(&self) -> Option<&CacheInfo> {
        self.caches
            .iter()
            .filter(|c| c.kind != "Instruction")
            .max_by_key(|c| c.level)
    }
}

const SYS_CPU: &str = "/sys/devices/system/cpu";

/// The CPU's model name (`model name` in `/proc/cpuinfo`), or `unknown`.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|x| x.1.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// Read the topology of the online CPUs from `/sys/devices/system/cpu`.
pub fn read() -> Topology {
    read_from(Path::new(SYS_CPU))
}

/// [`read`] from another root (for tests and for snapshots of sysfs).
pub fn read_from(root: &Path) -> Topology {
    let online = read_trim(&root.join("online"))
        .map(|s| parse_cpu_list(&s))
        .unwrap_or_default();
    let cpus = online.iter().map(|&cpu| read_cpu(root, cpu)).collect();
    let idle = root.join("cpuidle");
    Topology {
        cpus,
        cpuidle_driver: read_trim(&idle.join("current_driver")).filter(|s| !s.is_empty()),
        cpuidle_governor: read_trim(&idle.join("current_governor"))
            .or_else(|| read_trim(&idle.join("current_governor_ro")))
            .filter(|s| !s.is_empty()),
    }
}

fn read_cpu(root: &Path, cpu: u32) -> CpuInfo {
    let dir = root.join(format!("cpu{cpu}"));
    let num = |p: PathBuf| read_trim(&p).and_then(|s| s.parse::<u32>().ok());
    let mut caches = Vec::new();
    for i in 0.. {
        let c = dir.join("cache").join(format!("index{i}"));
        if !c.is_dir() {
            break;
        }
        caches.push(CacheInfo {
            level: num(c.join("level")).unwrap_or(0),
            kind: read_trim(&c.join("type")).unwrap_or_default(),
            size_bytes: read_trim(&c.join("size"))
                .and_then(|s| parse_size(&s))
                .unwrap_or(0),
            line_size: num(c.join("coherency_line_size")).unwrap_or(0),
            shared_cpus: read_trim(&c.join("shared_cpu_list"))
                .map(|s| parse_cpu_list(&s))
                .unwrap_or_default(),
        });
    }
    let (mut idle_states, mut disabled_idle_states) = (Vec::new(), Vec::new());
    for k in 0.. {
        let s = dir.join("cpuidle").join(format!("state{k}"));
        if !s.is_dir() {
            break;
        }
        let name = read_trim(&s.join("name")).unwrap_or_default();
        if read_trim(&s.join("disable")).is_some_and(|d| d != "0") {
            disabled_idle_states.push(name.clone());
        }
        idle_states.push(name);
    }
    CpuInfo {
        cpu,
        core_id: num(dir.join("topology/core_id")).unwrap_or(cpu),
        package_id: num(dir.join("topology/physical_package_id")).unwrap_or(0),
        caches,
        idle_states,
        disabled_idle_states,
    }
}

fn read_trim(p: &Path) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

/// "32K", "1024K", "16M", "512" (bytes) → bytes.
fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mul) = match s.chars().last()? {
        'K' | 'k' => (&s[..s.len() - 1], 1u64 << 10),
        'M' | 'm' => (&s[..s.len() - 1], 1 << 20),
        'G' | 'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.trim().parse::<u64>().ok()?.checked_mul(mul)
}

/// Parse a kernel CPU list such as `0-3,5,8-9` (also `0-7:2` strides, as accepted by the
/// kernel) into sorted, deduplicated CPU numbers. Malformed parts are skipped.
pub fn parse_cpu_list(s: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for part in s.trim().split(',') {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        let (range, stride) = match part.split_once(':') {
            Some((r, st)) => match st.trim().parse::<u32>() {
                Ok(st) if st > 0 => (r, st),
                _ => continue,
            },
            None => (part, 1),
        };
        match range.split_once('-') {
            Some((a, b)) => {
                let (Ok(a), Ok(b)) = (a.trim().parse::<u32>(), b.trim().parse::<u32>()) else {
                    continue;
                };
                // Cap absurd ranges (sysfs never lists more than a few thousand CPUs).
                if b < a || b - a > 1 << 16 {
                    continue;
                }
                out.extend((a..=b).step_by(stride as usize));
            }
            None => {
                if let Ok(a) = range.parse::<u32>() {
                    out.push(a);
                }
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// `/sys/devices/system/cpu/cpuN/power/pm_qos_resume_latency_us`: writing `n/a` there keeps
/// the CPU out of every idle state with an exit latency (on this kernel `0` means "no
/// constraint", not "zero latency").
pub fn pm_qos_resume_latency_path(cpu: usize) -> PathBuf {
    Path::new(SYS_CPU).join(format!("cpu{cpu}/power/pm_qos_resume_latency_us"))
}

/// Whether a hardware cycle counter can be opened for the calling thread
/// (`perf_event_open(PERF_COUNT_HW_CPU_CYCLES)`, user space only). False on VMs without a
/// virtual PMU, such as this machine — so nothing in preheat may depend on PMU sampling.
pub fn has_pmu() -> bool {
    crate::perf::hw_available()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        let _shared = crate::test_lock::shared();
        assert_eq!(parse_cpu_list("0-3,5"), vec![0, 1, 2, 3, 5]);
        assert_eq!(parse_cpu_list("0"), vec![0]);
        assert_eq!(parse_cpu_list("0-1\n"), vec![0, 1]);
        assert_eq!(parse_cpu_list(""), Vec::<u32>::new());
        assert_eq!(parse_cpu_list("8-9,0,2-3"), vec![0, 2, 3, 8, 9]);
        assert_eq!(parse_cpu_list("0-7:2"), vec![0, 2, 4, 6]);
        assert_eq!(parse_cpu_list("x,1,3-2,4-,5"), vec![1, 5]);
        assert_eq!(parse_cpu_list("1,1,0-1"), vec![0, 1]);
    }

    #[test]
    fn sizes() {
        let _shared = crate::test_lock::shared();
        assert_eq!(parse_size("32K"), Some(32 * 1024));
        assert_eq!(parse_size("32768K"), Some(32 << 20));
        assert_eq!(parse_size("2M"), Some(2 << 20));
        assert_eq!(parse_size("64"), Some(64));
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("K"), None);
    }

    #[test]
    fn reads_this_machine() {
        let _shared = crate::test_lock::shared();
        let t = read();
        assert!(!t.cpus.is_empty());
        let c0 = &t.cpus[0];
        if let Some(llc) = c0.llc() {
            assert!(llc.size_bytes > 0 && llc.line_size >= 32, "{llc:?}");
        }
        println!("{t:#?}; pmu: {}", has_pmu());
        assert!(pm_qos_resume_latency_path(1).ends_with("cpu1/power/pm_qos_resume_latency_us"));
    }

    #[test]
    fn missing_root_is_empty() {
        let _shared = crate::test_lock::shared();
        let t = read_from(Path::new("/nonexistent/preheat"));
        assert!(t.cpus.is_empty() && t.cpuidle_driver.is_none() && t.cpuidle_governor.is_none());
    }

    #[test]
    fn fake_tree() {
        let _shared = crate::test_lock::shared();
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        let w = |p: &str, s: &str| {
            let p = r.join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, s).unwrap();
        };
        w("online", "0,2\n");
        w("cpu0/topology/core_id", "0\n");
        w("cpu0/cache/index0/level", "1\n");
        w("cpu0/cache/index0/type", "Data\n");
        w("cpu0/cache/index0/size", "48K\n");
        w("cpu0/cache/index0/shared_cpu_list", "0\n");
        w("cpu0/cache/index1/level", "3\n");
        w("cpu0/cache/index1/type", "Unified\n");
        w("cpu0/cache/index1/size", "garbage\n");
        w("cpu0/cpuidle/state0/name", "POLL\n");
        w("cpu0/cpuidle/state1/name", "C1\n");
        w("cpu0/cpuidle/state0/disable", "1\n");
        w("cpu0/cpuidle/state1/disable", "0\n");
        w("cpu2/topology/core_id", "1\n");
        w("cpu2/topology/physical_package_id", "1\n");
        w("cpuidle/current_governor_ro", "menu\n");
        let t = read_from(r);
        assert_eq!(t.cpus.len(), 2);
        assert_eq!(t.cpuidle_driver, None);
        assert_eq!(t.cpuidle_governor.as_deref(), Some("menu"));
        let c0 = t.cpu(0).unwrap();
        assert_eq!(c0.idle_states, vec!["POLL", "C1"]);
        assert_eq!(c0.disabled_idle_states, vec!["POLL"]);
        assert_eq!(c0.caches.len(), 2);
        assert_eq!(c0.caches[0].size_bytes, 48 * 1024);
        assert_eq!(c0.caches[1].size_bytes, 0);
        assert_eq!(c0.caches[1].line_size, 0);
        assert_eq!(c0.llc().unwrap().level, 3);
        let c2 = t.cpu(2).unwrap();
        assert_eq!((c2.core_id, c2.package_id), (1, 1));
        assert!(c2.caches.is_empty() && c2.idle_states.is_empty());
    }
}
