//! The journal of scheduling changes: what every managed thread had before the coscheduler
//! touched it, so that a clean exit, a watchdog, or the next start can put it back.
//!
//! Written (temp file + rename) before the first change to any thread it lists, rewritten when
//! threads are added, removed at a clean exit after everything is restored. An entry is
//! restored only if the same thread (tid *and* start time) still exists and is still in a
//! real-time class (the coscheduler only ever puts threads into `SCHED_FIFO`): a thread someone
//! else changed since is left alone, and a tid reused by a new thread is never touched.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use preheat_engine::sched::{self, ThreadSched};
use serde::{Deserialize, Serialize};

use crate::thread::{self, ThreadRef};

/// What one thread had before the coscheduler changed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub thread: ThreadRef,
    pub policy: i32,
    pub priority: i32,
    pub reset_on_fork: bool,
    pub affinity: Vec<usize>,
}

impl Entry {
    /// Read the current scheduling state of `t` (`None` if it is gone).
    pub fn capture(t: ThreadRef) -> io::Result<Entry> {
        let s = sched::thread_sched(t.tid)?;
        let affinity = sched::thread_affinity(t.tid)?;
        Ok(Entry {
            thread: t,
            policy: s.policy,
            priority: s.priority,
            reset_on_fork: s.reset_on_fork,
            affinity,
        })
    }

    fn sched(&self) -> ThreadSched {
        ThreadSched {
            policy: self.policy,
            priority: self.priority,
            reset_on_fork: self.reset_on_fork,
        }
    }
}

/// The journal file's contents.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Journal {
    pub version: u32,
    /// The controller that wrote it (pid and start ticks: a reused pid is not "alive").
    pub controller_pid: u32,
    pub controller_start: u64,
    pub entries: Vec<Entry>,
}

/// What happened to one entry at restore.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
pub enum Outcome {
    Restored { tid: u32, to: String },
    Gone { tid: u32 },
    ChangedSince { tid: u32, now: String },
    Failed { tid: u32, error: String },
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Restored { tid, to } => write!(f, "thread {tid}: restored to {to}"),
            Outcome::Gone { tid } => write!(f, "thread {tid}: gone (nothing to restore)"),
            Outcome::ChangedSince { tid, now } => {
                write!(
                    f,
                    "thread {tid}: changed by someone else since (now {now}): left alone"
                )
            }
            Outcome::Failed { tid, error } => write!(f, "thread {tid}: could not restore: {error}"),
        }
    }
}

impl Journal {
    /// A journal for the calling process as controller.
    pub fn for_this_process() -> Journal {
        let pid = std::process::id();
        Journal {
            version: 1,
            controller_pid: pid,
            controller_start: thread::process_start_ticks(pid).unwrap_or(0),
            entries: Vec::new(),
        }
    }

    /// Read a journal; a missing file is an empty journal.
    pub fn load(path: &Path) -> io::Result<Journal> {
        match std::fs::read(path) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}: not a coscheduler journal: {e}", path.display()),
                )
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Journal::default()),
            Err(e) => Err(e),
        }
    }

    /// Write atomically (temp file + rename). No fsync: it protects against a crash of the
    /// controller, and after a reboot no thread it names exists.
    pub fn save(&self, path: &Path) -> io::Result<()> {
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let body = serde_json::to_vec_pretty(self).map_err(io::Error::other)?;
        std::fs::write(&tmp, body)?;
        std::fs::rename(&tmp, path)
    }

    /// Whether the controller that wrote this journal is still running.
    pub fn controller_alive(&self) -> bool {
        self.controller_pid != 0
            && thread::process_start_ticks(self.controller_pid) == Some(self.controller_start)
    }

    /// Put every listed thread back (see the module doc for which ones are touched).
    pub fn restore(&self) -> Vec<Outcome> {
        self.entries.iter().map(restore_entry).collect()
    }
}

fn restore_entry(e: &Entry) -> Outcome {
    let tid = e.thread.tid;
    if !e.thread.alive() {
        return Outcome::Gone { tid };
    }
    let now = match sched::thread_sched(tid) {
        Ok(s) => s,
        Err(err) if sched::is_gone(&err) => return Outcome::Gone { tid },
        Err(err) => {
            return Outcome::Failed {
                tid,
                error: err.to_string(),
            }
        }
    };
    if !now.is_realtime() && now != e.sched() {
        return Outcome::ChangedSince {
            tid,
            now: now.name(),
        };
    }
    // Affinity first: a thread leaving the real-time class should not spend a moment pinned
    // to a CPU that is not its own.
    let r = sched::set_thread_affinity(tid, &e.affinity)
        .and_then(|()| sched::set_thread_sched(tid, e.sched()));
    match r {
        Ok(()) => Outcome::Restored {
            tid,
            to: e.sched().name(),
        },
        Err(err) if sched::is_gone(&err) => Outcome::Gone { tid },
        Err(err) => Outcome::Failed {
            tid,
            error: err.to_string(),
        },
    }
}

/// Restore the journal at `path` if its controller is dead; the file is removed when every
/// entry was dealt with (kept if some failed). Returns `None` if there was nothing to do (no
/// journal, or its controller still runs).
pub fn restore_if_orphaned(path: &Path) -> io::Result<Option<Vec<Outcome>>> {
    let j = Journal::load(path)?;
    if j.entries.is_empty() || j.controller_alive() {
        return Ok(None);
    }
    let out = j.restore();
    if out.iter().all(|o| !matches!(o, Outcome::Failed { .. })) {
        remove(path)?;
    }
    Ok(Some(out))
}

/// Remove the journal file (missing is fine).
pub fn remove(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// The watchdog's loop: wait until controller `pid` dies (then restore the journal at `path`)
/// or the journal, once seen, disappears (the controller exited cleanly and restored itself).
/// Polls every `period`.
pub fn watch(path: &Path, pid: u32, period: Duration) -> io::Result<Vec<Outcome>> {
    let start = thread::process_start_ticks(pid);
    let mut seen = false;
    loop {
        let exists = path.exists();
        seen |= exists;
        if seen && !exists {
            return Ok(Vec::new());
        }
        if start.is_none() || thread::process_start_ticks(pid) != start {
            return Ok(restore_if_orphaned(path)?.unwrap_or_default());
        }
        std::thread::sleep(period);
    }
}

/// The default journal location: `dir/cosched-journal.json`.
pub fn default_path(dir: &Path) -> PathBuf {
    dir.join("cosched-journal.json")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_orphan_restore_of_affinity() {
        let dir = tempfile::tempdir().unwrap();
        let path = default_path(dir.path());
        assert_eq!(Journal::load(&path).unwrap(), Journal::default());
        let (tx, rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let h = std::thread::spawn(move || {
            tx.send(preheat_engine::os::gettid()).unwrap();
            let _ = stop_rx.recv();
        });
        let tid = rx.recv().unwrap();
        let t = ThreadRef::of(std::process::id(), tid).unwrap();
        let before = Entry::capture(t).unwrap();
        let mut j = Journal::for_this_process();
        j.entries.push(before.clone());
        j.save(&path).unwrap();
        assert_eq!(Journal::load(&path).unwrap(), j);
        // Our own journal: the controller (us) is alive, so nothing is restored.
        assert_eq!(restore_if_orphaned(&path).unwrap(), None);
        // Change the thread as a controller would (affinity always works; FIFO if permitted).
        let cpu = *before.affinity.last().unwrap();
        sched::set_thread_affinity(tid, &[cpu]).unwrap();
        let fifo = sched::set_thread_sched(tid, ThreadSched::fifo(1)).is_ok();
        // Pretend the controller died.
        j.controller_pid = 0;
        j.save(&path).unwrap();
        let out = restore_if_orphaned(&path).unwrap().unwrap();
        if fifo {
            assert_eq!(
                out,
                vec![Outcome::Restored {
                    tid,
                    to: "other".into()
                }]
            );
            assert_eq!(sched::thread_sched(tid).unwrap(), ThreadSched::NORMAL);
        }
        assert_eq!(sched::thread_affinity(tid).unwrap(), before.affinity);
        assert!(!path.exists());
        stop_tx.send(()).unwrap();
        h.join().unwrap();
        // The kernel wakes the joiner before the exiting thread has left /proc (a suite run saw
        // it still there): wait, bounded, until it has.
        let task = format!("/proc/self/task/{tid}");
        let t0 = std::time::Instant::now();
        while std::path::Path::new(&task).exists() && t0.elapsed().as_secs() < 5 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        // A thread that is gone is reported as such.
        assert_eq!(j.restore(), vec![Outcome::Gone { tid }]);
    }

    #[test]
    fn a_garbage_journal_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = default_path(dir.path());
        std::fs::write(&path, b"{not json").unwrap();
        let e = Journal::load(&path).unwrap_err();
        assert!(e.to_string().contains("not a coscheduler journal"), "{e}");
    }
}
