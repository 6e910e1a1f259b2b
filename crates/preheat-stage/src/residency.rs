//! CPU idle residency from the kernel's cpuidle counters: what staged bursts are for (longer,
//! deeper CPU sleeps). There is no RAPL or other energy counter on our machines, so residency is
//! the measured quantity; energy would have to be modeled from it.
//!
//! `/sys/devices/system/cpu/cpuN/cpuidle/stateK/{name,time,usage}` hold, per CPU and idle state,
//! the total time spent in the state (µs) and the number of entries. Two snapshots around a run
//! give per state the residency share (Δtime / elapsed) and the transitions (Δusage).
//! **POLL counts as busy**: it is a busy-wait loop, not a sleep, so "deep idle" is the sum of
//! all non-POLL states, and *wakeups* are entries into non-POLL states (each ends in a wakeup).
//!
//! Caveat: the kernel adds an idle period's time when the CPU leaves the state, so a sleep in
//! progress at a snapshot is counted in the next window (shares can exceed 1 by up to one idle
//! period / elapsed); keep windows long against the idle periods measured.

use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;

/// Where the kernel exposes CPUs.
pub const SYSFS_CPU: &str = "/sys/devices/system/cpu";

/// Counters of one idle state at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StateCounters {
    pub index: u32,
    pub name: String,
    /// Total residency, µs.
    pub time_us: u64,
    /// Entries.
    pub usage: u64,
    /// Entries where the state turned out too deep / too shallow, when the kernel reports it.
    pub above: Option<u64>,
    pub below: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CpuCounters {
    pub cpu: u32,
    pub states: Vec<StateCounters>,
}

/// All CPUs' idle counters at one moment.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub taken: Instant,
    pub cpus: Vec<CpuCounters>,
    pub driver: Option<String>,
    pub governor: Option<String>,
}

/// Reads every CPU's cpuidle counters under `root` (normally [`SYSFS_CPU`]). An error says why
/// residency is unavailable (no cpuidle on this machine or kernel, unreadable files).
pub fn snapshot(root: &Path) -> Result<Snapshot, String> {
    let taken = Instant::now();
    let c = preheat_engine::idle::read_counters(root).map_err(|e| e.to_string())?;
    Ok(Snapshot {
        taken,
        cpus: c
            .cpus
            .into_iter()
            .filter(|cpu| !cpu.states.is_empty())
            .map(|cpu| CpuCounters {
                cpu: cpu.cpu,
                states: cpu
                    .states
                    .into_iter()
                    .map(|st| StateCounters {
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
    })
}

/// Whether a state is the polling pseudo-state (busy, not a sleep).
pub fn is_poll(name: &str) -> bool {
    preheat_engine::idle::is_poll(name)
}

/// One idle state over a window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StateResidency {
    pub name: String,
    pub poll: bool,
    pub time_us: u64,
    /// Δtime / elapsed.
    pub share: f64,
    /// Entries into the state during the window.
    pub transitions: u64,
    pub transitions_per_s: f64,
    pub above: Option<u64>,
    pub below: Option<u64>,
}

/// One CPU over a window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CpuResidency {
    pub cpu: u32,
    /// Share of the window in non-POLL idle states.
    pub deep_idle_share: f64,
    /// Share in POLL (counted as busy).
    pub poll_share: f64,
    /// 1 − deep idle (running or polling), floored at 0.
    pub busy_share: f64,
    /// Entries into non-POLL states (each ends in a wakeup).
    pub wakeups: u64,
    pub wakeups_per_s: f64,
    /// Mean length of a non-POLL sleep (µs), when there was one.
    pub mean_sleep_us: Option<f64>,
    pub states: Vec<StateResidency>,
}

/// Idle residency over a window, per CPU and overall (all measured from cpuidle counters).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Residency {
    pub kind: &'static str,
    pub source: String,
    pub elapsed_s: f64,
    /// CPUs the averages are over (the sample count of the shares).
    pub cpus_measured: usize,
    /// Mean over CPUs of the deep-idle share.
    pub deep_idle_share: f64,
    pub poll_share: f64,
    pub busy_share: f64,
    /// Sum over CPUs.
    pub wakeups: u64,
    pub wakeups_per_s: f64,
    pub per_cpu: Vec<CpuResidency>,
    pub notes: Vec<String>,
}

/// Differences two snapshots over the wall time between them.
pub fn diff(before: &Snapshot, after: &Snapshot) -> Residency {
    diff_over(
        before,
        after,
        after.taken.saturating_duration_since(before.taken),
    )
}

/// Differences two snapshots over a given elapsed time.
pub fn diff_over(before: &Snapshot, after: &Snapshot, elapsed: Duration) -> Residency {
    let el_us = (elapsed.as_secs_f64() * 1e6).max(1.0);
    let el_s = el_us / 1e6;
    let mut notes = Vec::new();
    let mut per_cpu = Vec::new();
    for a in &after.cpus {
        let Some(b) = before.cpus.iter().find(|b| b.cpu == a.cpu) else {
            notes.push(format!("cpu{} appeared during the window: skipped", a.cpu));
            continue;
        };
        let same = b.states.len() == a.states.len()
            && b.states
                .iter()
                .zip(&a.states)
                .all(|(x, y)| x.index == y.index && x.name == y.name);
        if !same {
            notes.push(format!(
                "cpu{}: idle states changed during the window: skipped",
                a.cpu
            ));
            continue;
        }
        let mut states = Vec::new();
        let (mut deep_us, mut poll_us, mut wakeups) = (0u64, 0u64, 0u64);
        for (x, y) in b.states.iter().zip(&a.states) {
            let time_us = y.time_us.saturating_sub(x.time_us);
            let transitions = y.usage.saturating_sub(x.usage);
            let poll = is_poll(&y.name);
            if poll {
                poll_us += time_us;
            } else {
                deep_us += time_us;
                wakeups += transitions;
            }
            states.push(StateResidency {
                name: y.name.clone(),
                poll,
                time_us,
                share: time_us as f64 / el_us,
                transitions,
                transitions_per_s: transitions as f64 / el_s,
                above: y.above.zip(x.above).map(|(y, x)| y.saturating_sub(x)),
                below: y.below.zip(x.below).map(|(y, x)| y.saturating_sub(x)),
            });
        }
        let deep = deep_us as f64 / el_us;
        if deep > 1.0 {
            notes.push(format!(
                "cpu{}: deep idle {:.3} > 1 (a sleep that began before the window ended in it)",
                a.cpu, deep
            ));
        }
        per_cpu.push(CpuResidency {
            cpu: a.cpu,
            deep_idle_share: deep,
            poll_share: poll_us as f64 / el_us,
            busy_share: (1.0 - deep).max(0.0),
            wakeups,
            wakeups_per_s: wakeups as f64 / el_s,
            mean_sleep_us: (wakeups > 0).then(|| deep_us as f64 / wakeups as f64),
            states,
        });
    }
    let n = per_cpu.len();
    let mean = |f: fn(&CpuResidency) -> f64| {
        if n == 0 {
            0.0
        } else {
            per_cpu.iter().map(f).sum::<f64>() / n as f64
        }
    };
    let wakeups: u64 = per_cpu.iter().map(|c| c.wakeups).sum();
    let source = match (&after.driver, &after.governor) {
        (Some(d), Some(g)) => format!("cpuidle counters (driver {d}, governor {g})"),
        (Some(d), None) => format!("cpuidle counters (driver {d})"),
        _ => "cpuidle counters".to_string(),
    };
    Residency {
        kind: "measured",
        source,
        elapsed_s: el_s,
        cpus_measured: n,
        deep_idle_share: mean(|c| c.deep_idle_share),
        poll_share: mean(|c| c.poll_share),
        busy_share: mean(|c| c.busy_share),
        wakeups,
        wakeups_per_s: wakeups as f64 / el_s,
        per_cpu,
        notes,
    }
}

/// Sums several windows (e.g. repeated rounds of one mode) into one.
pub fn merge(parts: &[Residency]) -> Option<Residency> {
    let first = parts.first()?;
    let total_s: f64 = parts.iter().map(|p| p.elapsed_s).sum();
    let mut per_cpu: Vec<CpuResidency> = Vec::new();
    for cpu in &first.per_cpu {
        let all: Vec<&CpuResidency> = parts
            .iter()
            .filter_map(|p| p.per_cpu.iter().find(|c| c.cpu == cpu.cpu))
            .collect();
        if all.len() != parts.len() {
            continue;
        }
        // Time-weighted shares; summed counts.
        let w = |f: fn(&CpuResidency) -> f64| {
            all.iter()
                .zip(parts)
                .map(|(c, p)| f(c) * p.elapsed_s)
                .sum::<f64>()
                / total_s
        };
        let wakeups: u64 = all.iter().map(|c| c.wakeups).sum();
        let deep = w(|c| c.deep_idle_share);
        let mut states = cpu.states.clone();
        for (i, s) in states.iter_mut().enumerate() {
            s.time_us = all.iter().map(|c| c.states[i].time_us).sum();
            s.transitions = all.iter().map(|c| c.states[i].transitions).sum();
            s.share = s.time_us as f64 / (total_s * 1e6);
            s.transitions_per_s = s.transitions as f64 / total_s;
            s.above = all.iter().map(|c| c.states[i].above).sum();
            s.below = all.iter().map(|c| c.states[i].below).sum();
        }
        per_cpu.push(CpuResidency {
            cpu: cpu.cpu,
            deep_idle_share: deep,
            poll_share: w(|c| c.poll_share),
            busy_share: w(|c| c.busy_share),
            wakeups,
            wakeups_per_s: wakeups as f64 / total_s,
            mean_sleep_us: (wakeups > 0).then(|| deep * total_s * 1e6 / wakeups as f64),
            states,
        });
    }
    let n = per_cpu.len();
    let mean = |f: fn(&CpuResidency) -> f64| {
        if n == 0 {
            0.0
        } else {
            per_cpu.iter().map(f).sum::<f64>() / n as f64
        }
    };
    let wakeups: u64 = per_cpu.iter().map(|c| c.wakeups).sum();
    Some(Residency {
        kind: "measured",
        source: first.source.clone(),
        elapsed_s: total_s,
        cpus_measured: n,
        deep_idle_share: mean(|c| c.deep_idle_share),
        poll_share: mean(|c| c.poll_share),
        busy_share: mean(|c| c.busy_share),
        wakeups,
        wakeups_per_s: wakeups as f64 / total_s,
        per_cpu,
        notes: parts.iter().flat_map(|p| p.notes.clone()).collect(),
    })
}

impl Residency {
    /// A short human-readable table.
    pub fn render(&self) -> String {
        let mut out = format!(
            "idle residency (measured, {}, {:.1} s, {} CPUs; POLL counted as busy)\n",
            self.source, self.elapsed_s, self.cpus_measured
        );
        for c in &self.per_cpu {
            out.push_str(&format!(
                "  cpu{}: deep idle {:.1}%, poll {:.1}%, busy {:.1}%, {} wakeups ({:.0}/s)",
                c.cpu,
                100.0 * c.deep_idle_share,
                100.0 * c.poll_share,
                100.0 * c.busy_share,
                c.wakeups,
                c.wakeups_per_s
            ));
            for s in &c.states {
                out.push_str(&format!(
                    "; {} {:.1}% ×{}",
                    s.name,
                    100.0 * s.share,
                    s.transitions
                ));
            }
            out.push('\n');
        }
        for n in &self.notes {
            out.push_str(&format!("  note: {n}\n"));
        }
        out
    }
}

/// Clock ticks per second of `/proc/stat` and `/proc/PID/stat` (USER_HZ; 100 on Linux
/// everywhere we run, read without libc).
pub const USER_HZ: f64 = 100.0;

/// CPU time of the whole machine, in ticks: (busy, total) summed over CPUs from the `cpu` line
/// of `/proc/stat` (busy = user + nice + system + irq + softirq + steal; idle and iowait are
/// not busy).
pub fn machine_ticks(proc_stat: &str) -> Option<(u64, u64)> {
    let line = proc_stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    if v.len() < 8 {
        return None;
    }
    let busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
    // guest time is already included in user.
    Some((busy, v[..8].iter().sum()))
}

/// CPU time (user + system, ticks) of a process, all its threads, from `/proc/PID/stat`.
pub fn process_ticks(stat: &str) -> Option<u64> {
    // pid (comm) state ...: comm may contain spaces and parentheses; fields after the last ')'.
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After ')': state is field 3 of the full line, utime 14, stime 15.
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some(utime + stime)
}

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
    let mut t = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| process_ticks(&s))
        .unwrap_or(0);
    for pid in pids {
        t += std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| process_ticks(&s))
            .unwrap_or(0);
    }
    t
}

/// Reads the machine's and our processes' CPU time now (`pids`: other processes of ours, e.g.
/// the backend we started). `None` without `/proc`.
pub fn cpu_use_mark(pids: &[u32]) -> Option<CpuUseMark> {
    let machine = machine_ticks(&std::fs::read_to_string("/proc/stat").ok()?)?;
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
        assert_eq!(
            machine_ticks(stat),
            Some((
                239906 + 5 + 74942 + 3 + 1188 + 159,
                239906 + 5 + 74942 + 387825 + 1974 + 3 + 1188 + 159
            ))
        );
        assert_eq!(machine_ticks("intr 1 2\n"), None);
        let p = "18656 (a b) c)) R 18650 18650 24978 0 -1 4194304 120 0 0 0 31 17 0 0 20 0";
        assert_eq!(process_ticks(p), Some(48));
        assert_eq!(process_ticks("garbage"), None);
        let m = cpu_use_mark(&[std::process::id()]).expect("/proc");
        let u = cpu_use(&m, &m);
        assert_eq!(u.own_cpu_s, 0.0);
    }

    fn write_state(root: &Path, cpu: u32, idx: u32, name: &str, time: u64, usage: u64) {
        let d = root.join(format!("cpu{cpu}/cpuidle/state{idx}"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("name"), format!("{name}\n")).unwrap();
        std::fs::write(d.join("time"), format!("{time}\n")).unwrap();
        std::fs::write(d.join("usage"), format!("{usage}\n")).unwrap();
    }

    #[test]
    fn synthetic_sysfs_tree() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
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
        let before = snapshot(root).unwrap();
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
        let after = snapshot(root).unwrap();
        let r = diff_over(&before, &after, Duration::from_secs(1));
        assert_eq!(r.kind, "measured");
        assert_eq!(r.cpus_measured, 3);
        let c0 = &r.per_cpu[0];
        assert!((c0.deep_idle_share - 0.6).abs() < 1e-9);
        assert!((c0.poll_share - 0.1).abs() < 1e-9);
        assert!((c0.busy_share - 0.4).abs() < 1e-9, "POLL counts as busy");
        assert_eq!(c0.wakeups, 60, "POLL entries are not wakeups");
        assert_eq!(c0.states[0].transitions, 20);
        assert_eq!(c0.states[1].above, Some(2));
        assert_eq!(c0.mean_sleep_us, Some(10_000.0));
        let c1 = &r.per_cpu[1];
        assert!((c1.deep_idle_share - 0.9).abs() < 1e-9);
        assert_eq!(c1.wakeups, 10);
        assert!((r.per_cpu[2].deep_idle_share - 1.0).abs() < 1e-9);
        assert!((r.deep_idle_share - (0.6 + 0.9 + 1.0) / 3.0).abs() < 1e-9);
        assert_eq!(r.wakeups, 71);
        assert!((r.wakeups_per_s - 71.0).abs() < 1e-9);
        assert!(r.source.contains("haltpoll"));
        assert!(r.render().contains("cpu0: deep idle 60.0%"));

        // Two equal windows merge to the same shares and double counts.
        let m = merge(&[r.clone(), r.clone()]).unwrap();
        assert!((m.deep_idle_share - r.deep_idle_share).abs() < 1e-9);
        assert_eq!(m.wakeups, 142);
        assert!((m.wakeups_per_s - 71.0).abs() < 1e-9);
        assert_eq!(m.per_cpu[0].states[1].transitions, 120);
    }

    #[test]
    fn absent_cpuidle_is_reported() {
        let t = tempfile::tempdir().unwrap();
        let e = snapshot(t.path()).unwrap_err();
        assert!(e.contains("unavailable"), "{e}");
        std::fs::create_dir_all(t.path().join("cpu0/cpufreq")).unwrap();
        let e = snapshot(t.path()).unwrap_err();
        assert!(e.contains("cpuidle is absent"), "{e}");
        // Unreadable counters are an error, not zeros.
        write_state(t.path(), 0, 0, "POLL", 1, 1);
        std::fs::write(t.path().join("cpu0/cpuidle/state0/time"), "x\n").unwrap();
        assert!(snapshot(t.path()).unwrap_err().contains("unreadable"));
    }

    #[test]
    fn states_changing_mid_window_are_skipped() {
        let t = tempfile::tempdir().unwrap();
        write_state(t.path(), 0, 0, "POLL", 0, 0);
        let before = snapshot(t.path()).unwrap();
        write_state(t.path(), 0, 1, "C1", 10, 1);
        let after = snapshot(t.path()).unwrap();
        let r = diff_over(&before, &after, Duration::from_secs(1));
        assert_eq!(r.cpus_measured, 0);
        assert!(r.notes[0].contains("changed"), "{:?}", r.notes);
    }

    #[test]
    fn this_machine_if_present() {
        match snapshot(Path::new(SYSFS_CPU)) {
            Ok(s) => assert!(s.cpus.iter().all(|c| !c.states.is_empty())),
            Err(e) => println!("SKIP: {e}"),
        }
    }
}
