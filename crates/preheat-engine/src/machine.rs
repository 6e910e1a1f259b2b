//! Where this process reads the kernel's view of the machine. On a real machine that is `/`;
//! tests point a [`MachineRoot`] at a fake tree (`DIR/sys/devices/system/cpu/…`,
//! `DIR/proc/stat`) so that every variant of a machine — with or without a cpuidle driver, other
//! cache sizes — is tested on whatever machine runs the suite.
//!
//! Commands that read the machine take `--machine-root DIR`; without it they read
//! `$PREHEAT_MACHINE_ROOT` ([`ENV`]) when set, else `/`.

use std::path::{Path, PathBuf};

/// The environment variable a command reads its machine root from when not told otherwise.
pub const ENV: &str = "PREHEAT_MACHINE_ROOT";

/// A directory standing for `/` when reading `/sys` and `/proc` files about CPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineRoot(PathBuf);

impl Default for MachineRoot {
    fn default() -> Self {
        MachineRoot::real()
    }
}

impl MachineRoot {
    /// The machine this process runs on.
    pub fn real() -> MachineRoot {
        MachineRoot(PathBuf::from("/"))
    }

    /// A tree at `dir` (a fake machine for tests, or a copy of another machine's files).
    pub fn at(dir: impl Into<PathBuf>) -> MachineRoot {
        MachineRoot(dir.into())
    }

    /// `$PREHEAT_MACHINE_ROOT` when set and not empty, else the real machine.
    pub fn from_env() -> MachineRoot {
        match std::env::var_os(ENV) {
            Some(d) if !d.is_empty() => MachineRoot::at(d),
            _ => MachineRoot::real(),
        }
    }

    /// The root directory itself.
    pub fn dir(&self) -> &Path {
        &self.0
    }

    /// Whether this is the machine the process runs on.
    pub fn is_real(&self) -> bool {
        self.0 == Path::new("/")
    }

    /// `sys/devices/system/cpu` under the root.
    pub fn sys_cpu(&self) -> PathBuf {
        self.0.join("sys/devices/system/cpu")
    }

    /// `proc/stat` under the root.
    pub fn proc_stat(&self) -> PathBuf {
        self.0.join("proc/stat")
    }
}

impl std::fmt::Display for MachineRoot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_real() {
            f.write_str("this machine")
        } else {
            write!(f, "the machine tree at {}", self.0.display())
        }
    }
}

/// A variant of a machine, for fake trees ([`write_fake`]): the variants our machines come in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Variant {
    /// Short name used in test output (`haltpoll`, `none`).
    pub name: &'static str,
    pub cpus: u32,
    /// `cpuidle/current_driver` (`none` where the kernel has no driver).
    pub driver: &'static str,
    /// Idle state names per CPU (empty: no `cpuidle/state*` directories).
    pub states: &'static [&'static str],
    pub l1d_kib: u64,
    pub l2_kib: u64,
    pub l3_kib: u64,
}

/// The variant with the `haltpoll` cpuidle driver: states POLL and `haltpoll idle`, L1d 48 KiB,
/// L2 1 MiB.
pub const HALTPOLL: Variant = Variant {
    name: "haltpoll",
    cpus: 2,
    driver: "haltpoll",
    states: &["POLL", "haltpoll idle"],
    l1d_kib: 48,
    l2_kib: 1024,
    l3_kib: 32 * 1024,
};

/// The variant without a cpuidle driver (`current_driver` = `none`, no states), L1d 32 KiB,
/// L2 512 KiB.
pub const NO_CPUIDLE: Variant = Variant {
    name: "none",
    cpus: 2,
    driver: "none",
    states: &[],
    l1d_kib: 32,
    l2_kib: 512,
    l3_kib: 32 * 1024,
};

fn put(path: &Path, text: &str) -> std::io::Result<()> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    std::fs::write(path, text)
}

/// Write a fake tree of `v` at `dir`: `sys/devices/system/cpu` (online list, per CPU its cache
/// indices, topology ids and idle states with zero counters, the driver and governor) and a
/// `proc/stat` with zero ticks. Counters move with [`advance_fake`].
pub fn write_fake(dir: &Path, v: &Variant) -> std::io::Result<MachineRoot> {
    let root = MachineRoot::at(dir);
    let sys = root.sys_cpu();
    let last = v.cpus.saturating_sub(1);
    put(&sys.join("online"), &format!("0-{last}\n"))?;
    put(
        &sys.join("cpuidle/current_driver"),
        &format!("{}\n", v.driver),
    )?;
    let governor = if v.driver == "haltpoll" {
        "haltpoll"
    } else {
        "menu"
    };
    put(
        &sys.join("cpuidle/current_governor_ro"),
        &format!("{governor}\n"),
    )?;
    for cpu in 0..v.cpus {
        let c = sys.join(format!("cpu{cpu}"));
        put(&c.join("topology/core_id"), &format!("{cpu}\n"))?;
        put(&c.join("topology/physical_package_id"), "0\n")?;
        let caches = [
            (1, "Data", v.l1d_kib, cpu.to_string()),
            (1, "Instruction", 32, cpu.to_string()),
            (2, "Unified", v.l2_kib, cpu.to_string()),
            (3, "Unified", v.l3_kib, format!("0-{last}")),
        ];
        for (i, (level, kind, kib, shared)) in caches.iter().enumerate() {
            let d = c.join(format!("cache/index{i}"));
            put(&d.join("level"), &format!("{level}\n"))?;
            put(&d.join("type"), &format!("{kind}\n"))?;
            put(&d.join("size"), &format!("{kib}K\n"))?;
            put(&d.join("coherency_line_size"), "64\n")?;
            put(&d.join("shared_cpu_list"), &format!("{shared}\n"))?;
        }
        for (k, name) in v.states.iter().enumerate() {
            let d = c.join(format!("cpuidle/state{k}"));
            put(&d.join("name"), &format!("{name}\n"))?;
            put(&d.join("time"), "0\n")?;
            put(&d.join("usage"), "0\n")?;
            put(&d.join("above"), "0\n")?;
            put(&d.join("below"), "0\n")?;
        }
    }
    write_proc_stat(&root, &vec![0; v.cpus as usize])?;
    Ok(root)
}

fn write_proc_stat(root: &MachineRoot, idle_ticks: &[u64]) -> std::io::Result<()> {
    let mut text = format!(
        "cpu  0 0 0 {} 0 0 0 0 0 0\n",
        idle_ticks.iter().sum::<u64>()
    );
    for (cpu, t) in idle_ticks.iter().enumerate() {
        text.push_str(&format!("cpu{cpu} 0 0 0 {t} 0 0 0 0 0 0\n"));
    }
    text.push_str("btime 1764200000\n");
    put(&root.proc_stat(), &text)
}

/// Let every CPU of a fake tree idle `idle_us` more in its deepest state (entered `entries`
/// times) — or, without states, `idle_us` more idle ticks in `proc/stat`.
pub fn advance_fake(root: &MachineRoot, idle_us: u64, entries: u64) -> std::io::Result<()> {
    let add = |p: PathBuf, by: u64| -> std::io::Result<()> {
        let now: u64 = std::fs::read_to_string(&p)?.trim().parse().unwrap_or(0);
        put(&p, &format!("{}\n", now + by))
    };
    let stat = crate::procstat::read(&root.proc_stat())?;
    let mut ticks = Vec::new();
    for (cpu, t) in &stat.cpus {
        let idle = root.sys_cpu().join(format!("cpu{cpu}/cpuidle"));
        let deepest = std::fs::read_dir(&idle)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with("state"))
                    .count()
            })
            .unwrap_or(0);
        if deepest > 0 {
            let s = idle.join(format!("state{}", deepest - 1));
            add(s.join("time"), idle_us)?;
            add(s.join("usage"), entries)?;
        }
        ticks.push(t.idle + idle_us * crate::procstat::USER_HZ / 1_000_000);
    }
    write_proc_stat(root, &ticks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_under_the_root() {
        let r = MachineRoot::real();
        assert!(r.is_real());
        assert_eq!(r.sys_cpu(), Path::new("/sys/devices/system/cpu"));
        assert_eq!(r.proc_stat(), Path::new("/proc/stat"));
        let f = MachineRoot::at("/tmp/fake");
        assert!(!f.is_real());
        assert_eq!(f.sys_cpu(), Path::new("/tmp/fake/sys/devices/system/cpu"));
        assert_eq!(f.to_string(), "the machine tree at /tmp/fake");
    }

    #[test]
    fn fake_trees_of_both_variants_read_back() {
        for v in [HALTPOLL, NO_CPUIDLE] {
            let dir = std::env::temp_dir().join(format!(
                "preheat-machine-test-{}-{}",
                v.name,
                std::process::id()
            ));
            let root = write_fake(&dir, &v).unwrap();
            let t = crate::topology::read_from(&root.sys_cpu());
            assert_eq!(t.cpus.len(), 2);
            assert_eq!(t.cpuidle_driver.as_deref(), Some(v.driver));
            let l1d = &t.cpus[0].caches[0];
            assert_eq!(l1d.size_bytes, v.l1d_kib * 1024);
            assert_eq!(t.cpus[1].idle_states.len(), v.states.len());
            let a = crate::idle::read_counters(&root).unwrap();
            advance_fake(&root, 500_000, 7).unwrap();
            let b = crate::idle::read_counters(&root).unwrap();
            let last = |c: &crate::idle::IdleCounters| c.cpus[1].states.last().unwrap().clone();
            assert_eq!(last(&b).time_us - last(&a).time_us, 500_000, "{}", v.name);
            let entries = if v.states.is_empty() { 0 } else { 7 };
            assert_eq!(last(&b).usage - last(&a).usage, entries, "{}", v.name);
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
}
