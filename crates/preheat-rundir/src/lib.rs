//! The agents' run directory (`PREHEAT_RUN_DIR`, default [`DEFAULT_RUN_DIR`]): the file names an
//! agent of a process uses there, and which agents are alive.
//!
//! One implementation for every program that looks for agents: the agent itself (its socket
//! and log names), the CLI (discovery, removing the sockets of dead processes) and `preheatd`
//! (its registry, which never removes files). It lives in its own crate because the agent's
//! crate is also the LD_PRELOAD library: a binary that linked it would link its libc hooks too.
//!
//! Invariants: std and `preheat-model` only; no unsafe; reads the directory and `/proc`, and
//! removes files only in [`remove_dead`].

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

use preheat_model::proto;
pub use preheat_model::proto::DEFAULT_RUN_DIR;

/// The run directory: `PREHEAT_RUN_DIR` if set and non-empty, else [`DEFAULT_RUN_DIR`].
pub fn run_dir_from_env() -> PathBuf {
    match std::env::var_os("PREHEAT_RUN_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from(DEFAULT_RUN_DIR),
    }
}

/// The files an agent of `pid` uses in `run_dir`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketPaths {
    /// Control socket (Unix stream, JSON lines).
    pub control: PathBuf,
    /// Announcement socket (Unix datagram, 40-byte `Announcement`s).
    pub trigger: PathBuf,
    /// Default log file (unless `PREHEAT_AGENT_LOG` is set).
    pub log: PathBuf,
}

/// Socket and log paths of the agent of `pid` in `run_dir`.
pub fn socket_paths(run_dir: &Path, pid: u32) -> SocketPaths {
    SocketPaths {
        control: run_dir.join(proto::control_socket_name(pid)),
        trigger: run_dir.join(proto::trigger_socket_name(pid)),
        log: run_dir.join(proto::log_name(pid)),
    }
}

/// The longest path of a Unix socket on Linux (`sun_path` holds 108 bytes with its NUL).
pub const MAX_SOCKET_PATH: usize = 107;

/// Whether the agents' sockets fit in `run_dir` (their longest name, that of the largest pid,
/// within [`MAX_SOCKET_PATH`]); otherwise what is wrong and what to do. An agent whose socket
/// path is too long cannot listen, and its process would look like one started without it.
pub fn check_socket_paths_fit(run_dir: &Path) -> Result<(), String> {
    let p = socket_paths(run_dir, u32::MAX);
    let n = p.control.as_os_str().len().max(p.trigger.as_os_str().len());
    if n <= MAX_SOCKET_PATH {
        return Ok(());
    }
    Err(format!(
        "the run directory {} is too long for the agents' Unix sockets ({n} bytes with a socket \
         name, at most {MAX_SOCKET_PATH}): set PREHEAT_RUN_DIR to a shorter directory",
        run_dir.display()
    ))
}

/// Whether process `pid` exists and is not a zombie (pid 0 never does). A zombie's agent is gone
/// (it exited, or died of a signal without removing its sockets) even while nobody has reaped
/// it yet — e.g. a prefork worker orphaned when its master exited first.
pub fn pid_alive(pid: u32) -> bool {
    if pid == 0 {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // A line that does not parse still belongs to a process that exists.
        Ok(stat) => !preheat_model::procstat::parse_pid_stat(&stat)
            .is_some_and(|s| matches!(s.state, 'Z' | 'X')),
        Err(_) => false,
    }
}

/// Pids with a control socket file in `run_dir`, alive or not, sorted. A missing directory has
/// none.
pub fn control_socket_pids(run_dir: &Path) -> Vec<u32> {
    let Ok(rd) = std::fs::read_dir(run_dir) else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = rd
        .flatten()
        .filter_map(|e| proto::pid_of_control_socket(e.file_name().to_str()?))
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// Pids with a control socket in `run_dir` whose process still exists, sorted.
pub fn live_agents(run_dir: &Path) -> Vec<u32> {
    control_socket_pids(run_dir)
        .into_iter()
        .filter(|&p| pid_alive(p))
        .collect()
}

/// Like [`live_agents`], and removes the control and trigger sockets of processes that are gone
/// (a killed server leaves them behind).
pub fn remove_dead(run_dir: &Path) -> Vec<u32> {
    let (live, dead): (Vec<u32>, Vec<u32>) = control_socket_pids(run_dir)
        .into_iter()
        .partition(|&p| pid_alive(p));
    for pid in dead {
        let p = socket_paths(run_dir, pid);
        let _ = std::fs::remove_file(p.control);
        let _ = std::fs::remove_file(p.trigger);
    }
    live
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_names() {
        assert!(check_socket_paths_fit(Path::new("/tmp/preheat")).is_ok());
        let long = format!("/tmp/{}", "d".repeat(90));
        let e = check_socket_paths_fit(Path::new(&long)).unwrap_err();
        assert!(
            e.contains("too long") && e.contains("PREHEAT_RUN_DIR"),
            "{e}"
        );
        let p = socket_paths(Path::new("/run/x"), 42);
        assert_eq!(p.control, Path::new("/run/x/agent-42.sock"));
        assert_eq!(p.trigger, Path::new("/run/x/agent-42.trig"));
        assert_eq!(p.log, Path::new("/run/x/agent-42.log"));
    }

    #[test]
    fn live_and_dead_agents() {
        let d = tempfile::tempdir().unwrap();
        let me = std::process::id();
        // A pid that is certainly gone: a child we reaped.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        for pid in [me, dead] {
            let p = socket_paths(d.path(), pid);
            std::fs::write(&p.control, b"").unwrap();
            std::fs::write(&p.trigger, b"").unwrap();
        }
        std::fs::write(d.path().join("unrelated.sock"), b"").unwrap();
        let mut both = vec![me, dead];
        both.sort_unstable();
        assert_eq!(control_socket_pids(d.path()), both);
        assert_eq!(live_agents(d.path()), vec![me]);
        // Nothing removed so far; remove_dead removes the dead one's sockets only.
        assert_eq!(control_socket_pids(d.path()).len(), 2);
        assert_eq!(remove_dead(d.path()), vec![me]);
        assert_eq!(control_socket_pids(d.path()), vec![me]);
        assert!(!socket_paths(d.path(), dead).trigger.exists());
        assert!(socket_paths(d.path(), me).trigger.exists());
        assert!(live_agents(Path::new("/nonexistent/dir")).is_empty());
    }

    #[test]
    fn a_zombie_is_not_alive() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        // Exited but not reaped yet: a zombie, whose /proc entry still exists.
        let t0 = std::time::Instant::now();
        while pid_alive(pid) && t0.elapsed() < std::time::Duration::from_secs(5) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(
            Path::new(&format!("/proc/{pid}")).exists(),
            "reaped too early"
        );
        assert!(!pid_alive(pid));
        child.wait().unwrap();
        assert!(pid_alive(std::process::id()));
    }
}
