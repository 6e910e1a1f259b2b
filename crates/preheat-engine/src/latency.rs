//! One CPU latency QoS request (`/dev/cpu_dma_latency`): while it holds 0 µs, every CPU's idle
//! governor picks its polling state (where the cpuidle driver has one: `haltpoll`; without a
//! driver the idle loop halts whatever it says), so a thread woken on an idle CPU runs within
//! microseconds instead of after a halted vCPU's wake-up. The kernel takes the minimum over all
//! open requests and drops this one when its file closes — also when the process dies — so
//! nothing is left behind and no journal is needed. Root only.
//!
//! The outside agent's `wake` and `replay` hold one through the arrival, and
//! `preheat_wake::keep_awake` (the wake planner, the demo's hot floor) holds one while any CPU
//! is armed with it. (The in-process agent keeps its own on raw descriptors registered as the
//! agent's, `preheat-agent/src/idlepoll.rs`: its file table rules.)

use std::fs::File;
use std::io::{self, Write};

/// The device's "no constraint" value (the kernel's `PM_QOS_CPU_LATENCY_DEFAULT_VALUE`, µs).
const NO_CONSTRAINT_US: i32 = 2_000_000_000;

/// An open request, holding 0 µs while armed.
#[derive(Debug)]
pub struct LatencyRequest {
    file: File,
    armed: bool,
}

impl LatencyRequest {
    /// Open a request (no constraint yet).
    pub fn open() -> io::Result<LatencyRequest> {
        LatencyRequest::open_at(std::path::Path::new("/dev/cpu_dma_latency"))
    }

    /// [`LatencyRequest::open`] on the device at `path` (a fake machine tree's, in tests).
    pub fn open_at(path: &std::path::Path) -> io::Result<LatencyRequest> {
        let file = std::fs::OpenOptions::new().write(true).open(path)?;
        let mut r = LatencyRequest { file, armed: true };
        r.release()?;
        Ok(r)
    }

    /// Hold every CPU in its polling idle state (0 µs).
    pub fn arm(&mut self) -> io::Result<()> {
        if !self.armed {
            self.file.write_all(&0i32.to_ne_bytes())?;
            self.armed = true;
        }
        Ok(())
    }

    /// Drop the constraint (the request stays open for the next [`LatencyRequest::arm`]).
    pub fn release(&mut self) -> io::Result<()> {
        if self.armed {
            self.file.write_all(&NO_CONSTRAINT_US.to_ne_bytes())?;
            self.armed = false;
        }
        Ok(())
    }

    pub fn armed(&self) -> bool {
        self.armed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where the device can be opened (root), arming and releasing succeed and are idempotent.
    #[test]
    fn arms_and_releases_where_the_device_opens() {
        let mut r = match LatencyRequest::open() {
            Ok(r) => r,
            Err(e) => {
                return preheat_testsupport::skip!("root", "cannot open /dev/cpu_dma_latency: {e}")
            }
        };
        assert!(!r.armed());
        r.arm().unwrap();
        r.arm().unwrap();
        assert!(r.armed());
        r.release().unwrap();
        assert!(!r.armed());
    }
}
