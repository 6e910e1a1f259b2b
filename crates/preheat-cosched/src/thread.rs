//! Threads by identity: a thread id is reused after the thread exits, so a managed thread is
//! named by (pid, tid, start time in clock ticks since boot) and every change is checked
//! against all three.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// One thread, identified so that a reused tid is not mistaken for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ThreadRef {
    pub pid: u32,
    pub tid: u32,
    /// Field 22 of `/proc/PID/task/TID/stat` (clock ticks after boot).
    pub start_ticks: u64,
}

impl ThreadRef {
    /// The thread `tid` of process `pid` as it exists now (`None`: no such thread).
    pub fn of(pid: u32, tid: u32) -> Option<ThreadRef> {
        Some(ThreadRef {
            pid,
            tid,
            start_ticks: start_ticks(pid, tid)?,
        })
    }

    /// Whether this very thread still exists (same tid and start time).
    pub fn alive(&self) -> bool {
        start_ticks(self.pid, self.tid) == Some(self.start_ticks)
    }

    fn dir(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/task/{}", self.pid, self.tid))
    }
}

/// Start time (clock ticks after boot) of thread `tid` of process `pid`.
pub fn start_ticks(pid: u32, tid: u32) -> Option<u64> {
    preheat_engine::procstat::read_task_stat(pid, tid).map(|s| s.starttime)
}

/// Start time of process `pid` (`None`: no such process).
pub fn process_start_ticks(pid: u32) -> Option<u64> {
    start_ticks(pid, pid)
}

/// The threads of `pid` whose name starts with `prefix`, as (tid, name), in tid order (the
/// order the process created them in, barring tid wrap-around).
pub fn threads_named(pid: u32, prefix: &str) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for e in rd.flatten() {
        let Some(tid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let name = std::fs::read_to_string(e.path().join("comm"))
            .map(|s| s.trim_end().to_string())
            .unwrap_or_default();
        if name.starts_with(prefix) {
            out.push((tid, name));
        }
    }
    out.sort();
    out
}

/// One of a thread's `/proc` files, kept open and re-read with `pread` (no path walk per read);
/// `N` bytes are enough for its whole text.
struct KeptOpen<const N: usize> {
    file: Option<File>,
    buf: [u8; N],
}

impl<const N: usize> KeptOpen<N> {
    /// Open `name` of `t` (a thread that is gone gives a file that always reads `None`).
    fn open(t: &ThreadRef, name: &str) -> Self {
        KeptOpen {
            file: File::open(t.dir().join(name)).ok(),
            buf: [0; N],
        }
    }

    /// The file's text now; `None` once the thread is gone (the file is then dropped).
    fn read(&mut self) -> Option<&str> {
        let f = self.file.as_ref()?;
        let Ok(n) = f.read_at(&mut self.buf, 0) else {
            self.file = None;
            return None;
        };
        std::str::from_utf8(&self.buf[..n]).ok()
    }
}

/// A thread's `schedstat`, kept open.
pub struct RunClock(KeptOpen<96>);

impl RunClock {
    /// Open the schedstat of `t` (a thread that is gone gives a clock that always reads `None`).
    pub fn open(t: &ThreadRef) -> RunClock {
        RunClock(KeptOpen::open(t, "schedstat"))
    }

    /// Nanoseconds the thread has run on a CPU so far (`None` once it is gone).
    pub fn run_ns(&mut self) -> Option<u64> {
        self.0.read()?.split_whitespace().next()?.parse().ok()
    }
}

/// A thread's stat line, kept open: its scheduling state now (one read per slice decision,
/// see [`crate::ready`]).
pub struct StateProbe(KeptOpen<1024>);

impl StateProbe {
    /// Open the stat line of `t` (a thread that is gone gives a probe that always reads `None`).
    pub fn open(t: &ThreadRef) -> StateProbe {
        StateProbe(KeptOpen::open(t, "stat"))
    }

    /// Whether the thread is runnable (state `R`: running or waiting for a CPU); `None` once it
    /// is gone.
    pub fn runnable(&mut self) -> Option<bool> {
        let stat = preheat_model::procstat::parse_pid_stat(self.0.read()?)?;
        Some(stat.state == 'R')
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_threads_are_found_and_identified() {
        let pid = std::process::id();
        let (tx, rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let h = std::thread::Builder::new()
            .name("cosched-probe".into())
            .spawn(move || {
                tx.send(preheat_engine::os::gettid()).unwrap();
                let _ = stop_rx.recv();
            })
            .unwrap();
        let tid = rx.recv().unwrap();
        let found = threads_named(pid, "cosched-pro");
        assert_eq!(found, vec![(tid, "cosched-probe".to_string())]);
        let t = ThreadRef::of(pid, tid).unwrap();
        assert!(t.alive());
        let mut clock = RunClock::open(&t);
        assert!(clock.run_ns().is_some());
        // It waits on the channel (sleeping); this thread, reading, runs.
        let mut probe = StateProbe::open(&t);
        let me = ThreadRef::of(pid, preheat_engine::os::gettid()).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while probe.runnable() != Some(false) {
            assert!(
                std::time::Instant::now() < deadline,
                "the waiting thread never slept"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(StateProbe::open(&me).runnable(), Some(true));
        // A different start time is a different thread.
        let other = ThreadRef {
            start_ticks: t.start_ticks + 1,
            ..t
        };
        assert!(!other.alive());
        stop_tx.send(()).unwrap();
        h.join().unwrap();
        // `join` returns when the kernel clears the thread's tid word, before its task is
        // released: its /proc entry goes a moment later.
        let gone =
            preheat_testsupport::eventually(std::time::Duration::from_secs(2), || !t.alive());
        assert!(gone, "the joined thread is still listed after 2 s");
        assert_eq!(clock.run_ns(), None);
        assert_eq!(probe.runnable(), None);
        assert!(process_start_ticks(pid).is_some());
    }
}
