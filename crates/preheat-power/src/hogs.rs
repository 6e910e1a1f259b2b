//! Background hogs: child processes that burn CPU (a shell busy loop that exits once orphaned),
//! pinned where asked and registered in a [`BackgroundGroup`]; and the CPU time they, and this
//! process, got (from `/proc/.../schedstat`).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::quiesce::BackgroundGroup;

/// The shell loop of a background hog. It burns CPU and exits on its own once it is reparented
/// (its parent, this process, died — even as an unreaped zombie), so a SIGKILLed controller
/// does not leave a hog behind. Only shell builtins: `read` of `/proc/$$/stat`, field 4 = ppid.
pub const HOG_SCRIPT: &str = "p=$PPID; while :; do read -r s < /proc/$$/stat; set -- $s; \
                              [ \"$4\" = \"$p\" ] || exit 0; i=0; \
                              while [ \"$i\" -lt 20000 ]; do i=$((i+1)); done; done";

/// On-CPU time of a task from `/proc/.../schedstat` (ns), falling back to utime+stime.
fn task_cpu_ns(dir: &Path) -> Option<u64> {
    if let Ok(s) = std::fs::read_to_string(dir.join("schedstat")) {
        if let Some(v) = s.split_whitespace().next().and_then(|v| v.parse().ok()) {
            return Some(v);
        }
    }
    let ticks = preheat_engine::procstat::read_pid_stat_at(&dir.join("stat"))?.ticks();
    Some(ticks * 10_000_000)
}

/// CPU time of a single-threaded process.
fn pid_cpu_ns(pid: u32) -> u64 {
    task_cpu_ns(Path::new(&format!("/proc/{pid}"))).unwrap_or(0)
}

/// CPU time of all threads of this process.
pub(crate) fn self_cpu_ns() -> u64 {
    std::fs::read_dir("/proc/self/task")
        .map(|rd| rd.flatten().filter_map(|e| task_cpu_ns(&e.path())).sum())
        .unwrap_or(0)
}

/// Background hog processes; killed and reaped on drop. Declare before the
/// [`BackgroundGroup`] so the group (thawing them) is dropped first: a v1-frozen process cannot
/// die until thawed.
#[derive(Default)]
pub struct Hogs {
    children: Vec<Child>,
}

impl Hogs {
    /// Spawn a hog, pinned to `cpu` if given (the child inherits the spawning thread's
    /// affinity, so we spawn it from a short-lived pinned thread).
    pub fn spawn(&mut self, cpu: Option<usize>) -> anyhow::Result<u32> {
        let child = std::thread::scope(|s| {
            s.spawn(move || {
                if let Some(c) = cpu {
                    let _ = preheat_engine::os::pin_current_thread(c);
                }
                Command::new("/bin/sh")
                    .arg("-c")
                    .arg(HOG_SCRIPT)
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
            })
            .join()
            .expect("spawner thread does not panic")
        })
        .context("spawning the background hog (/bin/sh)")?;
        let pid = child.id();
        self.children.push(child);
        Ok(pid)
    }

    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(|c| c.id()).collect()
    }

    pub fn cpu_ns(&self) -> u64 {
        self.children.iter().map(|c| pid_cpu_ns(c.id())).sum()
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        for c in &mut self.children {
            loop {
                match c.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() >= deadline => {
                        eprintln!("preheat-power: background hog {} did not exit", c.id());
                        break;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        }
    }
}

/// Spawn `n` hogs into `group` (if any), spread over the CPUs other than `critical_cpu` when the
/// critical loop is pinned; returns the CPU of each.
pub(crate) fn spawn_hogs(
    n: usize,
    online: usize,
    critical_cpu: Option<usize>,
    hogs: &mut Hogs,
    mut group: Option<&mut BackgroundGroup>,
) -> anyhow::Result<Vec<Option<usize>>> {
    let other_cpus: Vec<usize> = (0..online).filter(|&c| Some(c) != critical_cpu).collect();
    let mut hog_cpus = Vec::new();
    for i in 0..n {
        let cpu = if critical_cpu.is_some() && !other_cpus.is_empty() {
            Some(other_cpus[i % other_cpus.len()])
        } else {
            None
        };
        let pid = hogs.spawn(cpu)?;
        hog_cpus.push(cpu);
        if let Some(g) = group.as_mut() {
            g.add(pid)
                .with_context(|| format!("registering hog {pid} in the background group"))?;
        }
    }
    Ok(hog_cpus)
}
