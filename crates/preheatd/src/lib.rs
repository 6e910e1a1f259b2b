//! `preheatd`, the receiver daemon on each server host (issue 4, item 2).
//!
//! The network arbiter announces requests ahead of their arrival ("a request for port P arrives
//! at T"), the paper's §3.2 trigger, sent over the network as authenticated UDP datagrams
//! (`preheat-net`). `preheatd` receives them, drops what arrives with too little lead, and
//! forwards each remaining announcement unchanged in meaning as the local 40-byte trigger
//! datagram ([`preheat_model::proto::Announcement`]) to every agent that serves the announced
//! port. Agents are found in the run directory: every agent has a control socket
//! `agent-<pid>.sock` (asked for `Status`, whose per-port busy periods say which listening ports
//! it serves) and a trigger socket `agent-<pid>.trig`.
//!
//! Modules: [`registry`] (which agent serves which port, rescanned periodically),
//! [`dispatch`] (lead check, trigger datagrams), [`stats`] (counters, lead histogram),
//! [`metrics`] (their Prometheus text format, the `/metrics` HTTP endpoint), [`log`]
//! (rate-limited stderr lines).
//!
//! The daemon never changes machine state: it only reads the run directory, talks to agents'
//! sockets and binds its own two network sockets.
#![forbid(unsafe_code)]

pub mod dispatch;
pub mod log;
pub mod metrics;
pub mod registry;
pub mod stats;

use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// A request to rescan the run directory now (set by the dispatcher when an announcement names
/// a port no agent serves, or a trigger socket has gone), waited for by the registry thread.
#[derive(Debug, Default)]
pub struct RescanSignal {
    requested: Mutex<bool>,
    cv: Condvar,
}

impl RescanSignal {
    pub fn new() -> RescanSignal {
        RescanSignal::default()
    }

    /// Ask for a rescan; never blocks for long (a short critical section).
    pub fn request(&self) {
        let mut r = self.requested.lock().unwrap_or_else(|p| p.into_inner());
        *r = true;
        self.cv.notify_all();
    }

    /// Wait until a rescan is requested or `timeout` passes; true when requested (the request
    /// is consumed).
    pub fn wait(&self, timeout: Duration) -> bool {
        let r = self.requested.lock().unwrap_or_else(|p| p.into_inner());
        let (mut r, _) = self
            .cv
            .wait_timeout_while(r, timeout, |req| !*req)
            .unwrap_or_else(|p| p.into_inner());
        std::mem::take(&mut *r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn rescan_signal_wakes_waiter_and_times_out() {
        let s = Arc::new(RescanSignal::new());
        let t0 = Instant::now();
        assert!(!s.wait(Duration::from_millis(20)));
        assert!(t0.elapsed() >= Duration::from_millis(20));
        s.request();
        assert!(s.wait(Duration::from_secs(5)));
        // Consumed.
        assert!(!s.wait(Duration::from_millis(1)));
        let s2 = s.clone();
        let h = std::thread::spawn(move || s2.wait(Duration::from_secs(10)));
        std::thread::sleep(Duration::from_millis(20));
        s.request();
        assert!(h.join().unwrap());
    }
}
