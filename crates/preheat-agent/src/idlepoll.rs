//! The `wake` strategy by idle polling: keep the CPUs polling in their idle loop from the
//! announcement until shortly after the announced arrival, instead of occupying the serving
//! CPU with a spinning thread.
//!
//! # Why
//!
//! Both keep the core out of halt, but they differ in how the request reaches the server thread
//! (measured here, `../shared/notes/measured-here.md`): a thread woken on a CPU that polls in
//! idle runs after 2–6 µs — the waker sets the CPU's need-resched flag, which the polling loop
//! sees, no interrupt at all — while a CPU occupied by a spinning thread needs a reschedule
//! interrupt, which on this VM is a VM exit (18 µs and more). Polling is what the hot floor of
//! `preheat demo` does for the whole run; here it is done for the window only.
//!
//! # How
//!
//! Each agent thread that handles announcements (the trigger thread and every per-CPU worker)
//! owns one [`IdlePoll`]: its own open `/dev/cpu_dma_latency` file, i.e. its own CPU latency
//! QoS request. [`IdlePoll::arm`] writes 0 µs (every CPU's idle governor, `haltpoll` here,
//! then picks the polling state, and the kernel kicks idle CPUs to re-select); the owning
//! thread then blocks as usual, with a timeout at the window's end, and [`IdlePoll::expire`]
//! writes the default back. The kernel takes the minimum over all requests, so threads never
//! coordinate, and it drops a request when its file closes — also when the server is killed —
//! so no state can be left behind and no journal is needed. The files are the agent's own fds
//! (the host cannot close them; a fork child closes its copies and its threads open new ones).
//!
//! A window lasts from the announcement until [`HOLD_AFTER_ARRIVAL_NS`] (2 ms) after the
//! announced arrival, at most [`crate::worker::POLL_MAX_NS`] (1 s) in all — longer than the spin's
//! 200 µs because polling occupies no CPU (its cost is power), and a request of several round
//! trips needs the CPUs awake until it is done: a MySQL transaction of the catalog's MariaDB
//! takes 0.4–1.5 ms at the hot floor; with 200 µs after arrival, `wake+lines` removed 53–60%
//! of MariaDB's cold overhead, with 2 ms 78% (150 rounds each, 200 µs lead, measured; noisy).
//! Extending the window while the port's threads stay busy was tried and dropped: the checks
//! every 200 µs preempt the server thread, and a thread that dies inside a busy period leaves
//! its slot busy (extensions until the 10 ms bound).
//!
//! The device is root-only: unprivileged, or where it is missing, `wake` spins as before
//! ([`crate::worker`]), and the agent's log says why once. The `spin` strategy bit forces the
//! spin, to compare both in one run. Deliberate difference from the paper (which keeps the core
//! from sleeping by a kernel hook in the idle path): the constraint is system-wide for the
//! window, so other idle CPUs poll too — a power cost, never a latency one.

use std::os::fd::RawFd;

use crate::{fdreg, log, sys};

const DEVICE: &str = "/dev/cpu_dma_latency";
/// "No constraint" (the kernel's `PM_QOS_CPU_LATENCY_DEFAULT_VALUE`, µs).
const NO_CONSTRAINT_US: i32 = 2_000_000_000;

/// How long after the announced arrival a window ends (see the module docs).
pub const HOLD_AFTER_ARRIVAL_NS: u64 = 2_000_000;

/// One thread's CPU latency QoS request (see the module docs).
pub struct IdlePoll {
    fd: RawFd,
    /// End of the armed window (CLOCK_MONOTONIC ns), 0 = not armed.
    until_ns: u64,
}

impl IdlePoll {
    /// Open the calling thread's request (not on a hooked path: it may allocate and log).
    /// `report`: log why idle polling is unavailable (one thread does, not every worker).
    pub fn open(report: bool) -> IdlePoll {
        if crate::config::config().is_some_and(|c| !c.idle_poll) {
            if report {
                log::log("PREHEAT_NO_IDLE_POLL is set: the wake strategy spins");
            }
            return IdlePoll::none();
        }
        match std::fs::OpenOptions::new().write(true).open(DEVICE) {
            Ok(f) => {
                let fd = std::os::fd::IntoRawFd::into_raw_fd(f);
                fdreg::register_fd(fd);
                IdlePoll { fd, until_ns: 0 }
            }
            Err(e) => {
                if report {
                    log::log(&format!(
                        "cannot open {DEVICE} ({e}): the wake strategy spins on the serving CPU \
                         instead of keeping the CPUs polling in idle"
                    ));
                }
                IdlePoll::none()
            }
        }
    }

    /// No request: `wake` spins.
    pub const fn none() -> IdlePoll {
        IdlePoll {
            fd: -1,
            until_ns: 0,
        }
    }

    pub fn available(&self) -> bool {
        self.fd >= 0
    }

    /// Keep the CPUs polling until `until_ns` (extends an armed window). False if unavailable
    /// or the write failed (the caller then spins).
    pub fn arm(&mut self, until_ns: u64) -> bool {
        if self.fd < 0 {
            return false;
        }
        if self.until_ns == 0 {
            if !sys::write_all_raw(self.fd, &0i32.to_ne_bytes()) {
                return false;
            }
            self.until_ns = until_ns;
        } else {
            self.until_ns = self.until_ns.max(until_ns);
        }
        true
    }

    /// How long the owning thread may block before it must call [`IdlePoll::expire`]: `None`
    /// when not armed (block without a timeout).
    pub fn remaining_ns(&self, now_ns: u64) -> Option<u64> {
        (self.until_ns != 0).then(|| self.until_ns.saturating_sub(now_ns).max(1_000))
    }

    /// End the window if it is over (`now_ns` past its end).
    pub fn expire(&mut self, now_ns: u64) {
        if self.until_ns != 0 && now_ns >= self.until_ns {
            self.release();
        }
    }

    /// End the window now.
    pub fn release(&mut self) {
        if self.until_ns != 0 && self.fd >= 0 {
            // A failed write leaves the constraint until the file closes (agent exit): logged.
            if !sys::write_all_raw(self.fd, &NO_CONSTRAINT_US.to_ne_bytes()) {
                log::log(&format!(
                    "{DEVICE}: cannot lift the latency constraint; closing the request"
                ));
                fdreg::close_own_fd(self.fd);
                self.fd = -1;
            }
        }
        self.until_ns = 0;
    }
}

impl Drop for IdlePoll {
    fn drop(&mut self) {
        self.release();
        if self.fd >= 0 {
            fdreg::close_own_fd(self.fd);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unavailable_request_never_arms_and_never_asks_for_a_timeout() {
        let mut p = IdlePoll::none();
        assert!(!p.arm(u64::MAX));
        assert_eq!(p.remaining_ns(0), None);
        p.expire(u64::MAX);
    }

    #[test]
    fn a_window_extends_and_expires_only_at_its_end() {
        let p0 = IdlePoll::open(false);
        if !p0.available() {
            preheat_testsupport::skip("agent idle polling", "/dev/cpu_dma_latency not writable");
            return;
        }
        let mut p = p0;
        assert!(p.arm(1_000_000));
        // The kernel's aggregate CPU latency constraint (a 4-byte read) is now 0: CPUs poll.
        let mut v = [0u8; 4];
        std::io::Read::read_exact(&mut std::fs::File::open(DEVICE).unwrap(), &mut v).unwrap();
        assert_eq!(
            i32::from_ne_bytes(v),
            0,
            "armed, but the constraint is not 0 µs"
        );
        assert!(p.arm(500_000), "an armed window stays armed");
        assert_eq!(p.remaining_ns(400_000), Some(600_000));
        p.expire(999_999);
        assert!(p.remaining_ns(999_999).is_some(), "expired before its end");
        p.expire(1_000_000);
        assert_eq!(p.remaining_ns(1_000_000), None);
    }
}
