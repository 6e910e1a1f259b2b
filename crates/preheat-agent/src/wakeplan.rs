//! The `wake` strategy through the wake planner (`preheat wake serve`, crate preheat-wake), when
//! `PREHEAT_WAKE_PLANNER=1` and a planner runs for this run dir: instead of occupying the serving CPU with a spinning thread, ask
//! the planner for a window on that CPU from now until shortly after the announced arrival, and
//! the planner keeps the CPU out of deep idle (per-CPU PM QoS or `/dev/cpu_dma_latency`).
//! Measured here: a thread woken on a CPU held in POLL runs after ~5 µs; on a CPU occupied by a
//! spinning thread after ~18 µs (a reschedule interrupt is a VM exit); on a halted one ~33 µs —
//! when the window is planned well ahead. Opened at the announcement (a few tens of µs before
//! arrival), as here, the planner's arming came ~20 µs after the window start or not at all, and
//! `preheat demo` measured the `wake` strategy *slower* through the planner (p50 249 vs 76 µs,
//! 100 rounds; all other modes slowed down too while the planner ran). Hence opt-in.
//!
//! The control thread owns the connection ([`maintain`]); the announcement path only formats a
//! request into a stack buffer and sends it without blocking ([`request`]); replies are drained
//! and ignored there (the planner reports its decisions in its own status).

use std::io::Write as _;
use std::os::fd::IntoRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

use preheat_engine::time;

use crate::{fdreg, log, sys};

static WAKE_FD: AtomicI32 = AtomicI32::new(-1);
static NEXT_TRY_NS: AtomicU64 = AtomicU64::new(0);
const RETRY_NS: u64 = 1_000_000_000;

/// Control thread: connect to `<run_dir>/wake.sock` if not connected (at most once a second).
pub fn maintain(run_dir: &Path) {
    if WAKE_FD.load(Ordering::Acquire) >= 0 {
        return;
    }
    let now = time::now_ns();
    if now < NEXT_TRY_NS.load(Ordering::Relaxed) {
        return;
    }
    NEXT_TRY_NS.store(now + RETRY_NS, Ordering::Relaxed);
    let path = run_dir.join("wake.sock");
    if !path.exists() {
        return;
    }
    match UnixStream::connect(&path).and_then(|s| s.set_nonblocking(true).map(|_| s)) {
        Ok(s) => {
            let fd = s.into_raw_fd();
            fdreg::register_fd(fd);
            WAKE_FD.store(fd, Ordering::Release);
            log::log(&format!(
                "wake planner at {}: the wake strategy uses it",
                path.display()
            ));
        }
        Err(e) => log::log(&format!(
            "wake planner at {}: cannot connect: {e}",
            path.display()
        )),
    }
}

/// Forget the connection after an error (the control thread reconnects).
fn broken(fd: i32) {
    if WAKE_FD
        .compare_exchange(fd, -1, Ordering::AcqRel, Ordering::Relaxed)
        .is_ok()
    {
        fdreg::close_own_fd(fd);
    }
}

/// Ask for a window on `cpu` from `start_ns` to `end_ns`. Returns false when no planner is
/// connected or the request could not be sent (the caller then spins instead). Never blocks,
/// never allocates.
pub fn request(pid: u32, cpu: u32, start_ns: u64, end_ns: u64) -> bool {
    let fd = WAKE_FD.load(Ordering::Acquire);
    if fd < 0 || end_ns <= start_ns {
        return false;
    }
    let mut sink = [0u8; 512];
    loop {
        match sys::recv_nonblocking(fd, &mut sink) {
            Ok(0) => {
                broken(fd);
                return false;
            }
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => {
                broken(fd);
                return false;
            }
        }
    }
    let mut buf = [0u8; 192];
    let len = {
        let mut w = &mut buf[..];
        if writeln!(
            w,
            "{{\"requester\":\"agent-{pid}\",\"cpus\":[{cpu}],\"start_ns\":{start_ns},\"duration_ns\":{}}}",
            end_ns - start_ns
        )
        .is_err()
        {
            return false;
        }
        192 - w.len()
    };
    match sys::send_nonblocking(fd, &buf[..len]) {
        Ok(n) if n == len => true,
        Ok(_) => {
            // A partial line would corrupt the stream: start over with a new connection.
            broken(fd);
            false
        }
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
        Err(_) => {
            broken(fd);
            false
        }
    }
}

/// After fork: the connection belongs to the parent.
pub fn reset_after_fork() {
    WAKE_FD.store(-1, Ordering::Release);
    NEXT_TRY_NS.store(0, Ordering::Relaxed);
}

#[cfg(test)]
mod broken_connection_tests {
    use super::*;
    use std::os::fd::IntoRawFd;

    /// Regression (issue 13): a broken wake-planner connection was closed but stayed registered
    /// as the agent's, so the host's next fd with that number could not be closed by the host.
    #[test]
    fn a_broken_connection_is_unregistered_and_closed() {
        let (a, _b) = UnixStream::pair().unwrap();
        let fd = a.into_raw_fd();
        fdreg::register_fd(fd);
        WAKE_FD.store(fd, Ordering::Release);
        broken(fd);
        assert_eq!(WAKE_FD.load(Ordering::Acquire), -1);
        assert!(!fdreg::is_agent_fd(fd), "closed but still registered");
        assert!(!std::path::Path::new(&format!("/proc/self/fd/{fd}")).exists());
    }
}
