//! The one single-instance lock: an exclusive `flock` on a file that holds the owner's pid.
//!
//! Race-free: the kernel grants the lock to one open file at a time and drops it when the owner
//! exits however it exits (no stale lock to take over, nothing to check then create). The file
//! is removed when the lock is dropped; a taker that locked a file someone removed meanwhile
//! (it opened the path before the removal) sees that the path no longer names its file and
//! tries again, so two takers can never hold locks they both believe to be the path's.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{self, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Why [`PidLock::take`] did not get the lock.
#[derive(Debug)]
pub enum LockError {
    /// Another live process holds it; its pid, where it wrote one.
    Held(Option<u32>),
    /// Opening, locking or writing the file failed.
    Io(io::Error),
}

impl std::fmt::Display for LockError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LockError::Held(Some(pid)) => write!(f, "held by pid {pid}"),
            LockError::Held(None) => write!(f, "held by another process"),
            LockError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for LockError {}

/// A held single-instance lock; released (and its file removed) on drop, and by the kernel
/// when the process dies.
#[derive(Debug)]
pub struct PidLock {
    file: File,
    path: PathBuf,
    remove: bool,
}

impl PidLock {
    /// Take the lock at `path` without waiting, writing our pid into it; the file is removed
    /// when the lock is dropped.
    pub fn take(path: &Path) -> Result<PidLock, LockError> {
        Self::take_with(path, true)
    }

    /// As [`PidLock::take`], but the file stays when the lock is dropped (for a lock in a
    /// directory others may not write: it can be taken again without creating it).
    pub fn take_keeping_file(path: &Path) -> Result<PidLock, LockError> {
        Self::take_with(path, false)
    }

    fn take_with(path: &Path, remove: bool) -> Result<PidLock, LockError> {
        loop {
            let mut file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)
                .map_err(LockError::Io)?;
            match file.try_lock() {
                Ok(()) => {}
                Err(TryLockError::WouldBlock) => {
                    let mut text = String::new();
                    let _ = file.read_to_string(&mut text);
                    return Err(LockError::Held(text.trim().parse().ok()));
                }
                Err(TryLockError::Error(e)) => return Err(LockError::Io(e)),
            }
            // The previous owner may have removed the file between our open and our lock: then
            // we hold a lock on a file nobody else can find, and must take the path's anew.
            let ours = file.metadata().map_err(LockError::Io)?;
            match std::fs::metadata(path) {
                Ok(now) if now.dev() == ours.dev() && now.ino() == ours.ino() => {}
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(LockError::Io(e)),
            }
            file.set_len(0).map_err(LockError::Io)?;
            file.write_all(format!("{}\n", std::process::id()).as_bytes())
                .map_err(LockError::Io)?;
            return Ok(PidLock {
                file,
                path: path.to_path_buf(),
                remove,
            });
        }
    }

    /// Where the lock is.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for PidLock {
    fn drop(&mut self) {
        // Removed while still held, so a taker that opened it meanwhile sees the removal.
        if self.remove {
            let _ = std::fs::remove_file(&self.path);
        }
        let _ = self.file.unlock();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Barrier};

    #[test]
    fn a_second_taker_is_refused_with_the_owners_pid() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.lock");
        let held = PidLock::take(&p).unwrap();
        match PidLock::take(&p) {
            Err(LockError::Held(pid)) => assert_eq!(pid, Some(std::process::id())),
            other => panic!("second take: {other:?}"),
        }
        drop(held);
        assert!(!p.exists(), "removed on drop");
        let kept = PidLock::take_keeping_file(&p).unwrap();
        drop(kept);
        assert!(p.exists(), "kept on drop");
        PidLock::take(&p).unwrap();
    }

    #[test]
    fn concurrent_takers_never_hold_it_together() {
        let dir = tempfile::tempdir().unwrap();
        let p = Arc::new(dir.path().join("race.lock"));
        let holders = Arc::new(AtomicUsize::new(0));
        let threads = 8;
        let start = Arc::new(Barrier::new(threads));
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let (p, holders, start) = (p.clone(), holders.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    let mut got = 0;
                    for _ in 0..300 {
                        if let Ok(lock) = PidLock::take(&p) {
                            let before = holders.fetch_add(1, Ordering::SeqCst);
                            assert_eq!(before, 0, "two holders at once");
                            std::thread::yield_now();
                            holders.fetch_sub(1, Ordering::SeqCst);
                            drop(lock);
                            got += 1;
                        }
                    }
                    got
                })
            })
            .collect();
        let taken: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert!(taken > 0);
    }
}
