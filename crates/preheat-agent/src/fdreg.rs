//! The agent's own file descriptors: registered when opened, so that the hooked `close`,
//! `close_range` and `closefrom` leave them open when the host closes "every" fd, and so that a
//! fork child closes the parent's. [`close_own_fd`] is the one way to close a registered fd
//! (unregister first, then close), so a number the host may be handed next is never left
//! marked as the agent's.
//!
//! Hooked path ([`is_agent_fd`], [`next_agent_fd`]): allocation-free, lock-free, and held to the
//! panic lints (see [`crate::hooks`]).
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
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

use crate::{sys, track};

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

/// Fork child: close every fd the parent agent registered (they are the parent's sockets) and
/// forget them all.
pub fn close_all_after_fork() {
    for s in AGENT_FDS.iter() {
        let fd = s.swap(-1, Ordering::SeqCst);
        if fd >= 0 {
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
}
