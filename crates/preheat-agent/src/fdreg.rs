//! The agent's own file descriptors and the file table they live in.
//!
//! # A file table of the agent's own
//!
//! The agent's threads do not share the host's file table: the first agent thread leaves it
//! ([`leave_host_table`]) before it opens anything, and every other agent thread is spawned
//! from an agent thread (`clone` shares the creator's table), so all agent threads share one
//! table of their own and the host's stays unshared. A single-threaded host then keeps
//! `files->count == 1`, and the kernel's fd lookups (`__fget_light`) skip taking a reference
//! on every `epoll_wait`, `read` and `write` (measured: 629 vs 723 ns per epoll_wait + read
//! with one extra thread sharing the table). The new table starts empty
//! (`close_range(0, ~0, CLOSE_RANGE_UNSHARE)` copies nothing, so it never holds a reference to
//! a host file: a socket the host closes is released at once and sends its FIN); fds 0–2 are
//! `/dev/null` there, so nothing the agent writes to "stderr" lands in one of its sockets. The
//! two tables' numbers are independent: a host `close`, `close_range` or `closefrom` never
//! touches an agent fd, whatever its number, and the hooks let every such call through.
//! Where the table cannot be left (no `CLOSE_RANGE_UNSHARE` and no `unshare`, seccomp,
//! `PREHEAT_AGENT_SHARED_FDS=1`), the agent shares the host's table as before, and the
//! registry below protects its fds.
//!
//! # The registry (shared table only)
//!
//! The agent's fds are registered when opened, so that, in a shared table, the hooked
//! `close`, `close_range` and `closefrom` leave them open when the host closes "every" fd, and
//! a fork child closes the parent's. [`close_own_fd`] is the one way to close a registered fd
//! (unregister first, then close), so a number the host may be handed next is never left
//! marked as the agent's.
//!
//! Hooked path ([`is_agent_fd`], [`next_agent_fd`], [`private_table`]): allocation-free,
//! lock-free, and held to the panic lints (see [`crate::hooks`]).
#![deny(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::unreachable,
    clippy::todo,
    clippy::unimplemented
)]

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};

use crate::{sys, track};

/// The agent's threads run on a file table of their own (see the module docs).
static PRIVATE_TABLE: AtomicBool = AtomicBool::new(false);

/// Whether the agent's threads have a file table of their own (allocation-free; hooks).
#[inline(always)]
pub fn private_table() -> bool {
    PRIVATE_TABLE.load(Ordering::Relaxed)
}

/// How the calling thread left the host's file table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Left {
    /// `close_range(0, ~0, CLOSE_RANGE_UNSHARE)`: an empty table (Linux ≥ 5.9).
    Empty,
    /// `unshare(CLONE_FILES)`, then every copied fd closed (older kernels).
    Copied,
}

/// The calling thread (the agent's first, before it opens anything) leaves the host's file
/// table for one of its own holding only fds 0–2 (`/dev/null`), and marks the table private.
/// `Err(why)` leaves everything as it was: the agent then shares the host's table.
pub fn leave_host_table() -> Result<Left, String> {
    let left = new_table()?;
    stdio_placeholders();
    PRIVATE_TABLE.store(true, Ordering::SeqCst);
    Ok(left)
}

/// Give the calling thread an empty file table of its own (the mechanics of
/// [`leave_host_table`], without marking anything).
pub(crate) fn new_table() -> Result<Left, String> {
    // SAFETY: close_range(2) takes no pointers; with CLOSE_RANGE_UNSHARE it unshares the
    // calling thread's table first (copying only fds below 0: none) and closes nothing of the
    // host's. On failure nothing changed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            0u32,
            u32::MAX,
            libc::CLOSE_RANGE_UNSHARE,
        )
    };
    if r == 0 {
        return Ok(Left::Empty);
    }
    let first = std::io::Error::last_os_error();
    copied_table()
        .map(|()| Left::Copied)
        .map_err(|e| format!("close_range(CLOSE_RANGE_UNSHARE): {first}; {e}"))
}

/// The fallback of [`new_table`]: a copy of the table, every fd in it closed.
fn copied_table() -> Result<(), String> {
    // SAFETY: unshare(2) takes no pointers; CLONE_FILES only gives this thread a copy of its
    // file table.
    if unsafe { libc::syscall(libc::SYS_unshare, libc::CLONE_FILES) } != 0 {
        return Err(format!(
            "unshare(CLONE_FILES): {}",
            std::io::Error::last_os_error()
        ));
    }
    close_every_fd();
    Ok(())
}

/// Close every fd of the calling thread's (just copied) table: its references to the host's
/// files must go at once, or a file the host closes would stay open (a socket would not send
/// its FIN).
fn close_every_fd() {
    // SAFETY: close_range(2) takes no pointers; it acts on this thread's own table.
    if unsafe { libc::syscall(libc::SYS_close_range, 0u32, u32::MAX, 0u32) } == 0 {
        return;
    }
    // No close_range (Linux < 5.9): the fds this thread's table holds.
    let listed: Option<Vec<RawFd>> = std::fs::read_dir("/proc/thread-self/fd").ok().map(|rd| {
        rd.flatten()
            .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
            .collect()
    });
    match listed {
        // The directory's own fd is in the list, closed already: EBADF, harmless (nothing else
        // opens in this table meanwhile).
        Some(fds) => fds.into_iter().for_each(sys::close_fd),
        None => {
            let mut lim = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: getrlimit writes into a valid local.
            let max = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
                lim.rlim_cur.min(1 << 20) as RawFd
            } else {
                65536
            };
            (0..max).for_each(sys::close_fd);
        }
    }
}

/// Fds 0–2 of the agent's table: `/dev/null` (an eventfd where there is none), so a write to
/// "stdout" or "stderr" on an agent thread never lands in one of its sockets.
fn stdio_placeholders() {
    for want in 0..3 {
        // SAFETY: a NUL-terminated path literal; open(2) returns an fd or -1.
        let mut fd = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            fd = sys::eventfd().unwrap_or(-1);
        }
        if fd < 0 || fd > want {
            // Not the number wanted (the table was not empty): leave it be.
            sys::close_fd(fd);
            return;
        }
    }
}

/// fds the agent owns (closed in a fork child).
static AGENT_FDS: [AtomicI32; 64] = [const { AtomicI32::new(-1) }; 64];
pub fn register_fd(fd: RawFd) {
    set_fd_bit(fd, true);
    for s in AGENT_FDS.iter() {
        if s.compare_exchange(-1, fd, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            return;
        }
    }
}

/// Close an fd the agent registered: unregister it first, so the number is never left marked as
/// the agent's once the host may be handed it again (the hooked `close()` would then refuse to
/// close the host's fd, and a forked child would close it). The one way to close a registered fd.
pub fn close_own_fd(fd: RawFd) {
    if fd < 0 {
        return;
    }
    unregister_fd(fd);
    sys::close_fd(fd);
}

pub fn unregister_fd(fd: RawFd) {
    set_fd_bit(fd, false);
    for s in AGENT_FDS.iter() {
        if s.compare_exchange(fd, -1, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            return;
        }
    }
}

/// One bit per fd below [`track::MAX_FDS`]: the fd belongs to the agent.
static AGENT_FD_BITS: [AtomicU64; track::MAX_FDS / 64] =
    [const { AtomicU64::new(0) }; track::MAX_FDS / 64];

fn set_fd_bit(fd: RawFd, on: bool) {
    let Ok(i) = usize::try_from(fd) else { return };
    if let Some(w) = AGENT_FD_BITS.get(i / 64) {
        let bit = 1u64 << (i % 64);
        if on {
            w.fetch_or(bit, Ordering::AcqRel);
        } else {
            w.fetch_and(!bit, Ordering::AcqRel);
        }
    }
}

/// The first agent fd in `[from, to]`, if any (allocation-free; used by `close_range`).
pub fn next_agent_fd(from: u32, to: u32) -> Option<u32> {
    let to = to.min((track::MAX_FDS as u32).saturating_sub(1));
    let mut fd = from;
    while fd <= to {
        let w = AGENT_FD_BITS.get(fd as usize / 64)?.load(Ordering::Relaxed) >> (fd % 64);
        if w == 0 {
            fd = (fd / 64).saturating_add(1).saturating_mul(64);
            continue;
        }
        let hit = fd.saturating_add(w.trailing_zeros());
        return (hit <= to).then_some(hit);
    }
    None
}

/// Whether `fd` is one of the agent's own (allocation-free; used by the `close` hook).
#[inline]
pub fn is_agent_fd(fd: RawFd) -> bool {
    let Ok(i) = usize::try_from(fd) else {
        return false;
    };
    AGENT_FD_BITS
        .get(i / 64)
        .is_some_and(|w| w.load(Ordering::Relaxed) & (1u64 << (i % 64)) != 0)
}

/// Fork child: forget every fd the parent agent registered, closing them where the parent's
/// agent shared the host's table (the child inherited them; with a private table the child's
/// table never had them, and their numbers are the host's).
pub fn close_all_after_fork() {
    let private = PRIVATE_TABLE.swap(false, Ordering::SeqCst);
    for s in AGENT_FDS.iter() {
        let fd = s.swap(-1, Ordering::SeqCst);
        if fd >= 0 && !private {
            sys::close_fd(fd);
        }
    }
    for w in AGENT_FD_BITS.iter() {
        w.store(0, Ordering::Relaxed);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod fd_registry_tests {
    use super::*;
    use std::os::fd::IntoRawFd;

    /// Regression (issue 13): the wake-planner connection was closed without being unregistered,
    /// so the host's next fd with that number counted as the agent's.
    #[test]
    fn closing_an_own_fd_unregisters_it_first() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let fd = a.into_raw_fd();
        register_fd(fd);
        assert!(is_agent_fd(fd));
        close_own_fd(fd);
        assert!(!is_agent_fd(fd), "a closed fd stays registered");
        assert!(
            !std::path::Path::new(&format!("/proc/self/fd/{fd}")).exists(),
            "the fd is closed"
        );
        // The number, reused by the host, is the host's.
        let again = b.try_clone().unwrap().into_raw_fd();
        assert!(!is_agent_fd(again));
        sys::close_fd(again);
    }

    /// Both ways of leaving the table (the empty one, and the copy with every fd closed for
    /// kernels without `CLOSE_RANGE_UNSHARE`) leave the thread no reference to a file of the
    /// process's table: the write end of a pipe closed there gives the reader EOF at once.
    #[test]
    fn a_thread_that_left_the_table_holds_none_of_its_files() {
        use std::io::Read;
        for copy in [false, true] {
            let (mut r, w) = std::io::pipe().unwrap();
            let (left_tx, left_rx) = std::sync::mpsc::channel();
            let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
            let t = std::thread::spawn(move || {
                let res = if copy {
                    copied_table().map(|()| Left::Copied)
                } else {
                    new_table()
                };
                let n = std::fs::read_dir("/proc/thread-self/fd").map(|d| d.count());
                left_tx.send((res, n.ok())).unwrap();
                let _ = done_rx.recv();
            });
            let (res, n) = left_rx.recv().unwrap();
            if let Err(e) = res {
                // A sandbox without either call: nothing to check.
                eprintln!("cannot leave the file table here: {e}");
                let _ = done_tx.send(());
                t.join().unwrap();
                return;
            }
            // Only the directory's own fd was open while it was read.
            assert_eq!(n, Some(1), "fds left in the thread's table (copy: {copy})");
            drop(w);
            let mut buf = [0u8; 1];
            assert_eq!(r.read(&mut buf).unwrap(), 0, "copy: {copy}");
            let _ = done_tx.send(());
            t.join().unwrap();
        }
    }
}
