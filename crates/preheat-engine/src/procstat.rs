//! `/proc/stat`: per-CPU time in ticks (user, nice, system, idle, iowait, irq, softirq, steal)
//! and the boot time — the one parser of this file in the workspace. Pure parsing over a text
//! ([`parse`]) plus one reader ([`read`]) that takes the path, so tests use synthetic files.
//!
//! Also the readers of a process's or thread's stat line (`/proc/PID/stat`,
//! `/proc/PID/task/TID/stat`): [`read_pid_stat`], [`read_task_stat`] and [`read_pid_stat_at`],
//! over the one parser of that line, `preheat_model::procstat::parse_pid_stat` (pure, so
//! `preheat-rundir` uses it too).

use std::path::Path;

/// Ticks per second of `/proc/stat` (`USER_HZ`): 100 on every Linux architecture we run on
/// (the kernel exports it as `sysconf(_SC_CLK_TCK)`, which [`user_hz`] asks).
pub const USER_HZ: u64 = 100;

/// The kernel's tick rate for `/proc/stat`, as `sysconf(_SC_CLK_TCK)` reports it.
pub fn user_hz() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 {
        hz as u64
    } else {
        USER_HZ
    }
}

/// One `cpu`/`cpuN` line, in ticks. Columns a kernel does not report are 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTicks {
    pub user: u64,
    pub nice: u64,
    pub system: u64,
    pub idle: u64,
    pub iowait: u64,
    pub irq: u64,
    pub softirq: u64,
    pub steal: u64,
}

impl CpuTicks {
    /// Time the CPU had nothing to run: idle + iowait (iowait is idle time with I/O pending).
    pub fn idle_all(&self) -> u64 {
        self.idle + self.iowait
    }

    /// Every accounted tick (guest time is already inside user and nice).
    pub fn total(&self) -> u64 {
        self.user
            + self.nice
            + self.system
            + self.idle
            + self.iowait
            + self.irq
            + self.softirq
            + self.steal
    }

    /// Ticks the CPU ran something: [`total`](Self::total) − [`idle_all`](Self::idle_all).
    pub fn busy(&self) -> u64 {
        self.total().saturating_sub(self.idle_all())
    }
}

/// What [`parse`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcStat {
    /// The `cpu` line (all CPUs summed).
    pub all: CpuTicks,
    /// The `cpuN` lines, as `(N, ticks)`, in file order (online CPUs only: the kernel leaves
    /// offline ones out).
    pub cpus: Vec<(u32, CpuTicks)>,
    /// Boot time, seconds since the Unix epoch (`btime`).
    pub btime: Option<u64>,
}

impl ProcStat {
    /// The ticks of CPU `n`, when the file lists it.
    pub fn cpu(&self, n: u32) -> Option<&CpuTicks> {
        self.cpus.iter().find(|(c, _)| *c == n).map(|(_, t)| t)
    }
}

/// Parse the text of `/proc/stat`. Lines it does not know are ignored; a `cpu` line with
/// unparsable fields counts as missing.
pub fn parse(text: &str) -> ProcStat {
    let mut out = ProcStat::default();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let Some(key) = f.next() else { continue };
        if key == "btime" {
            out.btime = f.next().and_then(|v| v.parse().ok());
            continue;
        }
        let Some(num) = key.strip_prefix("cpu") else {
            continue;
        };
        let v: Vec<u64> = f.map_while(|x| x.parse().ok()).collect();
        if v.len() < 4 {
            continue;
        }
        let at = |i: usize| v.get(i).copied().unwrap_or(0);
        let t = CpuTicks {
            user: at(0),
            nice: at(1),
            system: at(2),
            idle: at(3),
            iowait: at(4),
            irq: at(5),
            softirq: at(6),
            steal: at(7),
        };
        if num.is_empty() {
            out.all = t;
        } else if let Ok(n) = num.parse() {
            out.cpus.push((n, t));
        }
    }
    out
}

/// Read and parse `path` (normally `/proc/stat`, see [`crate::machine::MachineRoot`]).
pub fn read(path: &Path) -> std::io::Result<ProcStat> {
    Ok(parse(&std::fs::read_to_string(path)?))
}

pub use preheat_model::procstat::{parse_pid_stat, PidStat};

/// Read and parse a stat file at `path` (e.g. `/proc/self/stat`, `/proc/self/task/TID/stat`).
/// `None` if it cannot be read (no such process) or parsed.
pub fn read_pid_stat_at(path: &Path) -> Option<PidStat> {
    parse_pid_stat(&std::fs::read_to_string(path).ok()?)
}

/// `/proc/PID/stat` of process `pid`; `None` if there is no such process.
pub fn read_pid_stat(pid: u32) -> Option<PidStat> {
    read_pid_stat_at(Path::new(&format!("/proc/{pid}/stat")))
}

/// `/proc/PID/task/TID/stat` of thread `tid` of process `pid`; `None` if there is no such
/// thread.
pub fn read_task_stat(pid: u32, tid: u32) -> Option<PidStat> {
    read_pid_stat_at(Path::new(&format!("/proc/{pid}/task/{tid}/stat")))
}

/// CPU time (user + system, ticks) of a process, all its threads, from the text of
/// `/proc/PID/stat` ([`parse_pid_stat`]).
pub fn process_ticks(pid_stat: &str) -> Option<u64> {
    parse_pid_stat(pid_stat).map(|s| s.ticks())
}

/// The CPU time of the calling process, ticks (`/proc/self/stat`).
pub fn own_ticks() -> Option<u64> {
    read_pid_stat_at(Path::new("/proc/self/stat")).map(|s| s.ticks())
}

/// The machine's CPU time (all CPUs) and this process's, with the children it waited for, at
/// one moment (see [`foreign_load`]).
#[derive(Debug, Clone, Copy)]
pub struct MachineUse {
    all: CpuTicks,
    own: u64,
}

/// Read [`MachineUse`] now (`/proc/stat`, `/proc/self/stat`); `None` if either is unreadable.
pub fn machine_use() -> Option<MachineUse> {
    let all = read(Path::new("/proc/stat")).ok()?.all;
    let own = read_pid_stat_at(Path::new("/proc/self/stat"))?.ticks_with_children();
    Some(MachineUse { all, own })
}

/// Load from outside a measurement between two [`machine_use`] readings, as shares of the
/// machine's CPU time: (other processes — neither this one nor the children it waited for in
/// between —, time the hypervisor ran something else on our vCPUs, "steal"). `None` if no tick
/// passed. Children still running at `after` count as other processes: reap them first.
pub fn foreign_load(before: &MachineUse, after: &MachineUse) -> Option<(f64, f64)> {
    let total = after.all.total().checked_sub(before.all.total())?;
    if total == 0 {
        return None;
    }
    let steal = after.all.steal.saturating_sub(before.all.steal);
    let busy = after.all.busy().saturating_sub(before.all.busy());
    let own = after.own.saturating_sub(before.own);
    let others = busy.saturating_sub(steal).saturating_sub(own);
    Some((others as f64 / total as f64, steal as f64 / total as f64))
}

/// The share of the machine's CPU time that anything but this process (and the children it
/// waited for) used between two [`machine_use`] readings, the hypervisor's steal included:
/// [`foreign_load`]'s two shares together. `None` if no tick passed.
pub fn others_share(before: &MachineUse, after: &MachineUse) -> Option<f64> {
    foreign_load(before, after).map(|(others, steal)| others + steal)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "cpu  2114 0 1555 9583 450 0 40 15 0 0\n\
                        cpu0 598 0 492 5772 22 0 5 3 0 0\n\
                        cpu1 1515 0 1063 3810 428 0 35 11 0 0\n\
                        intr 1 2 3\nctxt 99\nbtime 1764200000\n";

    #[test]
    fn parses_every_column_cpu_and_btime() {
        let s = parse(TEXT);
        assert_eq!(s.all.user, 2114);
        assert_eq!(s.all.steal, 15);
        assert_eq!(s.cpus.len(), 2);
        let c1 = s.cpu(1).unwrap();
        assert_eq!((c1.idle, c1.iowait, c1.softirq), (3810, 428, 35));
        assert_eq!(c1.idle_all(), 4238);
        assert_eq!(c1.total(), 1515 + 1063 + 3810 + 428 + 35 + 11);
        assert_eq!(c1.busy(), c1.total() - 4238);
        assert_eq!(s.btime, Some(1_764_200_000));
        assert!(s.cpu(2).is_none());
    }

    #[test]
    fn foreign_load_separates_others_steal_and_own() {
        let t = |user, idle, steal| CpuTicks {
            user,
            idle,
            steal,
            ..CpuTicks::default()
        };
        let a = MachineUse {
            all: t(100, 100, 0),
            own: 50,
        };
        // 100 ticks pass: 40 user (30 ours, 10 others), 50 idle, 10 steal.
        let b = MachineUse {
            all: t(140, 150, 10),
            own: 80,
        };
        let (others, steal) = foreign_load(&a, &b).unwrap();
        assert!((others - 0.10).abs() < 1e-9 && (steal - 0.10).abs() < 1e-9);
        assert_eq!(foreign_load(&a, &a), None);
        let now = machine_use().expect("/proc is readable");
        assert!(foreign_load(&now, &now).is_none());
    }

    #[test]
    fn old_kernels_and_garbage() {
        // A 2.4-era line with four columns; a line cut short; a non-numeric CPU name.
        let s = parse("cpu 1 2 3 4\ncpu0 1 2 3 4\ncpu1 1 2\ncpux 1 2 3 4 5\n");
        assert_eq!(s.all.idle, 4);
        assert_eq!(s.all.iowait, 0);
        assert_eq!(s.cpus.len(), 1);
        assert_eq!(s.btime, None);
        assert_eq!(parse(""), ProcStat::default());
    }

    #[test]
    fn process_ticks_and_others_share() {
        let p = "18656 (a b) c)) R 18650 18650 24978 0 -1 4194304 120 0 0 0 31 17 0 0 20 0 1 0 \
                 4242 1 2";
        assert_eq!(process_ticks(p), Some(48));
        assert_eq!(process_ticks("garbage"), None);
        assert!(own_ticks().is_some());
        let a = CpuTicks {
            user: 100,
            idle: 100,
            ..CpuTicks::default()
        };
        // 200 ticks pass: 80 busy, of which 30 ours.
        let b = CpuTicks {
            user: 180,
            idle: 220,
            ..CpuTicks::default()
        };
        let at = |all, own| MachineUse { all, own };
        assert_eq!(others_share(&at(a, 10), &at(b, 40)), Some(0.25));
        assert_eq!(others_share(&at(a, 0), &at(a, 0)), None);
    }

    #[test]
    fn pid_stat_readers_on_this_process() {
        let me = std::process::id();
        let s = read_pid_stat(me).expect("/proc/self/stat");
        assert!(!s.is_zombie());
        assert_eq!(
            read_pid_stat_at(Path::new("/proc/self/stat")).map(|s| s.ppid),
            Some(s.ppid)
        );
        // The main thread's task entry has the process's start time.
        assert!(s.starttime > 0, "{s:?}");
        assert_eq!(s.ppid, std::os::unix::process::parent_id());
        let t = read_task_stat(me, me).expect("main thread");
        assert_eq!(t.starttime, s.starttime);
        assert_eq!(read_pid_stat(0), None);
        assert!(read_pid_stat_at(Path::new("/nonexistent/stat")).is_none());
    }
}
