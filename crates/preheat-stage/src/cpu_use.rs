//! Who used the CPUs during a measured window: this benchmark (and the backend it started) vs
//! every other process, from `/proc/stat` and `/proc/PID/stat` ([`CpuUse`], measured), and the
//! wakeups attributable to one process (its threads' voluntary context switches). Idle
//! residency itself is [`preheat_power::residency`]'s: machine-wide, so these say how much of it
//! is ours.

use std::time::Instant;

use serde::Serialize;

/// Clock ticks per second of `/proc/stat` and `/proc/PID/stat` (USER_HZ; 100 on Linux
/// everywhere we run, read without libc).
pub const USER_HZ: f64 = 100.0;

pub use preheat_engine::procstat::process_ticks;

/// Who used the CPUs during a window: this process (and the processes in `pids`) vs everyone
/// else. A high `others_share` means the residency of that window says little about us.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CpuUse {
    pub kind: &'static str,
    /// CPU-seconds over the window: our processes, everything (busy), everyone else.
    pub own_cpu_s: f64,
    pub machine_busy_cpu_s: f64,
    pub others_cpu_s: f64,
    /// Shares of the machine's capacity (elapsed × CPUs).
    pub own_share: f64,
    pub others_share: f64,
}

/// A point-in-time reading for [`CpuUse`].
#[derive(Debug, Clone)]
pub struct CpuUseMark {
    at: Instant,
    machine: (u64, u64),
    own: u64,
}

fn own_ticks(pids: &[u32]) -> u64 {
    let mut t = preheat_engine::procstat::own_ticks().unwrap_or(0);
    for pid in pids {
        t += preheat_engine::procstat::read_pid_stat(*pid).map_or(0, |s| s.ticks());
    }
    t
}

/// Reads the machine's and our processes' CPU time now (`pids`: other processes of ours, e.g.
/// the backend we started). `None` without `/proc`.
pub fn cpu_use_mark(pids: &[u32]) -> Option<CpuUseMark> {
    let all = preheat_engine::procstat::read(std::path::Path::new("/proc/stat"))
        .ok()?
        .all;
    let machine = (all.busy(), all.total());
    Some(CpuUseMark {
        at: Instant::now(),
        machine,
        own: own_ticks(pids),
    })
}

/// CPU use between two marks.
pub fn cpu_use(before: &CpuUseMark, after: &CpuUseMark) -> CpuUse {
    let busy = after.machine.0.saturating_sub(before.machine.0) as f64 / USER_HZ;
    let total = after.machine.1.saturating_sub(before.machine.1) as f64 / USER_HZ;
    let own = after.own.saturating_sub(before.own) as f64 / USER_HZ;
    let capacity = if total > 0.0 {
        total
    } else {
        after.at.saturating_duration_since(before.at).as_secs_f64()
    }
    .max(1e-9);
    let others = (busy - own).max(0.0);
    CpuUse {
        kind: "measured",
        own_cpu_s: own,
        machine_busy_cpu_s: busy,
        others_cpu_s: others,
        own_share: own / capacity,
        others_share: others / capacity,
    }
}

/// Voluntary context switches of every thread of `pid` (`/proc/PID/task/*/status`): each is
/// the thread blocking, so each is followed by a wakeup. For a server, these are its wakeups,
/// attributable to it alone (unlike machine-wide cpuidle counters). `None` if unreadable.
pub fn process_wakeups(pid: u32) -> Option<u64> {
    let mut total = 0u64;
    let mut any = false;
    for e in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let Ok(status) = std::fs::read_to_string(e.path().join("status")) else {
            continue;
        };
        if let Some(v) = voluntary_switches(&status) {
            total += v;
            any = true;
        }
    }
    any.then_some(total)
}

/// The `voluntary_ctxt_switches` field of a `/proc/.../status` text.
pub fn voluntary_switches(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wakeups_of_a_process() {
        assert_eq!(
            voluntary_switches(
                "Name:\tx\nvoluntary_ctxt_switches:\t42\nnonvoluntary_ctxt_switches:\t3\n"
            ),
            Some(42)
        );
        assert_eq!(voluntary_switches("Name: x\n"), None);
        let before = process_wakeups(std::process::id()).expect("/proc");
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(process_wakeups(std::process::id()).unwrap() > before);
    }

    #[test]
    fn proc_stat_parsing() {
        let stat = "cpu  239906 5 74942 387825 1974 3 1188 159 7 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n";
        let all = preheat_engine::procstat::parse(stat).all;
        // Busy = every column but idle and iowait (guest time is inside user).
        assert_eq!(all.busy(), 239906 + 5 + 74942 + 3 + 1188 + 159);
        assert_eq!(
            all.total(),
            239906 + 5 + 74942 + 387825 + 1974 + 3 + 1188 + 159
        );
        let p = "18656 (a b) c)) R 18650 18650 24978 0 -1 4194304 120 0 0 0 31 17 0 0 20 0 1 0 \
                 4242 1 2";
        assert_eq!(process_ticks(p), Some(48));
        assert_eq!(process_ticks("garbage"), None);
        let m = cpu_use_mark(&[std::process::id()]).expect("/proc");
        let u = cpu_use(&m, &m);
        assert_eq!(u.own_cpu_s, 0.0);
    }
}
