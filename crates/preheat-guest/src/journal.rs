//! The journal of running guests: one file per QEMU process in `<run dir>/guests/`, naming the
//! process and its owner, so that guests whose owner was killed outright (SIGKILL, a crash) are
//! stopped by the next command that starts a guest or by `preheat guest cleanup`.
//!
//! A process is named by its pid *and* its start time (ticks since boot, `/proc/PID/stat`), so
//! a reused pid is never mistaken for it: an entry whose QEMU is no longer that process is only
//! removed. An entry is written (temp file + rename) right after QEMU is spawned and removed
//! after it is reaped; QEMU also gets a parent-death signal ([`crate::qemu`]), so the journal is
//! the second line of defence, and the only one for the instant between spawn and entry.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use preheat_engine::procstat::read_pid_stat;
use serde::{Deserialize, Serialize};

/// One running guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The guest's name.
    pub name: String,
    /// QEMU's pid and start ticks.
    pub pid: u32,
    pub start: u64,
    /// The owner's (the process that started it) pid and start ticks.
    pub owner_pid: u32,
    pub owner_start: u64,
}

/// What [`reap_orphans`] did about one entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Reaped {
    pub name: String,
    pub pid: u32,
    /// Whether its QEMU was still running (and was killed).
    pub killed: bool,
}

/// `preheat guest cleanup`: stop the guests of owners that are gone, and say what was done.
pub fn cleanup() -> String {
    render(&reap_orphans(&dir()))
}

/// What `preheat guest cleanup` prints about `reaped`.
pub fn render(reaped: &[Reaped]) -> String {
    let mut s = String::new();
    for r in reaped {
        let what = if r.killed { "stopped" } else { "already gone" };
        s += &format!("guest {} (QEMU pid {}): {what}\n", r.name, r.pid);
    }
    s + &format!("{} orphaned guest(s) handled\n", reaped.len())
}

/// The journal's directory: `guests/` in the run directory (`PREHEAT_RUN_DIR`).
pub fn dir() -> PathBuf {
    preheat_rundir::run_dir_from_env().join("guests")
}

/// Start ticks of `pid` if it is alive (not a zombie).
fn start_of(pid: u32) -> Option<u64> {
    read_pid_stat(pid)
        .filter(|s| !s.is_zombie())
        .map(|s| s.starttime)
}

/// Whether process `pid` started at `start` still runs.
fn same_alive(pid: u32, start: u64) -> bool {
    start_of(pid) == Some(start)
}

/// Journal QEMU `pid`, started by this process for guest `name`, in `dir`; the entry's path.
pub fn record(dir: &Path, pid: u32, name: &str) -> io::Result<PathBuf> {
    let me = std::process::id();
    let r = Record {
        name: name.into(),
        pid,
        start: start_of(pid).ok_or_else(|| io::Error::other(format!("QEMU {pid} is gone")))?,
        owner_pid: me,
        owner_start: start_of(me).ok_or_else(|| io::Error::other("no /proc/self/stat"))?,
    };
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!("qemu-{pid}.json"));
    let tmp = dir.join(format!(".qemu-{pid}.json.tmp"));
    std::fs::write(&tmp, serde_json::to_vec(&r).map_err(io::Error::other)?)?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// Remove an entry (its QEMU is reaped).
pub fn forget(path: &Path) {
    let _ = std::fs::remove_file(path);
}

/// Stop the guests in `dir` whose owner is gone (SIGKILL: nothing in them is worth keeping),
/// wait (≤ 2 s each) until they are gone, and remove their entries, and those of guests already
/// gone. Entries of live owners are left alone; unreadable entries are removed.
pub fn reap_orphans(dir: &Path) -> Vec<Reaped> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for path in rd.flatten().map(|e| e.path()) {
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let Some(r) = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice::<Record>(&b).ok())
        else {
            forget(&path);
            continue;
        };
        if same_alive(r.owner_pid, r.owner_start) {
            continue;
        }
        let killed = same_alive(r.pid, r.start);
        if killed {
            let _ = preheat_engine::os::send_signal(r.pid, libc::SIGKILL, false);
            let t0 = Instant::now();
            while same_alive(r.pid, r.start) && t0.elapsed() < Duration::from_secs(2) {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        forget(&path);
        out.push(Reaped {
            name: r.name,
            pid: r.pid,
            killed,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn kills_a_dead_owners_process_and_spares_a_live_owners() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let mut orphan = Command::new("sleep").arg("60").spawn().unwrap();
        let mut kept = Command::new("sleep").arg("60").spawn().unwrap();
        // An owner that is gone: a process that has exited and was reaped.
        let mut gone = Command::new("true").spawn().unwrap();
        let gone_pid = gone.id();
        gone.wait().unwrap();
        let write = |pid: u32, owner_pid: u32, owner_start: u64| {
            let r = Record {
                name: format!("g{pid}"),
                pid,
                start: start_of(pid).unwrap(),
                owner_pid,
                owner_start,
            };
            std::fs::write(
                dir.join(format!("qemu-{pid}.json")),
                serde_json::to_vec(&r).unwrap(),
            )
            .unwrap();
        };
        write(orphan.id(), gone_pid, 1);
        let me = std::process::id();
        write(kept.id(), me, start_of(me).unwrap());
        std::fs::write(dir.join("qemu-1.json"), b"{truncated").unwrap();
        let reaped = reap_orphans(dir);
        assert_eq!(
            reaped,
            vec![Reaped {
                name: format!("g{}", orphan.id()),
                pid: orphan.id(),
                killed: true
            }]
        );
        assert!(
            orphan.try_wait().unwrap().is_some(),
            "the orphan was killed"
        );
        assert!(
            kept.try_wait().unwrap().is_none(),
            "a live owner's guest runs on"
        );
        let left: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().collect();
        assert_eq!(left.len(), 1, "only the live owner's entry is left");
        kept.kill().unwrap();
        kept.wait().unwrap();
    }

    #[test]
    fn record_names_us_as_owner() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let mut child = Command::new("sleep").arg("60").spawn().unwrap();
        let path = record(dir, child.id(), "vm1").unwrap();
        let r: Record = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!((r.pid, r.owner_pid), (child.id(), std::process::id()));
        assert!(reap_orphans(dir).is_empty(), "its owner (we) is alive");
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(reap_orphans(dir).len(), 0, "owner alive: left alone");
        forget(&path);
    }
}
